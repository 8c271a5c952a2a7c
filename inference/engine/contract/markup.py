"""Markup a model writes into its output that both sides of the process boundary read: the think block's tags (the
worker forces the closing one past a reasoning budget, engine/think_block.py; the edge splits the block off,
api/reasoning.py), and the one helper every streaming reader of markup needs."""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `tag`: text a streaming parser holds
    back, since the next piece may complete the tag (the reasoning splitter and the tool-call parser use it)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
