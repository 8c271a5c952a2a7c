"""The load options as form inputs, and a posted form as the load route's body, so the UI offers every option the
API has (LoadOptions' fields, read from the struct) and validates them with the route's own validator
(inference/services/load_body.py)."""

from __future__ import annotations

from typing import Any

import msgspec

from inference.engine.contract.params import LoadOptions
from inference.services.load_body import validate_load_body

_FIELDS = msgspec.inspect.type_info(LoadOptions).fields


def _kind(option) -> tuple[msgspec.inspect.Type, str]:
    meta = option.type if isinstance(option.type, msgspec.inspect.Metadata) else None
    kind = meta.type if meta else option.type
    return kind, (meta.extra_json_schema or {}).get("description", "") if meta else ""


def option_inputs(options: LoadOptions | None = None) -> list[dict[str, Any]]:
    """One input per load option: name, kind (number, checkbox, choice), choices, value, and its description."""
    options = options or LoadOptions()
    inputs = []
    for option in _FIELDS:
        kind, description = _kind(option)
        value = getattr(options, option.name)
        entry = {"name": option.name, "description": description, "value": value}
        if isinstance(kind, msgspec.inspect.BoolType):
            entry["kind"] = "checkbox"
        elif isinstance(kind, msgspec.inspect.LiteralType):
            entry.update(kind="choice", choices=list(kind.values))
        else:
            entry["kind"] = "number"
        inputs.append(entry)
    return inputs


def load_body(post) -> dict[str, Any]:
    """The posted form as a validated load body (InvalidRequest naming a bad field): an empty number
    is the option's default, an unchecked box is false, an empty device is automatic. The form shows every option,
    so the body names every option: what the operator sees replaces the catalogue entry's saved options."""
    body: dict[str, Any] = {"path": post.get("path", "").strip()}
    for key in ("name", "device"):
        if post.get(key, "").strip():
            body[key] = post[key].strip()
    for option in _FIELDS:
        kind, _ = _kind(option)
        if isinstance(kind, msgspec.inspect.BoolType):
            body[option.name] = option.name in post
        else:
            body[option.name] = post.get(option.name, "") or option.default
    return validate_load_body(body)


def options_of(body: dict[str, Any]) -> LoadOptions:
    return LoadOptions(**{option.name: body[option.name] for option in _FIELDS})
