"""The `hermes` dialect (the Qwen2.5 and Qwen3 templates): `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n
</tool_call>`, a JSON object between tags a tokenizer may hold as single tokens."""

from __future__ import annotations

import json
from typing import Any

from inference.engine.contract.dialects.base import Dialect
from inference.engine.contract.dialects.lark import LarkRules
from inference.engine.contract.dialects.parsing import Outcome, Syntax, call_name, decode, json_name, malformed

OPENER, CLOSER = "<tool_call>", "</tool_call>"
INSTRUCTIONS = (
    "For each function call, return a JSON object with the function name and arguments within <tool_call>"
    '</tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <arguments-object>}\n</tool_call>'
)


def render(name: str, arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPENER}\n{body}\n{CLOSER}"


def grammar_call(rules: LarkRules, function: dict[str, Any], index: int) -> str:
    return f'"\\n" {rules.json_call(function)} "\\n" {rules.literal(CLOSER)}'


class HermesSyntax(Syntax):
    opener, closer = OPENER, CLOSER

    def _parse(self, body: str) -> Outcome:
        obj = decode(body)
        if not isinstance(obj, dict) or call_name(obj) is None:
            return malformed("its body is not a JSON object naming a function")
        return self._object_call(obj)

    def _name(self, text: str) -> str | None:
        return json_name(text)


HERMES = Dialect(
    name="hermes",
    template_markup=OPENER,
    single_tokens=(OPENER, CLOSER),
    instructions=INSTRUCTIONS,
    render=render,
    opener=OPENER,
    grammar_call=grammar_call,
    syntax=HermesSyntax,
)
