"""Splitting a think-style model's output into `reasoning_content` and `content`, piece by piece as it streams.

A model whose chat template lets it think writes `<think>…</think>` before its answer. The text inside goes to
`reasoning_content`, the rest to `content`. Only an opening tag at the very start of the output (after whitespace)
opens a think block, unless the template opened it in the prompt (the worker says so in STARTED: `thinking`), in
which case the output starts inside it. Tags split across pieces are held back until they resolve.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


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
                if stripped.startswith(OPEN):
                    self._held, self._state, self._after_tag = stripped[len(OPEN) :], "think", True
                elif OPEN.startswith(stripped):
                    break  # still might be the opening tag
                else:
                    self._state = "answer"
            elif self._state == "think":
                end = self._held.find(CLOSE)
                if end >= 0:
                    reasoning += self._held[:end]
                    self._held, self._state, self._after_tag = self._held[end + len(CLOSE) :], "answer", True
                    continue
                keep = partial_suffix(self._held, CLOSE)
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


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`: text a streaming parser holds
    back, since the next piece may complete the tag (the tool-call parser uses it too)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
