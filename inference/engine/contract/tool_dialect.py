"""The tool-call dialects: how a model writes a call, so that both sides agree on the name of each.

The worker chooses a model's dialect when it loads it (engine/text/tool_prompt.py: from its chat template, else its
name and architecture) and reports it in LOADED; the control plane then parses the model's output in that dialect
and the worker builds the grammar that compels a call (api/tool_calls.py, engine/tool_grammar.py).

| dialect | a call |
| --- | --- |
| `hermes` | `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` (Qwen2.5 / Qwen3 templates) |
| `qwen3_coder` | `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`|
| `minicpm` | `<function name="NAME"><param name="KEY">VALUE</param></function>` |
| `json` | `{"name": NAME, "arguments": {...}}`, bare or in a ```json fence (`"function"` may stand for `"name"`) |
"""

from __future__ import annotations

from typing import Literal

ToolDialect = Literal["hermes", "qwen3_coder", "minicpm", "json"]
DIALECTS: tuple[ToolDialect, ...] = ("hermes", "qwen3_coder", "minicpm", "json")
DEFAULT_DIALECT: ToolDialect = "qwen3_coder"  # the spec's default, for a model nothing else decides
# How a request's tool calls are constrained (engine/tool_grammar.py): `required` compels one call, `auto` keeps a
# call well formed once its opener appears.
ToolGrammarMode = Literal["required", "auto"]
