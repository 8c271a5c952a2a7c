"""A model's answer into OpenAI `tool_calls`, piece by piece as it streams, in the dialect the model writes calls in.

The worker reports each model's dialect in LOADED, and the edge feeds the answer text (the
reasoning already split off) to a `ToolCallParser` and gets back the content that is now certain
and the calls each piece completed. Text that may still open a call is held back until it resolves, so no part of a
call's markup reaches the client as content, and the result never depends on how the text was split. A call that
cannot be used (unparsable, naming a tool that was not offered, bad arguments, cut off) is left out, and the first
such problem is kept as `error`: the response reports it as the choice's `tool_call_error`. Whitespace right after a
call is dropped, and whitespace before one is kept only if more text follows the call (it then separates the text
around it), so an answer that is only calls has no content.
"""

from __future__ import annotations

from inference.engine.contract.dialects.base import ToolDialect
from inference.engine.contract.dialects.parsing import Outcome, ToolCall, ToolCallError
from inference.engine.contract.dialects.registry import DIALECT


def _offered(tools: list[dict]) -> dict[str, dict]:
    """Each offered function's name -> the properties of its parameters' schema."""
    offered = {}
    for tool in tools:
        function = tool.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties")
        offered[function.get("name")] = properties if isinstance(properties, dict) else {}
    return offered


class ToolCallParser:
    """Feed the answer text (reasoning already split off) piece by piece; pieces may split anywhere, even inside a
    tag. Each `push` returns the content that is now certain and the calls that piece completed; `flush` at the end
    returns what was still held back. `calls` holds every call so far, `error` the first problem met."""

    def __init__(self, dialect: ToolDialect, tools: list[dict]) -> None:
        if dialect not in DIALECT:
            raise ValueError(f"unknown tool dialect {dialect!r}")
        self._syntax = DIALECT[dialect].syntax(_offered(tools))
        self.calls: list[ToolCall] = []
        self.error: ToolCallError | None = None
        self._held = ""  # text not decided yet: it starts where a call may start
        self._space = ""  # whitespace read (before a call, too): content only if more content follows it
        self._after_call = False  # whitespace right after a call is dropped
        self._markup_seen = False  # a call (parsed or not) was read: whitespace at the very end is dropped
        self._line_start = True  # whether the held text starts a line (or follows a call)

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._held += text
        return self._scan(final=False)

    def flush(self) -> tuple[str, list[ToolCall]]:
        content, calls = self._scan(final=True)
        if not self._markup_seen:
            content += self._space
        self._space = ""
        return content, calls

    def _scan(self, final: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._held:
            start = self._syntax.find(self._held, self._line_start)
            if start:
                content.append(self._content(self._held[:start]))
                self._held = self._held[start:]
                continue
            step = self._syntax.read(self._held)
            if step is None and final:
                step = self._syntax.finish(self._held)
            if step is None:
                break
            length, outcomes = step
            if outcomes is None:
                content.append(self._content(self._held[:length]))
            else:
                calls += self._markup(outcomes)
            self._held = self._held[length:]
        return "".join(content), calls

    def _content(self, text: str) -> str:
        """What of `text` (decided to be content) is released now; trailing whitespace waits for what follows."""
        newline = text.rfind("\n")
        self._line_start = (self._line_start or newline >= 0) and not text[newline + 1 :].strip()
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        body = text.rstrip()
        if not body:
            self._space += text
            return ""
        released, self._space = self._space + body, text[len(body) :]
        return released

    def _markup(self, outcomes: list[Outcome]) -> list[ToolCall]:
        # whitespace before the call stays held: it separates the text around the call if text follows
        self._after_call, self._line_start, self._markup_seen = True, True, True
        calls = [outcome for outcome in outcomes if isinstance(outcome, ToolCall)]
        self.calls += calls
        errors = [outcome for outcome in outcomes if isinstance(outcome, ToolCallError)]
        if errors and self.error is None:
            self.error = errors[0]
        return calls
