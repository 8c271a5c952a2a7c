"""The `minicpm` dialect (MiniCPM; Llama-architecture models whose template writes the BOS):
`<function name="NAME"><param name="KEY">VALUE</param></function>`, with no wrapper, each value as text (a
non-string one as JSON), typed by the tool's schema when parsed."""

from __future__ import annotations

import re
from typing import Any

from inference.engine.contract.dialects.base import Dialect
from inference.engine.contract.dialects.lark import LarkRules
from inference.engine.contract.dialects.parsing import XmlSyntax, value_texts

OPENER, CLOSER = '<function name="', "</function>"
INSTRUCTIONS = (
    'To call a function, reply in exactly this format:\n<function name="example_function_name">'
    '<param name="example_parameter">value</param></function>'
)


def render(name: str, arguments: Any) -> str:
    params = "".join(f'<param name="{key}">{value}</param>' for key, value in value_texts(arguments).items())
    return f'{OPENER}{name}">{params}{CLOSER}'


def grammar_call(rules: LarkRules, function: dict[str, Any], index: int) -> str:
    name = str(function.get("name", ""))
    return rules.xml_call(function, index, f'{name}">', CLOSER, ('<param name="{}">', "</param>"))


class MiniCpmSyntax(XmlSyntax):
    opener, closer = OPENER, CLOSER
    call = re.compile(r'([^"]*)">(.*)', re.S)
    parameter = re.compile(r'\s*<param name="([^"]*)">(.*?)</param>', re.S)
    named = re.compile(r'^<function name="([^"]*)"')


MINICPM = Dialect(
    name="minicpm",
    template_markup="<function name=",
    single_tokens=(),
    instructions=INSTRUCTIONS,
    render=render,
    opener=OPENER,
    grammar_call=grammar_call,
    syntax=MiniCpmSyntax,
)
