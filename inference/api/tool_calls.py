"""A model's answer into OpenAI `tool_calls`, piece by piece as it streams, in the dialect the model writes calls in.

The worker reports each model's dialect (engine/contract/tool_dialect.py). The HTTP layer feeds the answer text (the
reasoning already split off, api/reasoning.py) to a `ToolCallParser` and gets back the content that is now certain
and the calls each piece completed. Text that may still open a call is held back until it resolves, so no part of a
call's markup reaches the client as content, and the result never depends on how the text was split. A call that
cannot be used (unparsable, naming a tool that was not offered, bad arguments, cut off) is left out, and the first
such problem is kept as `error`: the response reports it as the choice's `tool_call_error`. Whitespace right after a
call is dropped, and whitespace before one is kept only if more text follows the call (it then separates the text
around it), so an answer that is only calls has no content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import asdict, dataclass

from inference.api.reasoning import partial_suffix
from inference.engine.contract.tool_dialect import DIALECTS, ToolDialect


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

_UNDECODABLE = object()


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# Python's json reads NaN and Infinity, which json.dumps would write back as arguments no JSON client can read.
_JSON = json.JSONDecoder(parse_constant=_no_constant)


def _decode(text: str) -> object:
    """The JSON value `text` holds, or _UNDECODABLE (nesting too deep for the decoder counts as undecodable)."""
    try:
        return _JSON.decode(text)
    except (ValueError, RecursionError):
        return _UNDECODABLE


def _new_call(name: str, arguments: dict) -> ToolCall:
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall("call_" + secrets.token_hex(12), name, text)


def _malformed(why: str) -> ToolCallError:
    return ToolCallError("malformed_call", f"A tool call could not be parsed: {why}.")


def _unknown(name: str) -> ToolCallError:
    return ToolCallError("unknown_function", f"The model called {name}, which is not an offered tool.", name)


def _unfinished(name: str | None) -> ToolCallError:
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


def _typed(text: str, schema: object) -> object:
    """An XML parameter's value typed by its JSON schema, or _UNDECODABLE when the text is not of any of its types.
    Without a type (no schema, an enum or const alone) the value is the JSON it holds, else the text."""
    types = schema.get("type") if isinstance(schema, dict) else None
    types = [types] if isinstance(types, str) else types if isinstance(types, list) else []
    checks = [_TYPE_CHECKS[kind] for kind in types if isinstance(kind, str) and kind in _TYPE_CHECKS]
    if not checks and "string" not in types:
        value = _decode(text)
        return text if value is _UNDECODABLE else value
    value = _decode(text) if checks else _UNDECODABLE
    if value is not _UNDECODABLE and any(check(value) for check in checks):
        return value
    return text if "string" in types else _UNDECODABLE


def _strip_newlines(value: str) -> str:
    """A value less the one newline each side that the dialect writes around it (`<parameter=city>\\nParis\\n`)."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _first_opener(text: str, openers: tuple[str, ...]) -> int:
    """Where the first of `openers` starts in `text`, or where `text` ends in the start of one; else len(text)."""
    first = len(text)
    for opener in openers:
        found = text.find(opener)
        first = min(first, len(text) if found < 0 else found, len(text) - partial_suffix(text, opener))
    return first


def _call_name(obj: dict) -> str | None:
    """The function a JSON call object names ("function" may stand for "name")."""
    return next((obj[key] for key in ("name", "function") if isinstance(obj.get(key), str)), None)


_JSON_NAME = re.compile(r'"(?:name|function)"\s*:\s*("(?:[^"\\]|\\.)*")', re.S)


def _json_name(text: str) -> str | None:
    """The function name in the readable part of a JSON call that was cut off."""
    match = _JSON_NAME.search(text)
    name = _decode(match[1]) if match else None
    return name if isinstance(name, str) else None


class _Syntax:
    """How one dialect marks a call: `find` where one may start, `read` it there, `finish` one the output cut off.
    This base reads calls written between a fixed opener and closer; `_parse` turns what is between into an outcome."""

    opener = closer = ""

    def __init__(self, tools: dict[str, dict]) -> None:
        self._tools = tools  # offered function name -> its parameters' properties

    def find(self, text: str, line_start: bool) -> int:
        return _first_opener(text, (self.opener,))

    def read(self, text: str) -> Step | None:
        end = text.find(self.closer, len(self.opener))
        if not text.startswith(self.opener) or end < 0:
            return None
        return end + len(self.closer), [self._parse(text[len(self.opener) : end])]

    def finish(self, text: str) -> Step:
        if not text.startswith(self.opener):
            return 1, None  # the start of an opener that never came: plain text
        return len(text), [_unfinished(self._name(text))]

    def _parse(self, body: str) -> Outcome:
        raise NotImplementedError

    def _name(self, text: str) -> str | None:
        raise NotImplementedError

    def _object_call(self, obj: dict) -> Outcome:
        """A call written as JSON (hermes, json): its arguments are JSON already, an object or text holding one."""
        name = _call_name(obj)
        if name not in self._tools:
            return _unknown(name)
        arguments = obj.get("arguments", obj.get("parameters", {}))
        arguments = _decode(arguments) if isinstance(arguments, str) else arguments
        if not isinstance(arguments, dict):
            return ToolCallError("invalid_arguments", f"The arguments of {name} are not a JSON object.", name)
        return _new_call(name, arguments)


class _HermesSyntax(_Syntax):
    """`<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` (the Qwen2.5 and Qwen3 templates)."""

    opener, closer = "<tool_call>", "</tool_call>"

    def _parse(self, body: str) -> Outcome:
        obj = _decode(body)
        if not isinstance(obj, dict) or _call_name(obj) is None:
            return _malformed("its body is not a JSON object naming a function")
        return self._object_call(obj)

    def _name(self, text: str) -> str | None:
        return _json_name(text)


def _xml_values(body: str, element: re.Pattern) -> dict[str, str] | None:
    """The KEY -> VALUE texts of the parameter elements filling `body`; None when anything else is in it."""
    values, at = {}, 0
    while body[at:].strip():
        match = element.match(body, at)
        if match is None:
            return None
        values[match[1].strip()] = _strip_newlines(match[2])
        at = match.end()
    return values


class _XmlSyntax(_Syntax):
    """Calls written as XML elements: `call` reads the body between opener and closer into the name (group 1) and
    the parameter elements (group 2), `named` the name of one cut off. Values are text, typed by the tool's schema."""

    call = parameter = named = re.compile("")

    def _parse(self, body: str) -> Outcome:
        match = self.call.fullmatch(body)
        texts = _xml_values(match[2], self.parameter) if match else None
        if texts is None:
            return _malformed("its markup is not a function element holding parameter elements")
        name = match[1].strip()
        if name not in self._tools:
            return _unknown(name)
        arguments = {}
        for key, text in texts.items():
            arguments[key] = _typed(text, self._tools[name].get(key))
            if arguments[key] is _UNDECODABLE:
                message = f"The value of {key} in the call to {name} does not fit the parameter's type."
                return ToolCallError("invalid_arguments", message, name, key)
        return _new_call(name, arguments)

    def _name(self, text: str) -> str | None:
        match = self.named.search(text)
        return match[1].strip() if match else None


class _QwenCoderSyntax(_XmlSyntax):
    """`<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>` (Qwen3-Coder)."""

    opener, closer = "<tool_call>", "</tool_call>"
    call = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
    parameter = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    named = re.compile(r"<function=([^>\n]+)>")


class _MiniCpmSyntax(_XmlSyntax):
    """`<function name="NAME"><param name="KEY">VALUE</param></function>`, with no wrapper (MiniCPM)."""

    opener, closer = '<function name="', "</function>"
    call = re.compile(r'([^"]*)">(.*)', re.S)
    parameter = re.compile(r'\s*<param name="([^"]*)">(.*?)</param>', re.S)
    named = re.compile(r'^<function name="([^"]*)"')


_FENCES = ("```json\n", "```\n")
_FENCE_CLOSE = "```"
_LINE_BRACE = re.compile(r"^[ \t\r\f\v]*\{", re.M)
_CALL_START = re.compile(r'\{\s*"(?:name|function|arguments|parameters)"')
# Enough of JSON to find where an object ends: what opens a string or an object or closes one, and the rest of a
# string (group 1 unset while it is not closed yet).
_JSON_MARK = re.compile(r'["{}]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*(")?', re.S)


class _JsonSyntax(_Syntax):
    """`{"name": NAME, "arguments": {...}}` bare at a line start or in a ```json fence (the ornith models). Answers
    hold plain JSON and code fences too, so an object is a call only when it names a function, and a fence is a
    call's only when its first object is one."""

    def __init__(self, tools: dict[str, dict]) -> None:
        super().__init__(tools)
        self._in_fence = False  # inside a fence that a call opened: more calls, or its closing ```, may follow
        self._scanned = ("", 0, False)  # the start of the held object scanned so far: brace depth, inside a string

    def find(self, text: str, line_start: bool) -> int:
        if self._in_fence:
            start = len(text) - len(text.lstrip())
            rest = text[start:]
            if not rest or rest[0] == "{" or rest.startswith(_FENCE_CLOSE) or _FENCE_CLOSE.startswith(rest):
                return start
            self._in_fence = False  # text after the fence's calls: the fence was left open
        fence = _first_opener(text, _FENCES)
        braces = (match.end() - 1 for match in _LINE_BRACE.finditer(text, 0, fence) if match.start() or line_start)
        return next(braces, fence)

    def read(self, text: str) -> Step | None:
        if text[0] == "{":
            return self._read_object(text)
        if self._in_fence:
            if not text.startswith(_FENCE_CLOSE):
                return None
            self._in_fence = False
            return len(_FENCE_CLOSE), []
        opener = next((fence for fence in _FENCES if text.startswith(fence)), None)
        body = text[len(opener) :].lstrip() if opener else ""
        if not body:
            return None
        if body[0] != "{":
            return 1, None  # an ordinary code fence
        step = self._read_object(body)
        if step is None:
            return None
        if step[1] is None:
            return 1, None  # a fence around plain JSON
        self._in_fence = True
        return len(text) - len(body) + step[0], step[1]

    def finish(self, text: str) -> Step:
        opener = next((fence for fence in _FENCES if text.startswith(fence)), "")
        body = text[len(opener) :].lstrip()
        if _CALL_START.match(body):
            return len(text), [_unfinished(_json_name(body))]
        return 1, None

    def _object_end(self, text: str) -> int | None:
        """Where the JSON object opening `text` closes (one past its `}`); None while it is open. It only finds the
        end (the decoder then says whether the object is JSON), going on from where the last look at the same object
        stopped: a long argument streams in thousands of pieces."""
        scanned, depth, in_string = self._scanned
        at = len(scanned) if text.startswith(scanned) else 0
        depth, in_string = (depth, in_string) if at else (0, False)
        while True:
            if in_string:
                rest = _STRING_REST.match(text, at)
                at, in_string = rest.end(), rest[1] is None
                if in_string:
                    break
            token = _JSON_MARK.search(text, at)
            if token is None:
                at = len(text)
                break
            at, in_string = token.end(), token[0] == '"'
            depth += {"{": 1, "}": -1}.get(token[0], 0)
            if depth == 0:
                return at
        self._scanned = (text[:at], depth, in_string)
        return None

    def _read_object(self, text: str) -> Step | None:
        end = self._object_end(text)
        if end is None:
            head = text[1:].lstrip()
            return (1, None) if head and head[0] != '"' else None  # prose in braces is released at once
        obj = _decode(text[:end])
        if isinstance(obj, dict) and _call_name(obj) is not None:
            return end, [self._object_call(obj)]
        if obj is _UNDECODABLE and _CALL_START.match(text):
            return end, [_malformed("its JSON does not decode")]
        return end, None


_SYNTAXES: dict[ToolDialect, type[_Syntax]] = {
    "hermes": _HermesSyntax,
    "qwen3_coder": _QwenCoderSyntax,
    "minicpm": _MiniCpmSyntax,
    "json": _JsonSyntax,
}


def _offered(tools: list[dict]) -> dict[str, dict]:
    """Each offered function's name -> the properties of its parameters' schema."""
    offered = {}
    for tool in tools:
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties")
        offered[function.get("name")] = properties if isinstance(properties, dict) else {}
    return offered


class ToolCallParser:
    """Feed the answer text (reasoning already split off) piece by piece; pieces may split anywhere, even inside a
    tag. Each `push` returns the content that is now certain and the calls that piece completed; `flush` at the end
    returns what was still held back. `calls` holds every call so far, `error` the first problem met."""

    def __init__(self, dialect: ToolDialect, tools: list[dict]) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown tool dialect {dialect!r}")
        self._syntax = _SYNTAXES[dialect](_offered(tools))
        self.calls: list[ToolCall] = []
        self.error: ToolCallError | None = None
        self._held = ""  # text not decided yet: it starts where a call may start
        self._space = ""  # whitespace read (before a call, too): content only if more content follows it
        self._after_call = False  # whitespace right after a call is dropped
        self._markup_seen = False  # a call (parsed or not) was read: whitespace at the very end is dropped
        self._line_start = True  # whether the held text starts a line (or follows a call)

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._held += text
        return self._scan(final=False)

    def flush(self) -> tuple[str, list[ToolCall]]:
        content, calls = self._scan(final=True)
        if not self._markup_seen:
            content += self._space
        self._space = ""
        return content, calls

    def _scan(self, final: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._held:
            start = self._syntax.find(self._held, self._line_start)
            if start:
                content.append(self._content(self._held[:start]))
                self._held = self._held[start:]
                continue
            step = self._syntax.read(self._held)
            if step is None and final:
                step = self._syntax.finish(self._held)
            if step is None:
                break
            length, outcomes = step
            if outcomes is None:
                content.append(self._content(self._held[:length]))
            else:
                calls += self._markup(outcomes)
            self._held = self._held[length:]
        return "".join(content), calls

    def _content(self, text: str) -> str:
        """What of `text` (decided to be content) is released now; trailing whitespace waits for what follows."""
        newline = text.rfind("\n")
        self._line_start = (self._line_start or newline >= 0) and not text[newline + 1 :].strip()
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        body = text.rstrip()
        if not body:
            self._space += text
            return ""
        released, self._space = self._space + body, text[len(body) :]
        return released

    def _markup(self, outcomes: list[Outcome]) -> list[ToolCall]:
        # whitespace before the call stays held: it separates the text around the call if text follows
        self._after_call, self._line_start, self._markup_seen = True, True, True
        calls = [outcome for outcome in outcomes if isinstance(outcome, ToolCall)]
        self.calls += calls
        errors = [outcome for outcome in outcomes if isinstance(outcome, ToolCallError)]
        if errors and self.error is None:
            self.error = errors[0]
        return calls


def parse_tool_calls(
    dialect: ToolDialect, tools: list[dict], text: str
) -> tuple[str | None, list[ToolCall], ToolCallError | None]:
    """A whole output at once: (content, calls, error); content is None when calls were parsed and no other text is
    left."""
    parser = ToolCallParser(dialect, tools)
    content = parser.push(text)[0] + parser.flush()[0]
    return (None if parser.calls and not content else content), parser.calls, parser.error
