"""The tool-call dialects: how a model writes a call, one module per dialect, so that the worker and the edge agree.

Each dialect's module holds everything about it: the markup its template writes (from which the worker chooses a
model's dialect when it loads it, engine/text/tool_prompt.py), the markup a tokenizer may hold as one token, how a
call is rendered into a prompt and how a template without tool support is told to call, the grammar pieces that
compel a call (grammar.py), and the parser of its calls in the model's output (parser.py drives it). The worker
reports the dialect in LOADED; the edge parses the output in it.

| dialect | a call |
| --- | --- |
| `hermes` | `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` (Qwen2.5 / Qwen3 templates) |
| `qwen3_coder` | `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`|
| `minicpm` | `<function name="NAME"><param name="KEY">VALUE</param></function>` |
| `json` | `{"name": NAME, "arguments": {...}}`, bare or in a ```json fence (`"function"` may stand for `"name"`) |
"""
