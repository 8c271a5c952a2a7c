"""Splitting a think-style model's output into `reasoning_content` and `content`, piece by piece as it streams.

A model whose chat template lets it think writes `<think>…</think>` before its answer. The text inside goes to
`reasoning_content`, the rest to `content`. Only an opening tag at the very start of the output (after whitespace)
opens a think block, unless the template opened it in the prompt (the worker says so in STARTED: `thinking`), in
which case the output starts inside it. Tags split across pieces are held back until they resolve.
"""

from __future__ import annotations

from inference.engine.contract.markup import THINK_CLOSE, THINK_OPEN, partial_suffix


class ReasoningSplitter:
    """Feed text pieces in order with `push`; each returns (reasoning, content) text that is now certain."""

    def __init__(self, *, thinking: bool = False) -> None:
        self._state = "think" if thinking else "start"  # start: may still open a block; think: inside; answer: plain
        self._held = ""
        self._after_tag = thinking  # newlines right after a tag belong to neither part

    def push(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning = content = ""
        while self._held:
            if self._after_tag:
                self._held = self._held.lstrip("\n")
                if not self._held:
                    break
                self._after_tag = False
            if self._state == "start":
                stripped = self._held.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._held, self._state, self._after_tag = stripped[len(THINK_OPEN) :], "think", True
                elif THINK_OPEN.startswith(stripped):
                    break  # still might be the opening tag
                else:
                    self._state = "answer"
            elif self._state == "think":
                end = self._held.find(THINK_CLOSE)
                if end >= 0:
                    reasoning += self._held[:end]
                    self._held, self._state, self._after_tag = self._held[end + len(THINK_CLOSE) :], "answer", True
                    continue
                keep = partial_suffix(self._held, THINK_CLOSE)
                reasoning += self._held[: len(self._held) - keep]
                self._held = self._held[len(self._held) - keep :]
                break
            else:
                content += self._held
                self._held = ""
        return reasoning, content

    def flush(self) -> tuple[str, str]:
        """Whatever is still held back at the end of the output."""
        held, self._held = self._held, ""
        if self._state == "think":
            return held, ""
        return "", held
