"""Tokenizer: stories260K from its HF directory and from its GGUF, and the demo model's byte-level BPE,
checked against transformers' AutoTokenizer and the reference ids in the test models' README."""

import json
import shutil
from pathlib import Path

import gguf
import pytest
from transformers import AutoTokenizer

from inference.engine.demo_model import write_demo_model
from inference.engine.errors import LoadError
from inference.engine.text.tokenizer import Tokenizer

ROUND_TRIP_TEXTS = [
    "Once upon a time, there was a little cat.",
    "line one\nline two\n\n\nafter blank lines\n",
    "digits 0123456789, 3.14159 and 2024-05-17",
    "emoji 😀👍🏽 and a family 👩\u200d👩\u200d👧",
    "日本語のテキストと中文，한국어",
    "  leading spaces, trailing spaces  ",
    "tab\there\r\nwindows line end",
    "Ünïcödé ñ ß ø",
]

# From /work/shared/models/README.md ("Reference values for developers"), add_special_tokens=True.
STORIES_REFERENCE_IDS = {
    "Once upon a time": [1, 403, 407, 261, 378],
    "Hello world": [1, 346, 306, 414, 263, 304, 341],
    "": [1],
    "\n": [1, 410, 13],
    " ": [1, 410, 410],
    "2024": [1, 410, 479, 477, 479, 484],
    "é": [1, 410, 485],
    "日": [1, 410, 233, 154, 168],
}


@pytest.fixture(scope="module")
def stories_hf(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


@pytest.fixture(scope="module")
def stories_gguf(stories_gguf_path):
    return Tokenizer.from_gguf(gguf.GGUFReader(stories_gguf_path), stories_gguf_path)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def demo(demo_dir):
    return Tokenizer.from_hf_dir(demo_dir)


@pytest.fixture(params=["stories_hf", "stories_gguf", "demo"])
def any_tokenizer(request):
    return request.getfixturevalue(request.param)


def write_vocab_gguf(path: Path, kind: str | None, tokens: list[str] | None, **extra) -> gguf.GGUFReader:
    """A GGUF file holding only tokenizer metadata (no tensors)."""
    writer = gguf.GGUFWriter(path, arch="llama")
    if kind is not None:
        writer.add_tokenizer_model(kind)
    if tokens is not None:
        writer.add_token_list(tokens)
    if "types" in extra:
        writer.add_token_types(extra["types"])
    if "merges" in extra:
        writer.add_token_merges(extra["merges"])
    if "pre" in extra:
        writer.add_tokenizer_pre(extra["pre"])
    if "eos" in extra:
        writer.add_eos_token_id(extra["eos"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(path)


def demo_as_gguf(demo: Tokenizer, demo_dir: Path, path: Path, pre: str) -> gguf.GGUFReader:
    """The demo tokenizer's vocabulary and merges written the way a gpt2-type GGUF stores them."""
    tokens = [demo.backend.id_to_token(i) for i in range(demo.vocab_size)]
    added = demo.backend.get_added_tokens_decoder()
    types = [(3 if added[i].special else 4) if i in added else 1 for i in range(len(tokens))]
    merges = [" ".join(m) for m in json.loads((demo_dir / "tokenizer.json").read_text())["model"]["merges"]]
    return write_vocab_gguf(path, "gpt2", tokens, types=types, merges=merges, pre=pre, eos=demo.eos_token_id)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(any_tokenizer, text):
    ids = any_tokenizer.encode(text)
    assert any_tokenizer.decode(ids) == text
    assert any_tokenizer.decode(any_tokenizer.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("source", ["stories_hf", "stories_gguf"])
def test_stories_reference_ids(request, source):
    tokenizer = request.getfixturevalue(source)
    for text, ids in STORIES_REFERENCE_IDS.items():
        assert tokenizer.encode(text) == ids, text


def test_stories_hf_gguf_and_transformers_agree(stories_hf, stories_gguf, stories_hf_dir):
    reference = AutoTokenizer.from_pretrained(stories_hf_dir)
    texts = [*ROUND_TRIP_TEXTS, "The <s> and </s> markers", "Lily said, \"Let's play!\" 'Okay,' said Tom."]
    for text in texts:
        expected = reference(text).input_ids
        assert stories_hf.encode(text) == expected, text
        assert stories_gguf.encode(text) == expected, text
        bare = reference(text, add_special_tokens=False).input_ids
        assert stories_gguf.encode(text, add_special_tokens=False) == bare, text
        assert stories_gguf.decode(expected) == reference.decode(expected, skip_special_tokens=True)
        assert stories_gguf.decode(expected, False) == reference.decode(expected, skip_special_tokens=False)


def test_stories_special_tokens_and_metadata(stories_hf, stories_gguf):
    for tokenizer in (stories_hf, stories_gguf):
        assert (tokenizer.bos_token, tokenizer.bos_token_id, tokenizer.eos_token, tokenizer.eos_token_id) == (
            "<s>",
            1,
            "</s>",
            2,
        )
        assert tokenizer.add_bos and tokenizer.vocab_size == 512
        assert tokenizer.is_special(1) and tokenizer.is_special(2) and not tokenizer.is_special(403)
        assert tokenizer.chat_template.startswith("{{ bos_token }}")


def test_byte_fallback_token_bytes(stories_gguf, stories_hf):
    # "日" is not in the vocabulary: it becomes its three UTF-8 bytes, id = byte + 3.
    assert stories_gguf.encode("日", add_special_tokens=False) == [410, 0xE6 + 3, 0x97 + 3, 0xA5 + 3]
    for tokenizer in (stories_hf, stories_gguf):
        assert tokenizer.token_bytes(403) == b" Once"
        assert tokenizer.token_bytes(0xE6 + 3) == b"\xe6"
        for text in ROUND_TRIP_TEXTS:
            ids = tokenizer.encode(text, add_special_tokens=False)
            # SentencePiece's dummy prefix: the pieces stand for the text after one added space.
            assert b"".join(tokenizer.token_bytes(i) for i in ids) == (" " + text).encode()


def test_demo_tokenizer_matches_transformers(demo, demo_dir):
    reference = AutoTokenizer.from_pretrained(demo_dir)
    for text in [*ROUND_TRIP_TEXTS, "<|im_start|>user\nhi<|im_end|>\n<think>\nhmm\n</think>\n\n<tool_call>"]:
        ids = demo.encode(text)
        assert ids == reference(text).input_ids, text
        assert demo.decode(ids) == reference.decode(ids, skip_special_tokens=True)
        assert b"".join(demo.token_bytes(i) for i in ids) == text.encode()


def test_demo_special_tokens(demo):
    assert demo.eos_token == "<|im_end|>" and demo.bos_token is None and demo.bos_token_id is None
    assert not demo.add_bos and demo.encode("hi") == demo.encode("hi", add_special_tokens=False)
    ids = demo.encode("<|im_start|>assistant\n<think>x</think>y<|im_end|>")
    assert ids[0] == demo.backend.token_to_id("<|im_start|>") and ids[-1] == demo.eos_token_id
    # Chat markers are dropped from decoded text; <think> markup is text the API parses, so it stays.
    assert demo.decode(ids) == "assistant\n<think>x</think>y"
    assert demo.is_special(demo.eos_token_id) and not demo.is_special(demo.backend.token_to_id("<think>"))
    assert demo.backend.token_to_id("<tool_call>") is not None and len(demo.encode("</tool_call>")) == 1


def test_gpt2_gguf_vocab_matches_tokenizer_json(demo, demo_dir, tmp_path):
    path = tmp_path / "demo-vocab.gguf"
    from_gguf = Tokenizer.from_gguf(demo_as_gguf(demo, demo_dir, path, "gpt2"), path)
    assert from_gguf.eos_token == "<|im_end|>" and not from_gguf.add_bos
    for text in [*ROUND_TRIP_TEXTS, "<|im_start|>user\n<think>x</think><|im_end|> don't 12345"]:
        assert from_gguf.encode(text) == demo.encode(text), text
        assert from_gguf.decode(demo.encode(text), False) == text
    assert from_gguf.is_special(demo.eos_token_id) and not from_gguf.is_special(demo.backend.token_to_id("<think>"))


def test_gguf_pre_tokenizer_families_split_digits_differently(demo, demo_dir, tmp_path):
    def digit_pieces(pre):
        path = tmp_path / f"{pre}.gguf"
        tokenizer = Tokenizer.from_gguf(demo_as_gguf(demo, demo_dir, path, pre), path)
        return [tokenizer.decode([i]) for i in tokenizer.encode("12345")]

    assert digit_pieces("qwen2") == ["1", "2", "3", "4", "5"]  # Qwen2: one digit per pre-token
    assert "".join(digit_pieces("llama-bpe")) == "12345" and len(digit_pieces("llama-bpe")[0]) <= 3


def test_gguf_without_vocabulary_is_refused(tmp_path):
    path = tmp_path / "no-vocab.gguf"
    with pytest.raises(LoadError, match="no tokenizer vocabulary") as info:
        Tokenizer.from_gguf(write_vocab_gguf(path, None, None), path)
    assert str(path) in str(info.value)


def test_gguf_unsupported_tokenizer_model_is_refused(tmp_path):
    path = tmp_path / "bert.gguf"
    with pytest.raises(LoadError, match="unsupported tokenizer.ggml.model 'bert'"):
        Tokenizer.from_gguf(write_vocab_gguf(path, "bert", ["[PAD]", "a"]), path)


def test_gguf_unknown_pre_tokenizer_is_refused(demo, demo_dir, tmp_path):
    path = tmp_path / "odd-pre.gguf"
    with pytest.raises(LoadError, match="unsupported tokenizer.ggml.pre 'made-up'"):
        Tokenizer.from_gguf(demo_as_gguf(demo, demo_dir, path, "made-up"), path)


def test_gguf_gpt2_without_merges_is_refused(tmp_path):
    path = tmp_path / "no-merges.gguf"
    with pytest.raises(LoadError, match="merges"):
        Tokenizer.from_gguf(write_vocab_gguf(path, "gpt2", ["a", "b"]), path)


def test_hf_dir_without_tokenizer_json_is_refused(tmp_path):
    with pytest.raises(LoadError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)


def test_named_chat_templates_and_jinja_file(stories_hf_dir, tmp_path):
    model_dir = tmp_path / "stories"
    shutil.copytree(stories_hf_dir, model_dir)
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = [{"name": "default", "template": "A{{ x }}"}, {"name": "tool_use", "template": "B"}]
    config_path.write_text(json.dumps(config))
    tokenizer = Tokenizer.from_hf_dir(model_dir)
    assert tokenizer.chat_template == "A{{ x }}" and tokenizer.chat_templates["tool_use"] == "B"

    (model_dir / "chat_template.jinja").write_text("from the jinja file")
    assert Tokenizer.from_hf_dir(model_dir).chat_template == "from the jinja file"
    assert AutoTokenizer.from_pretrained(model_dir).chat_template == "from the jinja file"


def test_tokenizer_json_post_processor_decides_bos(stories_hf_dir, tmp_path):
    model_dir = tmp_path / "stories"
    shutil.copytree(stories_hf_dir, model_dir)
    tokenizer_path = model_dir / "tokenizer.json"
    tokenizer_path.write_text(json.dumps({**json.loads(tokenizer_path.read_text()), "post_processor": None}))
    tokenizer = Tokenizer.from_hf_dir(model_dir)  # tokenizer_config still says add_bos_token: true
    assert not tokenizer.add_bos
    assert (
        tokenizer.encode("Once upon a time") == AutoTokenizer.from_pretrained(model_dir)("Once upon a time").input_ids
    )


def test_a_token_decoded_alone_is_remembered_per_flag(any_tokenizer):
    """decode_alone answers what decode([token]) answers, for special tokens with and without skipping them, in any
    order of asking (the streaming detokenizer asks after nearly every token)."""
    ordinary = any_tokenizer.encode("Once upon a time", add_special_tokens=False)[-1]
    for token in (any_tokenizer.eos_token_id, ordinary):
        for skip in (False, True, False, True):
            assert any_tokenizer.decode_alone(token, skip) == any_tokenizer.decode([token], skip)
    assert any_tokenizer.decode_alone(any_tokenizer.eos_token_id, False) != ""
