"""Streaming detokenization: the pieces a client receives add up to the full decode and never hold half a character."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.engine.demo_model import write_demo_model
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.text.tokenizer import Tokenizer

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def stories(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return Tokenizer.from_hf_dir(write_demo_model(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module", params=["stories", "demo"])
def tokenizer(request):
    return request.getfixturevalue(request.param)


def stream(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens)
    return [detokenizer.push(i) for i in ids] + [detokenizer.flush()]


def assert_streams_like_full_decode(tokenizer, ids, skip_special_tokens=True):
    pieces = stream(tokenizer, ids, skip_special_tokens)
    full = tokenizer.decode(ids, skip_special_tokens)
    assert "".join(pieces) == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in piece for piece in pieces)


@PROPERTY_SETTINGS
@given(text=st.text(max_size=60))
def test_streamed_text_equals_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    assert_streams_like_full_decode(tokenizer, ids)


@PROPERTY_SETTINGS
@given(data=st.data(), skip_special_tokens=st.booleans())
def test_streamed_random_ids_equal_full_decode(tokenizer, data, skip_special_tokens):
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=40))
    assert_streams_like_full_decode(tokenizer, ids, skip_special_tokens)


@pytest.mark.parametrize("text", ["I saw a 😀 today", "日本", "tail emoji 🎉"])
def test_split_characters_arrive_whole(tokenizer, text):
    ids = tokenizer.encode(text)
    assert len(ids) > len(tokenizer.encode(text.encode("ascii", "ignore").decode()))  # really split into byte tokens
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == text
    for char in (c for c in text if ord(c) > 127):
        assert any(char in piece for piece in pieces)


def test_sentencepiece_leading_space(stories):
    ids = stories.encode("Once upon a time")
    assert stream(stories, ids) == ["", "Once", " upon", " a", " time", ""]
    # A skipped special token in the middle does not make the next word lose its space.
    ids = stories.encode("Once upon") + [2] + stories.encode("a time", add_special_tokens=False)
    assert "".join(stream(stories, ids)) == stories.decode(ids) == "Once upon a time"
    assert "".join(stream(stories, ids, skip_special_tokens=False)) == "<s> Once upon</s> a time"


def test_chat_markers_are_skipped_and_think_markup_kept(demo):
    ids = demo.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi 😀<|im_end|>")
    assert "".join(stream(demo, ids)) == "assistant\n<think>\nhm\n</think>\n\nHi 😀"


def test_each_push_decodes_a_short_window(stories_hf_dir):
    class CountingTokenizer(Tokenizer):
        longest = 0

        def decode(self, ids, skip_special_tokens=True):
            CountingTokenizer.longest = max(CountingTokenizer.longest, len(ids))
            return super().decode(ids, skip_special_tokens)

    counting = CountingTokenizer.from_hf_dir(stories_hf_dir)
    ids = counting.encode("Once upon a time there was a girl who liked 😀 and 日本.\n" * 40)
    full = counting.decode(ids)
    assert len(ids) > 600
    CountingTokenizer.longest = 0
    assert "".join(stream(counting, ids)) == full
    assert CountingTokenizer.longest <= 12
