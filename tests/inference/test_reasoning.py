"""A think-style output split into reasoning and content, whatever the pieces it streams in."""

import pytest

from inference.api.reasoning import ReasoningSplitter


def split(pieces):
    splitter = ReasoningSplitter()
    reasoning, content = "", ""
    for piece in pieces:
        r, c = splitter.push(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


def every_split(text):
    """`text` cut into pieces at every pair of positions, plus one piece per character."""
    yield [text]
    yield list(text)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            yield [text[:i], text[i:j], text[j:]]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nweigh it</think>\n\nThe answer.", ("weigh it", "The answer.")),
        ("  <think>a < b</think>Yes", ("a < b", "Yes")),
        ("No thinking here.", ("", "No thinking here.")),
        ("Text with <think>inside</think> stays content", ("", "Text with <think>inside</think> stays content")),
        ("<think>never closed", ("never closed", "")),
        ("<thin", ("", "<thin")),
        ("", ("", "")),
    ],
)
def test_split_is_independent_of_piece_boundaries(text, expected):
    for pieces in every_split(text):
        assert split(pieces) == expected, pieces
