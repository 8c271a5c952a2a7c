"""A sequence's think block, and the reasoning budget that closes it.

Think-style models write their reasoning inside `<think>…</think>` before the answer. Some chat templates open the
block in the prompt (the output starts inside it), others leave the model to open it as its first output. Either
way, once `budget` tokens were written inside the block without the model closing it, the tokens of the closing
text are forced, one per step, so the answer starts (`reasoning_budget`; 0 is no budget). The edge splits the text
into `reasoning_content` and `content` (inference/api/reasoning.py); `Started.thinking` tells it the block was
opened in the prompt.
"""

from __future__ import annotations

from inference.engine.contract.markup import THINK_CLOSE, THINK_OPEN

PROMPT_TAIL_TOKENS = 32  # how much of the prompt's end is decoded to see whether it leaves a think block open


def opens_think(prompt_tail: str) -> bool:
    """Whether text that ends a prompt leaves a think block open."""
    return prompt_tail.rfind(THINK_OPEN) > prompt_tail.rfind(THINK_CLOSE)


class ThinkBlock:
    """Follows one sequence's output through its think block. `forced_token` is the token the next step must emit
    (None: the model chooses); `observe` takes the text each output token released."""

    def __init__(self, *, opened: bool, budget: int, close_ids: list[int]):
        self.state = "open" if opened else "pending"  # pending: the output may still open it; then open, closed
        self.budget = budget
        self.close_ids = close_ids
        self.tokens = 0  # tokens written inside the block
        self._text = ""  # the start of the output while pending, the end of the block's text while open
        self._forcing: list[int] = []

    @property
    def forced_token(self) -> int | None:
        return self._forcing[0] if self._forcing else None

    def observe(self, text: str) -> None:
        if self.state == "closed":
            return
        if self._forcing:
            self._forcing.pop(0)
            if not self._forcing:
                self.state = "closed"
            return
        self._text += text
        if self.state == "pending":
            stripped = self._text.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.state, self._text = "open", stripped[len(THINK_OPEN) :]
            elif not THINK_OPEN.startswith(stripped):
                self.state = "closed"  # the answer started without a think block
            return
        self.tokens += 1
        if THINK_CLOSE in self._text:
            self.state = "closed"
        elif self.budget and self.tokens >= self.budget:
            self._forcing = list(self.close_ids)
        else:
            self._text = self._text[-len(THINK_CLOSE) :]
