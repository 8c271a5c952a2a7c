"""The dialects' names as they travel in messages, and what one dialect's module provides (`Dialect`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from inference.engine.contract.dialects.lark import LarkRules
from inference.engine.contract.dialects.parsing import Syntax

ToolDialect = Literal["hermes", "qwen3_coder", "minicpm", "json"]
DIALECTS: tuple[ToolDialect, ...] = ("hermes", "qwen3_coder", "minicpm", "json")
DEFAULT_DIALECT: ToolDialect = "qwen3_coder"  # the spec's default, for a model nothing else decides
# How a request's tool calls are constrained (grammar.py): `required` compels one call, `auto` keeps a call well
# formed once its opener appears.
ToolGrammarMode = Literal["required", "auto"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One dialect, as its module describes it.

    - `template_markup`: text a chat template writes only when it renders calls in this dialect (None: none).
    - `single_tokens`: markup a tokenizer may hold as one token each (the grammar must name those as tokens).
    - `instructions`: how a template without tool support is told to call (after the tools' signatures).
    - `render(name, arguments)`: one call as the model writes it.
    - `opener`: the text that starts a call (None: a call is a bare object, so `auto` cannot wait for one).
    - `grammar_call(rules, function, index)`: the rule body of one call to `function` after the opener, written
      with `rules` (lark.py).
    - `syntax`: the parser of its calls in an output (parser.py feeds it)."""

    name: ToolDialect
    template_markup: str | None
    single_tokens: tuple[str, ...]
    instructions: str
    render: Callable[[str, Any], str]
    opener: str | None
    grammar_call: Callable[[LarkRules, dict[str, Any], int], str]
    syntax: type[Syntax]
