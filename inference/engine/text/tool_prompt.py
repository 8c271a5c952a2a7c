"""Tools into the prompt: which dialect a model writes its calls in, and how tools and past calls reach its template.

A template that reads `tools` (Qwen2.5, Qwen3, the demo model) renders them, the assistant turns' `tool_calls` and
the `tool` results itself, in the format the model was trained on; its dialect is read from the call markup it
writes. A template that knows nothing of tools gets them as text: a system turn describing the tools and how to call
them in the model's dialect (merged with a leading system message), assistant calls written back as that dialect's
markup, and tool results as user turns in `<tool_response>` tags, so a later turn renders exactly the tokens the
model wrote and a session's cache stays valid.

Without markup in the template the dialect follows the spec (tool_calling.c:tc_dialect_for_model): `json` for
served names starting with "ornith", `minicpm` for Llama-architecture models whose template writes the BOS
(MiniCPM5), else `qwen3_coder`.
"""

from __future__ import annotations

import json
from typing import Any

from inference.engine.contract.dialects.base import DEFAULT_DIALECT, ToolDialect
from inference.engine.contract.dialects.registry import DIALECT, TEMPLATE_ORDER


def choose_dialect(template_source: str, *, name: str, architecture: str, template_writes_bos: bool) -> ToolDialect:
    """The dialect a model's calls are parsed in (see the module docstring)."""
    if name.lower().startswith("ornith"):
        return "json"
    for dialect in TEMPLATE_ORDER:
        if dialect.template_markup is not None and dialect.template_markup in template_source:
            return dialect.name
    if architecture == "llama" and template_writes_bos:
        return "minicpm"
    return DEFAULT_DIALECT


def call_arguments(call: dict[str, Any]) -> tuple[str, Any]:
    """An OpenAI `tool_calls` entry's function name and arguments, the arguments decoded when they are JSON text (as
    OpenAI clients send them) so that templates write them as the model did, not as a quoted string."""
    function = call.get("function") or call
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return str(function.get("name", "")), arguments


def with_decoded_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with each assistant call's arguments decoded (see `call_arguments`), for templates that read tools."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                name, arguments = call_arguments(call)
                function = {**(call.get("function") or {}), "name": name, "arguments": arguments}
                calls.append({**call, "function": function})
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def tools_system_text(dialect: ToolDialect, tools: list[dict[str, Any]]) -> str:
    """The system text that offers `tools` to a model whose template does not render them."""
    signatures = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more of these functions. Their signatures, one JSON object per line:\n"
        f"<tools>\n{signatures}\n</tools>\n\n{DIALECT[dialect].instructions}"
    )


def with_tools_as_text(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, dialect: ToolDialect
) -> list[dict[str, Any]]:
    """The messages a template without tool support renders: the tools in a (merged) system turn, assistant calls as
    the dialect's markup after their content, tool results as user turns."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            render = DIALECT[dialect].render
            calls = "\n".join(render(*call_arguments(call)) for call in message["tool_calls"])
            content = message.get("content") or ""
            message = {k: v for k, v in message.items() if k != "tool_calls"}
            message["content"] = f"{content}\n{calls}" if content else calls
        elif role == "tool":
            message = {"role": "user", "content": f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"}
        out.append(message)
    if tools:
        offer = tools_system_text(dialect, tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{offer}"}
        else:
            out.insert(0, {"role": "system", "content": offer})
    return out
