"""Text <-> token ids for a loaded model, from a Hugging Face directory or from a GGUF file's embedded vocabulary.

Both sources end up as one `tokenizers.Tokenizer`, so encoding and decoding behave the same whichever file a model
came from. A GGUF vocabulary is rebuilt from the library's parts: SentencePiece (`llama`) as BPE with byte fallback
and merges derived from the piece scores, GPT-2 style (`gpt2`) as byte-level BPE with the file's merges.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from inference.engine.errors import LoadError

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class Tokenizer:
    """A model's tokenizer: encode/decode through `tokenizers`, plus what serving needs around it.

    `add_bos` says whether `encode(text)` prepends BOS; chat prompts rendered by a template that writes the BOS
    itself must be encoded with `add_special_tokens=False`.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        chat_templates: dict[str, str] | None = None,
    ):
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = backend.token_to_id(eos_token) if eos_token else None
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        # Named templates (tokenizer_config may carry several, e.g. "default" and "tool_use"); `chat_template` is
        # the one a plain chat request uses.
        self.chat_templates = dict(chat_templates or {})
        self.chat_template = self.chat_templates.get("default")
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        self._added_ids = frozenset(added)
        self._byte_level = b'"ByteLevel"' in (backend.decoder.__getstate__() if backend.decoder else b"")
        self._byte_pieces = _byte_piece_ids(backend)
        self._alone: dict[tuple[int, bool], str] = {}  # decode_alone's answers, at most one per token and flag
        with_specials = backend.encode("", add_special_tokens=True).ids
        self.add_bos = self.bos_token_id is not None and with_specials[:1] == [self.bos_token_id]

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> Tokenizer:
        """Reads `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json` and `chat_template.jinja`."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise LoadError(path, "no tokenizer.json (only tokenizers-library tokenizers are supported)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the library raises a bare Exception for malformed files
            raise LoadError(tokenizer_file, f"cannot read tokenizer: {exc}") from exc
        config = _read_json(path / "tokenizer_config.json")
        special_map = _read_json(path / "special_tokens_map.json")
        bos = _token_content(config.get("bos_token", special_map.get("bos_token")))
        eos = _token_content(config.get("eos_token", special_map.get("eos_token")))
        named = [_token_content(config.get(k, special_map.get(k))) for k in ("bos_token", "eos_token", "unk_token")]
        added = {token.content for token in backend.get_added_tokens_decoder().values()}
        missing = [t for t in dict.fromkeys(named) if t and t not in added]
        if missing:
            # transformers treats the tokens tokenizer_config names as special even when tokenizer.json does not.
            backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
        # tokenizer.json's post-processor alone decides whether BOS/EOS are added; transformers 5 ignores
        # tokenizer_config's add_bos_token/add_eos_token for tokenizers-library tokenizers, and so do we.
        return cls(backend, bos_token=bos, eos_token=eos, chat_templates=_hf_chat_templates(path, config))

    @classmethod
    def from_gguf(cls, reader: Any, path: str | Path) -> Tokenizer:
        """Builds the tokenizer from a GGUF file's `tokenizer.*` metadata (reader is a `gguf.GGUFReader`)."""
        backend, tokens = _gguf_backend(reader, path)
        kind = _gguf_field(reader, "tokenizer.ggml.model")

        def token_at(key: str) -> str | None:
            index = _gguf_field(reader, key)
            return tokens[index] if index is not None and 0 <= index < len(tokens) else None

        bos, eos = token_at("tokenizer.ggml.bos_token_id"), token_at("tokenizer.ggml.eos_token_id")
        add_bos = _gguf_field(reader, "tokenizer.ggml.add_bos_token", kind == "llama")
        add_eos = _gguf_field(reader, "tokenizer.ggml.add_eos_token", False)
        backend.post_processor = _bos_eos_processor(backend, bos if add_bos else None, eos if add_eos else None)
        templates = {}
        if (default := _gguf_field(reader, "tokenizer.chat_template")) is not None:
            templates["default"] = default
        for name in _gguf_field(reader, "tokenizer.chat_templates", []):
            if (source := _gguf_field(reader, f"tokenizer.chat_template.{name}")) is not None:
                templates[name] = source
        return cls(backend, bos_token=bos, eos_token=eos, chat_templates=templates)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch rather than encode: only the batch call releases the GIL, so a long prompt tokenized on a
        # worker's preparation thread does not stall the step loop and its heartbeats.
        return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token stands for: a text of n bytes cannot become fewer than
        n / max_token_bytes tokens, which bounds a prompt's length before it is tokenized."""
        ids = self.backend.get_vocab(with_added_tokens=True).values()
        return max(1, *(len(self.token_bytes(i)) for i in ids))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_alone(self, token_id: int, skip_special_tokens: bool = True) -> str:
        """`decode([token_id])`, remembered: the streaming detokenizer asks for it after nearly every token."""
        key = (token_id, skip_special_tokens)
        text = self._alone.get(key)
        if text is None:
            text = self._alone[key] = self.decode([token_id], skip_special_tokens)
        return text

    def is_special(self, token_id: int) -> bool:
        """True for special tokens (BOS, EOS, `<|im_end|>`...), which `decode` drops with skip_special_tokens."""
        return token_id in self._special_ids

    def is_added_token(self, text: str) -> bool:
        """Whether `text` is one added token (markup such as `<tool_call>`), which grammars must name as a token."""
        token_id = self.backend.token_to_id(text)
        return token_id is not None and token_id in self._added_ids

    def is_byte_piece(self, token_id: int) -> bool:
        """True for a byte-fallback token (`<0xNN>`): its text depends on the byte tokens around it."""
        return token_id in self._byte_pieces

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for, e.g. b" Once" for `▁Once`, b"\\xe6" for `<0xE6>`."""
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            raise IndexError(f"token id {token_id} is outside the vocabulary of {self.vocab_size}")
        if token_id in self._added_ids:
            return piece.encode()
        if self._byte_level:
            return bytes(_BYTE_LEVEL_DECODE[ch] for ch in piece)
        if token_id in self._byte_pieces:
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte is shown as a printable character; this maps them back."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


_BYTE_LEVEL_DECODE = _byte_level_alphabet()


def _byte_piece_ids(backend: tokenizers.Tokenizer) -> frozenset[int]:
    if not getattr(backend.model, "byte_fallback", False):
        return frozenset()
    return frozenset(
        i for piece, i in backend.get_vocab(with_added_tokens=False).items() if _BYTE_PIECE.fullmatch(piece)
    )


def _bos_eos_processor(backend: tokenizers.Tokenizer, bos: str | None, eos: str | None) -> processors.PostProcessor:
    """A post-processor that adds BOS and/or EOS around the text (and nothing when both are None)."""
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join([single, *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])])
    specials = [(t, backend.token_to_id(t)) for t in dict.fromkeys(t for t in (bos, eos) if t)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadError(path, f"cannot read JSON: {exc}") from exc


def _token_content(value: Any) -> str | None:
    """tokenizer_config writes special tokens as plain strings or as AddedToken dicts with a `content` key."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _hf_chat_templates(path: Path, config: dict[str, Any]) -> dict[str, str]:
    """`chat_template.jinja` overrides tokenizer_config's `chat_template`, which is a string or a named list."""
    raw = config.get("chat_template")
    if isinstance(raw, list):
        templates = {entry["name"]: entry["template"] for entry in raw}
    elif isinstance(raw, str):
        templates = {"default": raw}
    else:
        templates = {}
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        templates["default"] = jinja_file.read_text(encoding="utf-8")
    return templates


# GGUF token types (llama.cpp's `llama_token_type`).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

# `tokenizer.ggml.pre` -> the split regex of that byte-level BPE family (None: GPT-2's, built into ByteLevel).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_BPE_PRE_SPLITS = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gguf_backend(reader: Any, path: str | Path) -> tuple[tokenizers.Tokenizer, list[str]]:
    """The `tokenizers.Tokenizer` for a GGUF vocabulary, and the token strings by id."""
    kind = _gguf_field(reader, "tokenizer.ggml.model")
    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise LoadError(path, "the file has no tokenizer vocabulary (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    types = _gguf_field(reader, "tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise LoadError(path, f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    if kind == "llama":
        scores = _gguf_field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
        add_space_prefix = _gguf_field(reader, "tokenizer.ggml.add_space_prefix", True)
        unk = _gguf_field(reader, "tokenizer.ggml.unknown_token_id")
        backend = _sentencepiece_backend(
            tokens, scores, types, add_space_prefix, tokens[unk] if unk is not None else None
        )
    elif kind == "gpt2":
        merges = _gguf_field(reader, "tokenizer.ggml.merges")
        if not merges:
            raise LoadError(path, "a gpt2 (byte-level BPE) vocabulary needs tokenizer.ggml.merges")
        pre = _gguf_field(reader, "tokenizer.ggml.pre", "default")
        if pre not in _BPE_PRE_SPLITS:
            raise LoadError(path, f"unsupported tokenizer.ggml.pre {pre!r}; supported: {', '.join(_BPE_PRE_SPLITS)}")
        backend = _byte_level_backend(tokens, merges, _BPE_PRE_SPLITS[pre], ignore_merges=pre.startswith("llama"))
    else:
        raise LoadError(path, f"unsupported tokenizer.ggml.model {kind!r}; supported: llama, gpt2")
    backend.add_tokens(
        [
            AddedToken(t, special=ty in (_UNKNOWN, _CONTROL), normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty in (_UNKNOWN, _CONTROL, _USER_DEFINED)
        ]
    )
    return backend, tokens


def _sentencepiece_backend(
    tokens: list[str], scores: list[float], types: list[int], add_space_prefix: bool, unk: str | None
) -> tokenizers.Tokenizer:
    """SentencePiece as BPE: merging the pair whose joined piece scores highest, bytes for anything unknown.

    Every split of a normal piece into two pieces of the vocabulary is a merge, ranked by the joined piece's score,
    which is how SentencePiece picks the next merge (ties: the shorter left part first, as transformers orders them).
    """
    vocab = {piece: i for i, piece in enumerate(tokens)}
    mergeable = {piece for piece, ty in zip(tokens, types, strict=True) if ty in (_NORMAL, _USER_DEFINED)}
    ranked = []
    for piece in mergeable:
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-scores[vocab[piece]], vocab[piece], cut, left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    byte_fallback = _BYTE in types
    backend = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=byte_fallback))
    spaces = [normalizers.Replace(" ", "\u2581")]
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), *spaces] if add_space_prefix else spaces)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if add_space_prefix else steps)
    return backend


def _byte_level_backend(
    tokens: list[str], merges: list[str], split: str | None, ignore_merges: bool
) -> tokenizers.Tokenizer:
    """GPT-2 style BPE over bytes shown as printable characters, after the family's regex split."""
    vocab = {piece: i for i, piece in enumerate(tokens)}
    pairs = [tuple(merge.split(" ", 1)) for merge in merges]
    backend = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=ignore_merges))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend
