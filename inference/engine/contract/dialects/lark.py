"""The rules of one tool-call grammar, as llguidance Lark: what the dialects' grammar pieces are written with.

Markup the tokenizer holds as one token (`<tool_call>` in Qwen and the demo model) is named as that token, since
llguidance treats every added token as special; other markup is written as text. JSON arguments are JSON of the
schema in the compact layout response_format uses (json_grammar.py, every number's digits bounded); XML parameters
are written in the schema's order, required ones always and optional ones maybe, a string value as text (bounded by
minLength / maxLength, or one of its enum) and any other value as JSON of its schema.
"""

from __future__ import annotations

import json
from typing import Any

from inference.engine.contract.json_grammar import JsonLark


class LarkRules:
    """Collects the rules of one grammar; each call's rule is a sequence of named parts."""

    def __init__(self, single_tokens: frozenset[str]):
        self.single_tokens = single_tokens
        self.rules: list[str] = []
        self.json = JsonLark()

    def rule(self, name: str, body: str) -> None:
        self.rules.append(f"{name}: {body}")

    def text(self) -> str:
        return "\n".join(self.rules + self.json.rules) + "\n"

    def literal(self, text: str) -> str:
        """`text` in a rule: the token itself when the tokenizer holds it as one (`<tool_call>` names that token)."""
        return text if text in self.single_tokens else json.dumps(text)

    def json_call(self, function: dict[str, Any]) -> str:
        """A call to `function` as one JSON object, `{"name": NAME, "arguments": {...}}`."""
        parameters = function.get("parameters") or {"type": "object"}
        schema = {
            "type": "object",
            "properties": {"name": {"const": str(function.get("name", ""))}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        return self.json.value(schema, root=parameters)

    def xml_call(self, function: dict[str, Any], index: int, opening: str, closing: str, param: tuple[str, str]) -> str:
        """A call to `function` as XML: `opening`, each parameter between `param`'s open (a format of its key) and
        close text, then `closing`."""
        param_open, param_close = param
        parameters = function.get("parameters") or {"type": "object"}
        parts = []
        required = set(parameters.get("required") or ())
        for position, (key, schema) in enumerate((parameters.get("properties") or {}).items()):
            rule = f"p{index}_{position}"
            value = self.xml_value(f"v{index}_{position}", schema, parameters, param_close)
            self.rule(rule, f"{json.dumps(param_open.format(key))} {value}")
            parts.append(rule if key in required else f"{rule}?")
        return " ".join([json.dumps(opening), *parts, json.dumps(closing)])

    def xml_value(self, name: str, schema: Any, parameters: dict[str, Any], close: str) -> str:
        """One parameter's value and the text that closes it (`parameters`: the document its `$ref`s point into)."""
        schema = schema if isinstance(schema, dict) else {}
        if schema.get("type") == "string":
            if isinstance(schema.get("enum"), list):
                options = " | ".join(json.dumps(str(option)) for option in schema["enum"])
                return f"({options}) {json.dumps(close)}"
            low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
            count = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}" if low else "*"
            self.rule(f"{name}[lazy]", f"/(?s:.{count}){regex_escape(close)}/")
            return name
        return f"{self.json.value(schema, root=parameters)} {json.dumps(close)}"


def regex_escape(text: str) -> str:
    """`text` as literal characters inside a Lark /regex/."""
    special = set("\\.^$|?*+()[]{}/")
    return "".join(f"\\{c}" if c in special else "\\n" if c == "\n" else c for c in text)
