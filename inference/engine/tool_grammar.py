"""The grammar that compels a tool call, in a model's dialect (contract/tool_dialect.py), as llguidance Lark.

Built in the worker because it depends on the tokenizer: llguidance treats every added token as special, so markup
the tokenizer holds as one token (`<tool_call>` in Qwen and the demo model) must be named as that token (`<...>`),
and markup it does not hold is written as text.

- `required`: the output is one call to an offered tool (or to `function`, when the request named one), with
  arguments that follow that tool's `parameters` schema, then the end. JSON arguments (hermes, json) are JSON of the
  schema in the compact layout response_format uses; the XML dialects write each parameter in the schema's order,
  required ones always and optional ones maybe, a string value as text (bounded by minLength / maxLength, or one of
  its enum) and any other value as JSON of its schema. JSON is written by contract/json_grammar.py: llguidance's
  JSON Schema support, with every number's digits bounded.
- `auto`: free text, and once a call opener appears the call must be well formed; then free text again. The `json`
  dialect has no opener to wait for (any text may start an object), so `auto` leaves it unconstrained.
"""

from __future__ import annotations

import json
from typing import Any

from inference.engine.contract.json_grammar import JsonLark
from inference.engine.contract.tool_dialect import ToolDialect, ToolGrammarMode

# What starts a call in each dialect (`json` has none: a call is a bare object).
OPENERS: dict[ToolDialect, str] = {"hermes": "<tool_call>", "qwen3_coder": "<tool_call>", "minicpm": '<function name="'}


def tool_call_grammar(
    dialect: ToolDialect,
    tools: list[dict[str, Any]],
    *,
    mode: ToolGrammarMode,
    function: str | None = None,
    single_tokens: frozenset[str] = frozenset(),
) -> str | None:
    """The Lark text for `mode` over the offered `tools` (only `function` when given); None when the mode constrains
    nothing in this dialect. `single_tokens`: markup strings the tokenizer holds as one token each."""
    functions = [tool.get("function") or {} for tool in tools]
    if function is not None:
        functions = [f for f in functions if f.get("name") == function]
    if not functions or (mode == "auto" and dialect not in OPENERS):
        return None
    lark = _Lark(single_tokens)
    rests = " | ".join(lark.call_after_opener(dialect, f, i) for i, f in enumerate(functions))
    opener = OPENERS.get(dialect)
    if opener is None:
        lark.rule("start", rests)
    elif mode == "required":
        lark.rule("start", f"{lark.literal(opener)} ({rests})")
    else:  # free text up to an opener, then a call; the text stops at the opener
        lark.rule("rest", rests)
        if opener in single_tokens:
            lark.rule("start", f"(TEXT {lark.literal(opener)} rest)* TEXT")
        else:
            lark.rule("head[lazy]", f"/(?s:.*){_regex_escape(opener)}/")
            lark.rule("start", "(head rest)* TEXT")
        lark.rule("TEXT", "/(?s:.*)/")
    return lark.text()


class _Lark:
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

    def call_after_opener(self, dialect: ToolDialect, function: dict[str, Any], index: int) -> str:
        """The parts of one call to `function` that follow the dialect's opener, as a rule body."""
        name = str(function.get("name", ""))
        parameters = function.get("parameters") or {"type": "object"}
        if dialect in ("hermes", "json"):
            schema = {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            body = self.json.value(schema, root=parameters)
            if dialect == "json":
                return body
            return f'"\\n" {body} "\\n" {self.literal("</tool_call>")}'
        if dialect == "qwen3_coder":
            opening, closing = f"\n<function={name}>\n", "</function>\n"
            param_open, param_close = "<parameter={}>\n", "\n</parameter>\n"
        else:
            opening, closing = f'{name}">', "</function>"
            param_open, param_close = '<param name="{}">', "</param>"
        parts = []
        required = set(parameters.get("required") or ())
        for position, (key, schema) in enumerate((parameters.get("properties") or {}).items()):
            rule = f"p{index}_{position}"
            value = self.xml_value(f"v{index}_{position}", schema, parameters, param_close)
            self.rule(rule, f"{json.dumps(param_open.format(key))} {value}")
            parts.append(rule if key in required else f"{rule}?")
        body = " ".join([json.dumps(opening), *parts, json.dumps(closing)])
        return f"{body} {self.literal('</tool_call>')}" if dialect == "qwen3_coder" else body

    def xml_value(self, name: str, schema: Any, parameters: dict[str, Any], close: str) -> str:
        """One parameter's value and the text that closes it (`parameters`: the document its `$ref`s point into)."""
        schema = schema if isinstance(schema, dict) else {}
        if schema.get("type") == "string":
            if isinstance(schema.get("enum"), list):
                options = " | ".join(json.dumps(str(option)) for option in schema["enum"])
                return f"({options}) {json.dumps(close)}"
            low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
            count = f"{{{low},{int(high)}}}" if high is not None else f"{{{low},}}" if low else "*"
            self.rule(f"{name}[lazy]", f"/(?s:.{count}){_regex_escape(close)}/")
            return name
        return f"{self.json.value(schema, root=parameters)} {json.dumps(close)}"


def _regex_escape(text: str) -> str:
    """`text` as literal characters inside a Lark /regex/."""
    special = set("\\.^$|?*+()[]{}/")
    return "".join(f"\\{c}" if c in special else "\\n" if c == "\n" else c for c in text)
