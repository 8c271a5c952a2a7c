"""`response_format` -> the grammar the engine enforces, and what `response_format_status` will say.

`json_object` constrains the answer to a JSON object and `json_schema` to its schema (llguidance compiles it; see
inference/engine/grammar.py), as the Lark grammar of engine/contract/json_grammar.py, which bounds every number's
digits. The schema must be valid JSON Schema (checked against its metaschema with `jsonschema`), else the request is
400 before anything runs. Keywords llguidance cannot enforce (`uniqueItems`, `not`, ...) are left out of the
constraint and the status says `schema_downgraded`. The JSON is written compactly (`", "` and `": "` between items
and keys, no other whitespace): free whitespace lets a model wander in blank space without ever closing the object.

Statuses (spec: "response_format_status"): `applied` (text, or a constraint armed), `schema_downgraded`,
`ignored_tools_present` (tools win: the format does not constrain), `ignored_unknown_type`; `not_enforced` replaces
`applied` or `schema_downgraded` when the output did not complete the grammar (e.g. it ran out of max_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema
import llguidance

from inference.engine.contract.json_grammar import json_schema_lark
from pantheon_site.errors import InvalidRequest

JSON_OBJECT_SCHEMA = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ResponseFormatPlan:
    """The grammar to enforce (None: none), and the status a completion reports (None: the request sent no
    response_format)."""

    grammar: str | None = None
    status: str | None = None

    def final_status(self, grammar_complete: bool | None) -> str | None:
        """The status once the output is known: `not_enforced` when an armed grammar was not completed."""
        if self.grammar is not None and grammar_complete is False:
            return "not_enforced"
        return self.status


def plan_response_format(response_format: Any, *, tools_present: bool) -> ResponseFormatPlan:
    """The plan for a request's `response_format` (already known to be an object or None); InvalidRequest for a
    json_schema without a usable schema."""
    if response_format is None:
        return ResponseFormatPlan()
    kind = response_format.get("type")
    if kind == "text":
        return ResponseFormatPlan(status="applied")
    if kind == "json_object":
        schema = JSON_OBJECT_SCHEMA
    elif kind == "json_schema":
        schema = _schema_of(response_format.get("json_schema"))
    else:
        return ResponseFormatPlan(status="ignored_unknown_type")
    if tools_present:
        return ResponseFormatPlan(status="ignored_tools_present")
    grammar = llguidance.LLMatcher.grammar_from_lark(json_schema_lark(schema))
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise InvalidRequest(f"response_format.json_schema.schema cannot be enforced: {'; '.join(messages)}")
    return ResponseFormatPlan(grammar=grammar, status="schema_downgraded" if messages else "applied")


def _schema_of(json_schema: Any) -> dict[str, Any]:
    if not isinstance(json_schema, dict) or not isinstance(json_schema.get("schema"), dict):
        raise InvalidRequest("response_format of type json_schema needs json_schema.schema, a JSON Schema object")
    schema = json_schema["schema"]
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidRequest(f"response_format.json_schema.schema is not valid JSON Schema: {exc.message}") from None
    return schema
