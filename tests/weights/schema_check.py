"""Checks a response body against the published schemas: docs/schemas/millm-weights-api-v1.json (every
/api/weights route, in the management envelope) and docs/schemas/health-detailed.json (GET /api/health/detailed).

Used by the weights tests (test_weights_schema.py, test_weights_timers.py). Each document is read once; its `$ref`s
resolve within it (through a `referencing` registry keyed by the document's `$id`). A body that does not fit raises
`jsonschema.ValidationError` (the most relevant of the errors found).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "docs" / "schemas"
WEIGHTS_SCHEMA = SCHEMA_DIR / "millm-weights-api-v1.json"
HEALTH_SCHEMA = SCHEMA_DIR / "health-detailed.json"


@functools.cache
def _document(path: Path) -> tuple[dict[str, Any], Registry]:
    """The schema document (checked against draft 2020-12 itself) and a registry that resolves its `$ref`s."""
    document = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    return document, Registry().with_resource(document["$id"], Resource.from_contents(document))


def routes() -> tuple[str, ...]:
    """Every route the weights schema describes, as "METHOD path"."""
    document, _ = _document(WEIGHTS_SCHEMA)
    return tuple(document["properties"]["routes"]["properties"])


def _validator(path: Path, schema: dict[str, Any]) -> Draft202012Validator:
    document, registry = _document(path)
    return Draft202012Validator({"$schema": document["$schema"], **schema}, registry=registry)


@functools.cache
def _success_validator(route: str) -> Draft202012Validator:
    document, _ = _document(WEIGHTS_SCHEMA)
    known = document["properties"]["routes"]["properties"]
    if route not in known:
        raise KeyError(f"{route!r} is not a route of {WEIGHTS_SCHEMA.name}; known: {', '.join(known)}")
    base = document["$id"]
    return _validator(
        WEIGHTS_SCHEMA,
        {
            "allOf": [{"$ref": f"{base}#/$defs/success_envelope"}],
            "properties": {"data": {"$ref": base + known[route]["$ref"]}},
        },
    )


@functools.cache
def _error_validator() -> Draft202012Validator:
    document, _ = _document(WEIGHTS_SCHEMA)
    return _validator(WEIGHTS_SCHEMA, {"$ref": f"{document['$id']}#/$defs/error_envelope"})


@functools.cache
def _health_validator() -> Draft202012Validator:
    document, registry = _document(HEALTH_SCHEMA)
    return Draft202012Validator(document, registry=registry)


def _check(validator: Draft202012Validator, body: Any) -> None:
    error = best_match(validator.iter_errors(body))
    if error is not None:
        raise error


def validate_weights_error(body: Any) -> None:
    """A refusal of any /api/weights route: the error envelope."""
    _check(_error_validator(), body)


def validate_weights_response(route: str, body: Any) -> None:
    """A body of `route` ("POST /api/weights/attach"): a refusal (`"success": false`) against the error envelope,
    anything else against the success envelope with the route's data. KeyError for a route the schema lacks."""
    validator = _success_validator(route)  # an unknown route is an error even for a refusal
    if isinstance(body, dict) and body.get("success") is False:
        validate_weights_error(body)
    else:
        _check(validator, body)


def validate_health_detailed(body: Any) -> None:
    """The body of GET /api/health/detailed."""
    _check(_health_validator(), body)
