"""The `json` dialect (the ornith models): `{"name": NAME, "arguments": {...}}`, bare at a line start or in a
```json fence (`"function"` may stand for `"name"`). No opener marks a call, so `auto` constrains nothing."""

from __future__ import annotations

import json
import re
from typing import Any

from inference.engine.contract.dialects.base import Dialect
from inference.engine.contract.dialects.lark import LarkRules
from inference.engine.contract.dialects.parsing import (
    UNDECODABLE,
    Step,
    Syntax,
    call_name,
    decode,
    first_opener,
    json_name,
    malformed,
    unfinished,
)

INSTRUCTIONS = (
    'To call a function, reply with only a JSON object: {"name": <function-name>, "arguments": <arguments-object>}'
)


def render(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def grammar_call(rules: LarkRules, function: dict[str, Any], index: int) -> str:
    return rules.json_call(function)


_FENCES = ("```json\n", "```\n")
_FENCE_CLOSE = "```"
_LINE_BRACE = re.compile(r"^[ \t\r\f\v]*\{", re.M)
_CALL_START = re.compile(r'\{\s*"(?:name|function|arguments|parameters)"')
# Enough of JSON to find where an object ends: what opens a string or an object or closes one, and the rest of a
# string (group 1 unset while it is not closed yet).
_JSON_MARK = re.compile(r'["{}]')
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*(")?', re.S)


class JsonSyntax(Syntax):
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
        fence = first_opener(text, _FENCES)
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
            return len(text), [unfinished(json_name(body))]
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
        obj = decode(text[:end])
        if isinstance(obj, dict) and call_name(obj) is not None:
            return end, [self._object_call(obj)]
        if obj is UNDECODABLE and _CALL_START.match(text):
            return end, [malformed("its JSON does not decode")]
        return end, None


JSON = Dialect(
    name="json",
    template_markup=None,
    single_tokens=(),
    instructions=INSTRUCTIONS,
    render=render,
    opener=None,
    grammar_call=grammar_call,
    syntax=JsonSyntax,
)
