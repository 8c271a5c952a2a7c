"""A choice's output text as the client sees it: reasoning, content and tool calls, piece by piece as it streams.

The think block is split off first (reasoning.py), then the answer is parsed for tool calls in the model's dialect
(tool_calls.py) when the request offered tools. A streaming and a non-streaming response are built from the same
parts, so the stream reassembles to the non-streamed message.
"""

from __future__ import annotations

from typing import Any, Literal

from inference.api.reasoning import ReasoningSplitter
from inference.engine.contract.dialects.base import ToolDialect
from inference.engine.contract.dialects.parser import ToolCall, ToolCallError, ToolCallParser

Part = tuple[Literal["reasoning", "content"], str] | tuple[Literal["tool_call"], ToolCall]


class AnswerParts:
    """Feed the output's text pieces with `push`, then `flush` at its end; each returns the parts now certain."""

    def __init__(self, *, thinking: bool, dialect: ToolDialect, tools: list[dict[str, Any]] | None):
        self._reasoning = ReasoningSplitter(thinking=thinking)
        self._tools = ToolCallParser(dialect, tools) if tools else None

    @property
    def calls(self) -> list[ToolCall]:
        return self._tools.calls if self._tools else []

    @property
    def error(self) -> ToolCallError | None:
        return self._tools.error if self._tools else None

    def push(self, text: str) -> list[Part]:
        return self._parts(*self._reasoning.push(text), final=False)

    def flush(self) -> list[Part]:
        return self._parts(*self._reasoning.flush(), final=True)

    def _parts(self, reasoning: str, content: str, *, final: bool) -> list[Part]:
        parts: list[Part] = [("reasoning", reasoning)] if reasoning else []
        calls: list[ToolCall] = []
        if self._tools is not None:
            content, calls = self._tools.push(content)
            if final:
                rest, more = self._tools.flush()
                content, calls = content + rest, calls + more
        if content:
            parts.append(("content", content))
        parts += [("tool_call", call) for call in calls]
        return parts


def finish_reason(engine_reason: str, calls: list[ToolCall]) -> str:
    """The choice's finish_reason: `tool_calls` when the model stopped after parsed calls; `repetition_loop` and
    `length` are kept (a loop outranks calls, and a cut output says so)."""
    return "tool_calls" if calls and engine_reason == "stop" else engine_reason
