"""The grammar that compels a tool call, in a model's dialect, as llguidance Lark (the pieces are each dialect's).

Built in the worker because it depends on the tokenizer (`single_tokens`, lark.py), torch-free like the dialects.

- `required`: the output is one call to an offered tool (or to `function`, when the request named one), with
  arguments that follow that tool's `parameters` schema, then the end.
- `auto`: free text, and once a call opener appears the call must be well formed; then free text again. The `json`
  dialect has no opener to wait for (any text may start an object), so `auto` leaves it unconstrained.
"""

from __future__ import annotations

from typing import Any

from inference.engine.contract.dialects.base import ToolDialect, ToolGrammarMode
from inference.engine.contract.dialects.lark import LarkRules, regex_escape
from inference.engine.contract.dialects.registry import DIALECT


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
    spelling = DIALECT[dialect]
    functions = [tool.get("function") or {} for tool in tools]
    if function is not None:
        functions = [f for f in functions if f.get("name") == function]
    opener = spelling.opener
    if not functions or (mode == "auto" and opener is None):
        return None
    lark = LarkRules(single_tokens)
    rests = " | ".join(spelling.grammar_call(lark, f, i) for i, f in enumerate(functions))
    if opener is None:
        lark.rule("start", rests)
    elif mode == "required":
        lark.rule("start", f"{lark.literal(opener)} ({rests})")
    else:  # free text up to an opener, then a call; the text stops at the opener
        lark.rule("rest", rests)
        if opener in single_tokens:
            lark.rule("start", f"(TEXT {lark.literal(opener)} rest)* TEXT")
        else:
            lark.rule("head[lazy]", f"/(?s:.*){regex_escape(opener)}/")
            lark.rule("start", "(head rest)* TEXT")
        lark.rule("TEXT", "/(?s:.*)/")
    return lark.text()
