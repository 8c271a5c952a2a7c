"""The `qwen3_coder` dialect (Qwen3-Coder, and the default for a model nothing else decides):
`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`, each value
as text (a non-string one as JSON), typed by the tool's schema when parsed."""

from __future__ import annotations

import re
from typing import Any

from inference.engine.contract.dialects.base import Dialect
from inference.engine.contract.dialects.lark import LarkRules
from inference.engine.contract.dialects.parsing import XmlSyntax, value_texts

OPENER, CLOSER = "<tool_call>", "</tool_call>"
INSTRUCTIONS = (
    "To call a function, reply in exactly this format:\n<tool_call>\n<function=example_function_name>\n"
    "<parameter=example_parameter>\nvalue\n</parameter>\n</function>\n</tool_call>"
)


def render(name: str, arguments: Any) -> str:
    params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in value_texts(arguments).items())
    return f"{OPENER}\n<function={name}>\n{params}</function>\n{CLOSER}"


def grammar_call(rules: LarkRules, function: dict[str, Any], index: int) -> str:
    name = str(function.get("name", ""))
    params = ("<parameter={}>\n", "\n</parameter>\n")
    body = rules.xml_call(function, index, f"\n<function={name}>\n", "</function>\n", params)
    return f"{body} {rules.literal(CLOSER)}"


class QwenCoderSyntax(XmlSyntax):
    opener, closer = OPENER, CLOSER
    call = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
    parameter = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.S)
    named = re.compile(r"<function=([^>\n]+)>")


QWEN3_CODER = Dialect(
    name="qwen3_coder",
    template_markup="<function=",
    single_tokens=(OPENER, CLOSER),
    instructions=INSTRUCTIONS,
    render=render,
    opener=OPENER,
    grammar_call=grammar_call,
    syntax=QwenCoderSyntax,
)
