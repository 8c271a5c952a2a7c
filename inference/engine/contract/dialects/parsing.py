"""Reading calls out of a model's output: what a call parses into, and the bases the dialects' parsers build on.

A dialect's `Syntax` finds where a call may start in the text held back, reads one there, and finishes one the
output cut off; parser.py drives it over a streamed output. A call that cannot be used (unparsable, naming a tool
that was not offered, bad arguments, cut off) becomes a `ToolCallError`, the spec's `tool_call_error`.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass
from typing import Any

from inference.engine.contract.markup import partial_suffix


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call, as a response's `tool_calls` entry; `arguments` is the arguments object as JSON text."""

    id: str
    name: str
    arguments: str

    def body(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class ToolCallError:
    """Why a call the model wrote was left out: the spec's `tool_call_error` object."""

    code: str  # unfinished_call | malformed_call | unknown_function | invalid_arguments
    message: str
    function: str | None = None
    parameter: str | None = None

    def body(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}


Outcome = ToolCall | ToolCallError
# What a dialect read at the start of the held text: its length, and the calls or errors written there (None: the
# text is content). None instead of a step: not decided until more text comes.
Step = tuple[int, "list[Outcome] | None"]

UNDECODABLE = object()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# Python's json reads NaN and Infinity, which json.dumps would write back as arguments no JSON client can read.
_JSON = json.JSONDecoder(parse_constant=_no_constant)


def decode(text: str) -> object:
    """The JSON value `text` holds, or UNDECODABLE (nesting too deep for the decoder counts as undecodable)."""
    try:
        return _JSON.decode(text)
    except (ValueError, RecursionError):
        return UNDECODABLE


def new_call(name: str, arguments: dict) -> ToolCall:
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall("call_" + secrets.token_hex(12), name, text)


def malformed(why: str) -> ToolCallError:
    return ToolCallError("malformed_call", f"A tool call could not be parsed: {why}.")


def unknown(name: str) -> ToolCallError:
    return ToolCallError("unknown_function", f"The model called {name}, which is not an offered tool.", name)


def unfinished(name: str | None) -> ToolCallError:
    what = f"the call to {name}" if name else "a tool call"
    return ToolCallError("unfinished_call", f"The output ended inside {what} before it was closed.", name)


_TYPE_CHECKS = {
    "integer": lambda value: type(value) is int,
    "number": lambda value: type(value) in (int, float),
    "boolean": lambda value: type(value) is bool,
    "null": lambda value: value is None,
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
}


def typed(text: str, schema: object) -> object:
    """An XML parameter's value typed by its JSON schema, or UNDECODABLE when the text is not of any of its types.
    Without a type (no schema, an enum or const alone) the value is the JSON it holds, else the text."""
    types = schema.get("type") if isinstance(schema, dict) else None
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    checks = [_TYPE_CHECKS[kind] for kind in types if isinstance(kind, str) and kind in _TYPE_CHECKS]
    if not checks and "string" not in types:
        value = decode(text)
        return text if value is UNDECODABLE else value
    value = decode(text) if checks else UNDECODABLE
    if value is not UNDECODABLE and any(check(value) for check in checks):
        return value
    return text if "string" in types else UNDECODABLE


def strip_newlines(value: str) -> str:
    """A value less the one newline each side that the dialect writes around it (`<parameter=city>\\nParis\\n`)."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def first_opener(text: str, openers: tuple[str, ...]) -> int:
    """Where the first of `openers` starts in `text`, or where `text` ends in the start of one; else len(text)."""
    first = len(text)
    for opener in openers:
        found = text.find(opener)
        first = min(first, len(text) if found < 0 else found, len(text) - partial_suffix(text, opener))
    return first


def call_name(obj: dict) -> str | None:
    """The function a JSON call object names ("function" may stand for "name")."""
    return next((obj[key] for key in ("name", "function") if isinstance(obj.get(key), str)), None)


JSON_NAME = re.compile(r'"(?:name|function)"\s*:\s*("(?:[^"\\]|\\.)*")', re.S)


def json_name(text: str) -> str | None:
    """The function name in the readable part of a JSON call that was cut off."""
    match = JSON_NAME.search(text)
    name = decode(match[1]) if match else None
    return name if isinstance(name, str) else None


class Syntax:
    """How one dialect marks a call: `find` where one may start, `read` it there, `finish` one the output cut off.
    This base reads calls written between a fixed opener and closer; `_parse` turns what is between into an outcome."""

    opener = closer = ""

    def __init__(self, tools: dict[str, dict]) -> None:
        self._tools = tools  # offered function name -> its parameters' properties

    def find(self, text: str, line_start: bool) -> int:
        return first_opener(text, (self.opener,))

    def read(self, text: str) -> Step | None:
        end = text.find(self.closer, len(self.opener))
        if not text.startswith(self.opener) or end < 0:
            return None
        return end + len(self.closer), [self._parse(text[len(self.opener) : end])]

    def finish(self, text: str) -> Step:
        if not text.startswith(self.opener):
            return 1, None  # the start of an opener that never came: plain text
        return len(text), [unfinished(self._name(text))]

    def _parse(self, body: str) -> Outcome:
        raise NotImplementedError

    def _name(self, text: str) -> str | None:
        raise NotImplementedError

    def _object_call(self, obj: dict) -> Outcome:
        """A call written as JSON (hermes, json): its arguments are JSON already, an object or text holding one."""
        name = call_name(obj)
        if name not in self._tools:
            return unknown(name)
        arguments = obj.get("arguments", obj.get("parameters", {}))
        arguments = decode(arguments) if isinstance(arguments, str) else arguments
        if not isinstance(arguments, dict):
            return ToolCallError("invalid_arguments", f"The arguments of {name} are not a JSON object.", name)
        return new_call(name, arguments)


def xml_values(body: str, element: re.Pattern) -> dict[str, str] | None:
    """The KEY -> VALUE texts of the parameter elements filling `body`; None when anything else is in it."""
    values, at = {}, 0
    while body[at:].strip():
        match = element.match(body, at)
        if match is None:
            return None
        values[match[1].strip()] = strip_newlines(match[2])
        at = match.end()
    return values


class XmlSyntax(Syntax):
    """Calls written as XML elements: `call` reads the body between opener and closer into the name (group 1) and
    the parameter elements (group 2), `named` the name of one cut off. Values are text, typed by the tool's schema."""

    call = parameter = named = re.compile("")

    def _parse(self, body: str) -> Outcome:
        match = self.call.fullmatch(body)
        texts = xml_values(match[2], self.parameter) if match else None
        if texts is None:
            return malformed("its markup is not a function element holding parameter elements")
        name = match[1].strip()
        if name not in self._tools:
            return unknown(name)
        arguments = {}
        for key, text in texts.items():
            arguments[key] = typed(text, self._tools[name].get(key))
            if arguments[key] is UNDECODABLE:
                message = f"The value of {key} in the call to {name} does not fit the parameter's type."
                return ToolCallError("invalid_arguments", message, name, key)
        return new_call(name, arguments)

    def _name(self, text: str) -> str | None:
        match = self.named.search(text)
        return match[1].strip() if match else None


def value_texts(arguments: Any) -> dict[str, str]:
    """An XML dialect's parameter texts for `arguments`: a string as it is, any other value as JSON (what the
    parsers read back, typed by the tool's schema); arguments that are not an object have no parameters."""
    args = arguments if isinstance(arguments, dict) else {}
    return {key: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for key, v in args.items()}
