"""A sequence's text and stop conditions, fed with real stories260K tokens: stop strings are matched across token
boundaries, never leak partially, and each way of ending gives the right finish reason."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.engine.contract.params import GenerationOptions
from inference.engine.sequence import LENGTH, STOP, Sequence
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.text.tokenizer import Tokenizer

STORY = "Lily and Tom went to the park. They saw a big dog. The dog was happy and ran to them."


@pytest.fixture(scope="module")
def tokenizer(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


def make(tokenizer, *, stop=(), stop_token_ids=(), max_tokens=1000, context_window=10_000, prompt=(1,)):
    return Sequence(
        "req",
        list(prompt),
        sampling=None,
        detokenizer=IncrementalDetokenizer(tokenizer),
        options=GenerationOptions(stop=list(stop), stop_token_ids=list(stop_token_ids), max_tokens=max_tokens),
        context_window=context_window,
    )


def feed(seq, ids):
    """Appends tokens until the sequence finishes; returns the text released after each token."""
    pieces = []
    for token_id in ids:
        pieces.append(seq.append_token(token_id))
        if seq.is_finished:
            break
    return pieces


def test_stop_string_spanning_tokens_ends_the_text_before_it(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    # "park" is three tokens ("p", "ar", "k"); the stop string starts inside the first and ends inside the last.
    seq = make(tokenizer, stop=["ark. Th"])
    pieces = feed(seq, ids)
    assert "".join(pieces) == "Lily and Tom went to the p"
    assert seq.finish_reason == STOP
    # It stopped on the token that completed the stop string ("They"), not later.
    assert seq.output_ids == ids[: ids.index(tokenizer.encode("They", add_special_tokens=False)[0]) + 1]


def test_no_partial_stop_string_is_ever_released(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    seq = make(tokenizer, stop=["big dog"])
    released = ""
    for piece in feed(seq, ids):
        released += piece
        # While "big do" is held back, the client must not see "b", "bi", "big", "big ", "big do".
        assert not any(released.endswith("big dog"[:n]) for n in range(1, 8)), released
    assert released == "Lily and Tom went to the park. They saw a "


def test_held_text_is_released_when_the_stop_string_does_not_complete(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    seq = make(tokenizer, stop=["big cat"])
    pieces = feed(seq, ids)
    # "big " waits while it could still become "big cat", then comes out with the next token.
    saw = next(i for i, piece in enumerate(pieces) if "saw" in piece)
    assert "big" not in "".join(pieces[: saw + 2])
    assert "".join(pieces) == tokenizer.decode(ids)
    assert seq.finish_reason is None


def test_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    seq = make(tokenizer, stop=["dog", "Tom went"])
    assert "".join(feed(seq, ids)) == "Lily and "
    assert seq.finish_reason == STOP


def test_stop_token_ends_with_stop_and_its_text_is_not_sent(tokenizer):
    ids = tokenizer.encode("Lily and Tom", add_special_tokens=False) + [tokenizer.eos_token_id, 300, 301]
    seq = make(tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    assert "".join(feed(seq, ids)) == "Lily and Tom"
    assert seq.finish_reason == STOP
    assert seq.output_ids[-1] == tokenizer.eos_token_id  # generated, so counted as a completion token


def test_max_tokens_ends_with_length_and_releases_held_text(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    # After 5 tokens the text ends in "w", a prefix of the stop string "wxyz": held, then released at the end.
    seq = make(tokenizer, stop=["wxyz"], max_tokens=5)
    assert "".join(feed(seq, ids)) == tokenizer.decode(ids[:5])
    assert seq.finish_reason == LENGTH
    assert len(seq.output_ids) == 5


def test_context_window_ends_with_length(tokenizer):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    seq = make(tokenizer, prompt=[1, 2, 3, 4], context_window=10)
    feed(seq, ids)
    assert seq.finish_reason == LENGTH
    assert seq.num_tokens == 10 and len(seq.output_ids) == 6


def test_a_stop_string_at_the_very_end_is_cut_even_on_the_last_token(tokenizer):
    ids = tokenizer.encode("They saw a big dog", add_special_tokens=False)
    seq = make(tokenizer, stop=["dog"], max_tokens=len(ids))
    assert "".join(feed(seq, ids)) == "They saw a big "
    assert seq.finish_reason == STOP


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_output_is_the_text_before_the_first_stop_string(tokenizer, data):
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    full = tokenizer.decode(ids)
    start = data.draw(st.integers(0, len(full) - 1))
    stop = full[start : start + data.draw(st.integers(1, 8))]
    other = data.draw(st.text(alphabet="xyz .", min_size=1, max_size=4))  # in the story now and then
    seq = make(tokenizer, stop=[other, stop])
    # Generation stops at the first token after which some stop string is in the text; the text ends before it.
    text = next(t for t in (tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)) if stop in t or other in t)
    expected = text[: min(i for i in (text.find(stop), text.find(other)) if i >= 0)]
    released = ""
    for piece in feed(seq, ids):
        released += piece
        assert expected.startswith(released)  # nothing is ever sent that the final text would not contain
    assert released == expected
    assert seq.finish_reason == STOP


def test_the_models_end_token_ends_the_text_unless_ignore_eos(tokenizer):
    """The request's options travel whole to the sequence: the model's end-of-sequence token stops it like a
    requested stop token, and with ignore_eos it is just another token, so the text runs on to max_tokens."""
    ids = tokenizer.encode(STORY, add_special_tokens=False)
    eos = ids[5]  # stands in for the model's end-of-sequence token
    for ignore_eos, expected in ((False, ids[:6]), (True, ids[:8])):
        options = GenerationOptions(max_tokens=8, ignore_eos=ignore_eos)
        seq = Sequence("req", [1], sampling=None, detokenizer=IncrementalDetokenizer(tokenizer), options=options,
                       eos_token_ids=[eos], context_window=10_000)  # fmt: skip
        feed(seq, ids)
        assert (seq.output_ids, seq.finish_reason) == (expected, LENGTH if ignore_eos else STOP)
