"""Compare grammar engines (xgrammar vs llguidance) for JSON-schema constrained decoding on CPU.

What it measures, for one engine per run (each engine lives in its own scratch venv):

* ``timing``: tokenizer-wrapper construction, JSON-schema grammar compilation (first and second/cached), then a
  batch of ``--batch`` matchers driven for ``--steps`` steps. Every step fills the ``[batch, ceil(V/32)]`` int32
  token bitmask for all matchers with the engine's batched/parallel fill, applies it to a ``[batch, V]`` float32
  logits tensor with the engine's torch helper, and makes each matcher consume one allowed token. Reported:
  median and p99 of mask-fill microseconds per token per sequence (batch fill time / batch), consume microseconds
  per token per sequence, and apply microseconds per batch step.
* ``coverage``: for each JSON Schema keyword, whether the engine compiles a schema using it (and with which
  warnings or error), whether a hand-written valid instance is accepted and a violating one rejected, and
  whether randomly generated outputs validate with the ``jsonschema`` package.
* ``quirks``: EOS handling, bitmask width vs. tokenizer size, default whitespace, GIL release.

Timing runs use ``--threads 2`` engine workers (LLExecutor / BatchGrammarMatcher), ``torch.set_num_threads(1)``
(``--torch-threads``; with 2 torch threads on 2 vCPUs the apply p99 jumps to ~16 ms from thread contention) and pool
``--repeat 3`` runs with seeds ``seed..seed+2``. The engines follow different random paths (their masks differ), so
per-schema numbers compare distributions of states, not identical token sequences.

Token choice policy (deterministic, ``--seed``): after the fill, the allowed set of each sequence is read back
from the bitmask. For the first ``grow`` tokens of a document (``grow`` drawn uniformly in [8, 48]) a token is
drawn uniformly from the allowed non-EOS tokens, preferring tokens that are not whitespace-only. After that the
sequence tries to finish: EOS if allowed, else a token made only of closing characters (``"``, ``]``, ``}``,
whitespace), else a token containing ``,``/``:``/``"``, else any non-whitespace allowed token. A document that
ends (EOS consumed or matcher stopped) is decoded, kept for validation, and its matcher is reset, so the batch
stays full for every step. A document still open after ``--max-doc-tokens`` is reset and counted as unfinished.

The vocabularies: the 512-token test model tokenizer (``/work/shared/models/stories260K-hf``) and byte-level BPE
tokenizers of ~32k/~128k tokens trained with ``tokenizers`` on site-packages ``.py`` files (``--build-tokenizer``).

Run (each engine in its own venv; ``tokenizers`` is only needed for ``--build-tokenizer``)::

    python3 -m venv /tmp/venv-llg && /tmp/venv-llg/bin/pip install llguidance torch==2.13.0 jsonschema rfc3339-validator
    python3 -m venv /tmp/venv-xgr && /tmp/venv-xgr/bin/pip install torch==2.13.0  # CPU wheel from the local mirror
    /tmp/venv-xgr/bin/pip install xgrammar jsonschema rfc3339-validator
    .venv/bin/python bench/grammar_engines.py --build-tokenizer 32000 --out /tmp/ge/bpe32k/tokenizer.json
    .venv/bin/python bench/grammar_engines.py --build-tokenizer 128000 --out /tmp/ge/bpe128k/tokenizer.json
    /tmp/venv-llg/bin/python bench/grammar_engines.py --engine llguidance --section timing \\
        --tokenizer /work/shared/models/stories260K-hf/tokenizer.json \\
        --tokenizer /tmp/ge/bpe32k/tokenizer.json --tokenizer /tmp/ge/bpe128k/tokenizer.json
    /tmp/venv-xgr/bin/python bench/grammar_engines.py --engine xgrammar --section timing ...
    /tmp/venv-llg/bin/python bench/grammar_engines.py --engine llguidance --section coverage \\
        --tokenizer /tmp/ge/bpe32k/tokenizer.json
    /tmp/venv-llg/bin/python bench/grammar_engines.py --engine llguidance --section quirks \\
        --tokenizer /tmp/ge/bpe32k/tokenizer.json

Each section prints one JSON line per row and, with ``--json-out``, writes them all to a file. Results and the decision
are in docs/grammar-engine.md. The engines are imported inside functions, so this module imports without them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EOS_TEXT = "<|endoftext|>"
SITE_PACKAGES = "/work/main/.venv/lib/python3.11/site-packages"


# --------------------------------------------------------------------------------------------------------------
# Tokenizers


def build_tokenizer(vocab_size: int, out: str, corpus_root: str = SITE_PACKAGES, corpus_mb: float = 24.0) -> None:
    """Train a byte-level BPE tokenizer (EOS ``<|endoftext|>`` = id 0) on .py files and save tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files, total = [], 0
    for path in sorted(Path(corpus_root).rglob("*.py")):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        files.append(str(path))
        total += size
        if total >= corpus_mb * 1e6:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tok.save(out)
    print(f"trained {tok.get_vocab_size()} tokens on {len(files)} files / {total / 1e6:.1f} MB -> {out}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte <-> printable unicode map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@dataclass
class Vocab:
    """Engine-independent view of a tokenizer.json: token strings, raw bytes, EOS, kind."""

    path: str
    json_str: str
    kind: str  # "byte_level" or "byte_fallback"
    tokens: list[str]  # encoded form, as in tokenizer.json, index = token id
    token_bytes: list[bytes]
    eos: int
    special: set[int] = field(default_factory=set)

    @property
    def size(self) -> int:
        return len(self.tokens)

    def decode(self, ids: list[int]) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids if i not in self.special)


def load_vocab(path: str) -> Vocab:
    text = Path(path).read_text()
    spec = json.loads(text)
    id_to_tok: dict[int, str] = {i: t for t, i in spec["model"]["vocab"].items()}
    special = set()
    for added in spec.get("added_tokens", []):
        id_to_tok[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    n = max(id_to_tok) + 1
    tokens = [id_to_tok.get(i, f"<unused{i}>") for i in range(n)]
    byte_fallback = bool(spec["model"].get("byte_fallback"))
    if byte_fallback:
        kind = "byte_fallback"
        token_bytes = []
        for i, t in enumerate(tokens):
            if i in special:
                token_bytes.append(b"")
            elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                token_bytes.append(bytes([int(t[3:5], 16)]))
            else:
                token_bytes.append(t.replace("\u2581", " ").encode())
        eos = next((i for i, t in enumerate(tokens) if t == "</s>"), 2)
    else:
        kind = "byte_level"
        inv = {c: b for b, c in _bytes_to_unicode().items()}
        token_bytes = [b"" if i in special else bytes(inv[c] for c in t) for i, t in enumerate(tokens)]
        eos = next(i for i, t in enumerate(tokens) if t == EOS_TEXT)
    return Vocab(path, text, kind, tokens, token_bytes, eos, special)


# --------------------------------------------------------------------------------------------------------------
# Engine adapters (same small interface for both engines)


class CompileError(Exception):
    pass


def _capture_fd2(fn):
    """Run fn() while capturing what C/C++ code writes to file descriptor 2; returns (result, captured text)."""
    import tempfile

    with tempfile.TemporaryFile(mode="w+b") as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        return result, tmp.read().decode(errors="replace").strip()


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, vocab: Vocab, n_vocab: int | None = None, threads: int = 2, options: dict | None = None):
        import llguidance
        import llguidance.torch

        self.lib, self.lt = llguidance, llguidance.torch
        self.vocab = vocab
        self.n_vocab = n_vocab or vocab.size
        t0 = time.perf_counter()
        self.tok = llguidance.LLTokenizer(vocab.json_str, n_vocab=self.n_vocab, eos_token=vocab.eos)
        self.tokenizer_s = time.perf_counter() - t0
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self.options = options

    def version(self) -> str:
        return self.lib.__version__

    def compile(self, schema: dict) -> tuple[Any, list[str]]:
        """Returns (template matcher, warnings). Raises CompileError with the engine's message."""
        LLMatcher = self.lib.LLMatcher
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=self.options)
        matcher = LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise CompileError(matcher.get_error())
        return matcher, list(matcher.get_grammar_warnings())

    def validate(self, schema: dict, options: dict | None = None) -> tuple[bool, list[str]]:
        LLMatcher = self.lib.LLMatcher
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=options or self.options)
        return LLMatcher.validate_grammar_with_warnings(grammar, self.tok)

    def matcher(self, compiled):
        return compiled.deep_copy()

    def allocate(self, batch: int, width: int):
        return self.lt.allocate_token_bitmask(batch, width)

    def fill(self, matchers, bitmask) -> None:
        self.lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def fill_one(self, matcher, bitmask, index: int = 0) -> None:
        self.lt.fill_next_token_bitmask(matcher, bitmask, index)

    def apply(self, logits, bitmask) -> None:
        self.lt.apply_token_bitmask_inplace(logits, bitmask)

    def consume(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def finished(self, matcher) -> bool:
        return matcher.is_stopped()

    def error(self, matcher) -> str:
        return matcher.get_error()

    def reset(self, matcher) -> None:
        matcher.reset()

    def accepts(self, compiled, text: str) -> bool:
        """Does the grammar accept exactly this text followed by EOS?"""
        m = compiled.deep_copy()
        ids = self.tok.tokenize_bytes(text.encode())
        return m.consume_tokens(ids) and m.is_accepting() and m.consume_token(self.vocab.eos) and not m.is_error()


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, vocab: Vocab, n_vocab: int | None = None, threads: int = 2, options: dict | None = None):
        import xgrammar

        self.lib = xgrammar
        self.vocab = vocab
        self.n_vocab = n_vocab or vocab.size
        vocab_type = xgrammar.VocabType.BYTE_LEVEL if vocab.kind == "byte_level" else xgrammar.VocabType.BYTE_FALLBACK
        # Special tokens are given as "" so that xgrammar never allows them inside JSON text (as HF does).
        encoded = ["" if i in vocab.special else t for i, t in enumerate(vocab.tokens)]
        t0 = time.perf_counter()
        self.info = xgrammar.TokenizerInfo(
            encoded,
            vocab_type,
            vocab_size=self.n_vocab,
            stop_token_ids=[vocab.eos],
            add_prefix_space=vocab.kind == "byte_fallback",
        )
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=threads)
        self.tokenizer_s = time.perf_counter() - t0
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=threads)
        self.options = options or {}

    def version(self) -> str:
        from importlib.metadata import version

        return version("xgrammar")

    def compile(self, schema: dict) -> tuple[Any, list[str]]:
        def run():
            try:
                return self.compiler.compile_json_schema(json.dumps(schema), **self.options), None
            except Exception as e:  # noqa: BLE001 - we report whatever the engine raises
                return None, e

        (compiled, exc), stderr = _capture_fd2(run)
        if exc is not None:
            raise CompileError(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        return compiled, [stderr] if stderr else []

    def validate(self, schema: dict, options: dict | None = None) -> tuple[bool, list[str]]:
        try:
            return False, self.compile(schema)[1]
        except CompileError as e:
            return True, [str(e)]

    def matcher(self, compiled):
        return self.lib.GrammarMatcher(compiled)

    def allocate(self, batch: int, width: int):
        return self.lib.allocate_token_bitmask(batch, width)

    def fill(self, matchers, bitmask) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def fill_one(self, matcher, bitmask, index: int = 0) -> None:
        matcher.fill_next_token_bitmask(bitmask, index)

    def apply(self, logits, bitmask) -> None:
        self.lib.apply_token_bitmask_inplace(logits, bitmask)

    def consume(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def finished(self, matcher) -> bool:
        return matcher.is_terminated()

    def error(self, matcher) -> str:
        return "token rejected"

    def reset(self, matcher) -> None:
        matcher.reset()

    def accepts(self, compiled, text: str) -> bool:
        m = self.lib.GrammarMatcher(compiled)
        _, _ = _capture_fd2(lambda: None)
        ok, _ = _capture_fd2(lambda: m.accept_string(text))
        return bool(ok) and m.accept_token(self.vocab.eos) and m.is_terminated()


ENGINES = {"llguidance": LLGuidanceEngine, "xgrammar": XGrammarEngine}


# --------------------------------------------------------------------------------------------------------------
# Schemas

TIMING_SCHEMAS: dict[str, dict] = {
    "any_object": {"type": "object"},
    "order_nested": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
            "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 40},
                    "tier": {"enum": ["free", "pro", "enterprise"]},
                },
                "required": ["name", "tier"],
                "additionalProperties": False,
            },
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 5,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 100},
                        "price": {"type": "number", "minimum": 0, "maximum": 10000},
                    },
                    "required": ["sku", "qty", "price"],
                    "additionalProperties": False,
                },
            },
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        },
        "required": ["id", "status", "customer", "items"],
        "additionalProperties": False,
    },
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"enum": ["search", "calculator", "weather"]},
            "arguments": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["query"],
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "bounded_flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 32},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "phone": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"},
        },
        "required": ["name", "age", "score"],
        "additionalProperties": False,
    },
}

_OBJ_A = {"type": "object", "properties": {"a": {"type": "integer"}}}

# keyword -> (schema, valid instances, invalid instances); instances are JSON texts (compact).
COVERAGE: list[tuple[str, dict, list[str], list[str]]] = [
    ("type", {"type": "integer"}, ["42"], ['"x"', "4.5"]),
    ("string: raw control char refused", {"type": "string"}, ['"ab"'], ['"a\x10b"']),
    (
        "string+maxLength: raw control char refused",
        {"type": "string", "maxLength": 4},
        ['"ab"'],
        ['"a\x10b"', '"\x17"'],
    ),
    ("properties", {**_OBJ_A, "additionalProperties": False}, ['{"a":1}'], ['{"a":"x"}']),
    (
        "required",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a", "b"],
        },
        ['{"a":1,"b":"x"}'],
        ['{"a":1}'],
    ),
    ("additionalProperties: false", {**_OBJ_A, "additionalProperties": False}, ['{"a":1}'], ['{"a":1,"z":2}']),
    ("additionalProperties: absent (default true)", _OBJ_A, ['{"a":1,"z":2}'], ['{"a":"x"}']),
    (
        "additionalProperties: schema",
        {**_OBJ_A, "additionalProperties": {"type": "string"}},
        ['{"z":"s"}'],
        ['{"z":2}'],
    ),
    ("items", {"type": "array", "items": {"type": "integer"}}, ["[1,2]"], ['[1,"x"]']),
    (
        "prefixItems",
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        ['[1,"a"]'],
        ['["a",1]', '[1,"a",2]'],
    ),
    (
        "minItems/maxItems",
        {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
        ["[1,2]", "[1,2,3]"],
        ["[1]", "[1,2,3,4]"],
    ),
    ("enum", {"enum": ["red", "green", 3]}, ['"red"', "3"], ['"blue"', "4"]),
    ("const", {"const": "fixed"}, ['"fixed"'], ['"other"']),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 3}]}, ["5", '"abc"'], ['"abcd"', "true"]),
    (
        "oneOf (overlapping branches)",
        {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "integer", "maximum": 10}]},
        ["20", "-5"],
        ["5"],
    ),
    ("oneOf (disjoint branches)", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, ["1", '"a"'], ["true"]),
    (
        "allOf",
        {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        ['{"a":1,"b":"x"}'],
        ['{"a":1}', '{"a":"x","b":"x"}'],
    ),
    (
        "$ref/$defs",
        {
            "$defs": {"pos": {"type": "integer", "minimum": 1}},
            "type": "object",
            "properties": {"n": {"$ref": "#/$defs/pos"}},
            "required": ["n"],
        },
        ['{"n":3}'],
        ['{"n":0}', '{"n":"x"}'],
    ),
    (
        "$ref recursive",
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["v"],
                    "additionalProperties": False,
                }
            },
            "$ref": "#/$defs/node",
        },
        ['{"v":1,"kids":[{"v":2,"kids":[]}]}'],
        ['{"v":1,"kids":[{"w":2}]}'],
    ),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, ['"ABC-1234"'], ['"abc-1234"', '"ABC-12345"']),
    (
        "format: date-time",
        {"type": "string", "format": "date-time"},
        ['"2024-01-02T03:04:05Z"', '"2024-01-02T03:04:05.5+01:00"'],
        ['"yesterday"', '"2024-13-02T03:04:05Z"'],
    ),
    ("format: email", {"type": "string", "format": "email"}, ['"a.b@example.com"'], ['"not-an-email"']),
    (
        "format: uuid",
        {"type": "string", "format": "uuid"},
        ['"123e4567-e89b-12d3-a456-426614174000"'],
        ['"123e4567"', '"xyz"'],
    ),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 4}, ['"abc"'], ['"a"', '"abcde"']),
    ("minimum/maximum (integer)", {"type": "integer", "minimum": 10, "maximum": 20}, ["10", "20"], ["9", "21"]),
    ("minimum/maximum (number)", {"type": "number", "minimum": 0.5, "maximum": 2.5}, ["0.5", "2"], ["0.4", "2.6"]),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, ["0.5"], ["0", "-1"]),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, ["15"], ["7"]),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, ["[1,2]"], ["[1,1]"]),
    ("not", {"not": {"type": "string"}}, ["1"], ['"x"']),
    (
        "if/then/else",
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "required": ["kind", "x"],
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"properties": {"x": {"minimum": 10}}},
            "else": {"properties": {"x": {"maximum": 0}}},
        },
        ['{"kind":"a","x":11}', '{"kind":"b","x":-1}'],
        ['{"kind":"a","x":5}'],
    ),
    (
        "patternProperties",
        {"type": "object", "patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
        ['{"n_a":1}'],
        ['{"n_a":"x"}', '{"z":1}'],
    ),
    (
        "minProperties/maxProperties",
        {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2, "maxProperties": 3},
        ['{"a":1,"b":2}'],
        ['{"a":1}', '{"a":1,"b":2,"c":3,"d":4}'],
    ),
]

# How an engine reports schemas it cannot handle.
BAD_SCHEMAS: list[tuple[str, Any]] = [
    ("unknown type name", {"type": "frobnicate"}),
    ("properties is not an object", {"type": "object", "properties": 5}),
    ("dangling $ref", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    ("unknown keyword x-foo", {"type": "string", "x-foo": 1}),
    ("contradiction (minimum > maximum)", {"type": "integer", "minimum": 5, "maximum": 1}),
]


# --------------------------------------------------------------------------------------------------------------
# Driver


def _percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class TokenClasses:
    """Boolean masks over the logits width used by the token-choice policy."""

    def __init__(self, vocab: Vocab, width: int):
        import torch

        ws = torch.zeros(width, dtype=torch.bool)
        closer = torch.zeros(width, dtype=torch.bool)
        struct = torch.zeros(width, dtype=torch.bool)
        for i, b in enumerate(vocab.token_bytes):
            if not b:
                continue
            if not b.strip():
                ws[i] = True
            elif all(c in b'"]} \t\n\r' for c in b):
                closer[i] = True
            elif any(c in b',:"' for c in b):
                struct[i] = True
        self.ws, self.closer, self.struct = ws, closer, struct
        self.bits = torch.arange(32, dtype=torch.int32)


def _unpack(bitmask, width: int, bits):
    return ((bitmask.unsqueeze(-1) >> bits) & 1).reshape(bitmask.shape[0], -1)[:, :width].bool()


def _choose(allowed, classes: TokenClasses, eos: int, finishing: bool, rng: random.Random) -> int:
    def pick(mask):
        idx = mask.nonzero().flatten()
        return int(idx[rng.randrange(len(idx))]) if len(idx) else None

    if finishing:
        if allowed[eos]:
            return eos
        for cls in (classes.closer, classes.struct, ~classes.ws):
            tok = pick(allowed & cls)
            if tok is not None:
                return tok
        return pick(allowed)
    not_eos = allowed.clone()
    not_eos[eos] = False
    for cand in (not_eos & ~classes.ws, not_eos, allowed):
        tok = pick(cand)
        if tok is not None:
            return tok
    raise RuntimeError("empty mask")


def drive(
    engine,
    compiled,
    batch: int,
    steps: int,
    seed: int,
    max_doc_tokens: int = 256,
    min_docs: int = 0,
    width: int | None = None,
) -> dict:
    """Run the batch loop; returns timings (µs) and the finished documents (bytes)."""
    import torch

    vocab = engine.vocab
    width = width or engine.n_vocab
    rng = random.Random(seed)
    classes = TokenClasses(vocab, width)
    matchers = [engine.matcher(compiled) for _ in range(batch)]
    bitmask = engine.allocate(batch, width)
    logits = torch.zeros(batch, width, dtype=torch.float32)
    base = torch.randn(batch, width, generator=torch.Generator().manual_seed(seed))
    docs: list[tuple[list[int], bool]] = []
    ids: list[list[int]] = [[] for _ in range(batch)]
    grow = [rng.randint(8, 48) for _ in range(batch)]
    fill_us, consume_us, apply_us, errors, unfinished = [], [], [], [], 0
    t_first_apply = None
    step = 0
    while step < steps or len(docs) < min_docs:
        if step >= max(steps, 1) * 10:
            break
        t0 = time.perf_counter_ns()
        engine.fill(matchers, bitmask)
        fill_us.append((time.perf_counter_ns() - t0) / 1e3 / batch)
        logits.copy_(base)
        t0 = time.perf_counter_ns()
        engine.apply(logits, bitmask)
        dt = (time.perf_counter_ns() - t0) / 1e3
        if t_first_apply is None:
            t_first_apply = dt
        else:
            apply_us.append(dt)
        allowed = _unpack(bitmask, width, classes.bits)
        for i, m in enumerate(matchers):
            tok = _choose(allowed[i], classes, vocab.eos, len(ids[i]) >= grow[i], rng)
            t0 = time.perf_counter_ns()
            ok = engine.consume(m, tok)
            consume_us.append((time.perf_counter_ns() - t0) / 1e3)
            done = False
            if not ok:
                errors.append(f"token {tok} {vocab.token_bytes[tok]!r} rejected: {engine.error(m)}")
                done = True
            else:
                ids[i].append(tok)
                if tok == vocab.eos or engine.finished(m):
                    docs.append((ids[i], tok == vocab.eos))
                    done = True
                elif len(ids[i]) >= max_doc_tokens:
                    unfinished += 1
                    done = True
            if done:
                engine.reset(m)
                ids[i] = []
                grow[i] = rng.randint(8, 48)
        step += 1
    return {
        "steps": step,
        "fill_us": fill_us,
        "consume_us": consume_us,
        "apply_us": apply_us,
        "first_apply_us": t_first_apply,
        "docs": [vocab.decode(d) for d, _ in docs],
        "docs_ended_by_eos": sum(1 for _, e in docs if e),
        "unfinished": unfinished,
        "errors": errors,
    }


def _validator(schema: dict):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_docs(schema: dict, docs: list[bytes]) -> tuple[int, int, list[str]]:
    """Returns (docs valid against the schema, docs that are not strict JSON, first failure messages).

    A doc that is not strict JSON (e.g. a raw control character inside a string) is still checked against the
    schema after a lenient parse, so keyword enforcement and JSON well-formedness are counted separately.
    """
    validator = _validator(schema)
    ok, not_json, bad = 0, 0, []
    for d in docs:
        try:
            inst = json.loads(d.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            not_json += 1
            bad.append(f"not JSON: {e}: {d[:80]!r}")
            try:
                inst = json.loads(d.decode(errors="replace"), strict=False)
            except json.JSONDecodeError:
                continue
        errs = list(validator.iter_errors(inst))
        if errs:
            bad.append(f"{errs[0].message[:120]} in {d[:100]!r}")
        else:
            ok += 1
    return ok, not_json, bad[:3]


# --------------------------------------------------------------------------------------------------------------
# Sections


def section_timing(args, vocab: Vocab) -> list[dict]:
    engine = ENGINES[args.engine](vocab, threads=args.threads)
    rows = []
    for name, schema in TIMING_SCHEMAS.items():
        t0 = time.perf_counter()
        compiled, warnings = engine.compile(schema)
        first_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        engine.compile(schema)
        second_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        engine.matcher(compiled)
        matcher_ms = (time.perf_counter() - t0) * 1e3
        r: dict[str, Any] = {}
        for rep in range(args.repeat):  # pooled over --repeat seeds
            one = drive(engine, compiled, args.batch, args.steps, args.seed + rep, max_doc_tokens=args.max_doc_tokens)
            for k, v in one.items():
                r[k] = r.get(k, v) if k == "first_apply_us" else (r[k] + v if k in r else v)
        valid, not_json, bad = check_docs(schema, r["docs"])
        row = {
            "engine": engine.name,
            "version": engine.version(),
            "vocab": vocab.size,
            "tokenizer_ms": round(engine.tokenizer_s * 1e3, 1),
            "schema": name,
            "compile_first_ms": round(first_ms, 2),
            "compile_second_ms": round(second_ms, 2),
            "new_matcher_ms": round(matcher_ms, 3),
            "fill_med_us": round(statistics.median(r["fill_us"]), 1),
            "fill_p99_us": round(_percentile(r["fill_us"], 99), 1),
            "consume_med_us": round(statistics.median(r["consume_us"]), 1),
            "consume_p99_us": round(_percentile(r["consume_us"], 99), 1),
            "apply_med_us": round(statistics.median(r["apply_us"]), 1),
            "apply_p99_us": round(_percentile(r["apply_us"], 99), 1),
            "apply_first_us": round(r["first_apply_us"], 1),
            "docs": len(r["docs"]),
            "docs_valid": valid,
            "docs_not_json": not_json,
            "docs_eos": r["docs_ended_by_eos"],
            "unfinished": r["unfinished"],
            "token_errors": len(r["errors"]),
            "warnings": warnings,
            "bad_examples": bad + r["errors"][:2],
            "sample": r["docs"][0].decode(errors="replace")[:200] if r["docs"] else "",
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def section_coverage(args, vocab: Vocab) -> list[dict]:
    engine = ENGINES[args.engine](vocab, threads=args.threads)
    rows = []
    for keyword, schema, valid, invalid in COVERAGE:
        row: dict[str, Any] = {"engine": engine.name, "keyword": keyword}
        is_error, msgs = engine.validate(schema)
        row["validate_error"], row["validate_msgs"] = is_error, [m[:300] for m in msgs]
        if args.engine == "llguidance" and is_error:
            lerr, lmsgs = engine.validate(schema, {"lenient": True})
            row["lenient"] = "error" if lerr else ("warnings: " + "; ".join(m[:200] for m in lmsgs) if lmsgs else "ok")
        try:
            compiled, warnings = engine.compile(schema)
        except CompileError as e:
            row.update(status="refused", error=str(e)[:300])
            print(json.dumps(row), flush=True)
            rows.append(row)
            continue
        row["warnings"] = [w[:300] for w in warnings]
        row["valid_accepted"] = [engine.accepts(compiled, v) for v in valid]
        row["invalid_rejected"] = [not engine.accepts(compiled, v) for v in invalid]
        r = drive(engine, compiled, 8, 40, args.seed, max_doc_tokens=args.max_doc_tokens, min_docs=args.samples)
        ok, not_json, bad = check_docs(schema, r["docs"])
        row["samples"] = f"{ok}/{len(r['docs'])}"
        row["samples_not_json"] = not_json
        row["sample_failures"] = bad
        row["unfinished"] = r["unfinished"]
        row["token_errors"] = r["errors"][:2]
        enforced = all(row["valid_accepted"]) and all(row["invalid_rejected"]) and ok == len(r["docs"])
        if warnings or (is_error is False and msgs):
            row["status"] = "compiled with warning" + ("" if enforced else " (not enforced)")
        elif enforced:
            row["status"] = "enforced"
        elif not all(row["valid_accepted"]):
            row["status"] = "over-restricted (valid instance refused)"
        else:
            row["status"] = "silently not enforced"
        print(json.dumps(row), flush=True)
        rows.append(row)
    for label, schema in BAD_SCHEMAS:
        is_error, msgs = engine.validate(schema)
        row = {"engine": engine.name, "bad_schema": label, "is_error": is_error, "msgs": [m[:300] for m in msgs]}
        if args.engine == "llguidance":
            try:
                engine.compile(schema)
                row["ctor"] = "ok"
            except CompileError as e:
                row["ctor"] = f"matcher.is_error(): {str(e)[:200]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def section_quirks(args, vocab: Vocab) -> dict:
    import torch

    out: dict[str, Any] = {"engine": args.engine}
    cls = ENGINES[args.engine]
    engine = cls(vocab, threads=args.threads)
    width = engine.n_vocab

    def allowed_of(m, w=width):
        bm = engine.allocate(1, w)
        engine.fill_one(m, bm)
        return _unpack(bm, w, torch.arange(32, dtype=torch.int32))[0]

    def feed(m, text: str) -> bool:
        if args.engine == "llguidance":
            return m.consume_tokens(engine.tok.tokenize_bytes(text.encode()))
        return m.accept_string(text)

    # EOS when the grammar is accepting but could continue ("12" -> "123"), and when it cannot continue.
    compiled, _ = engine.compile({"type": "integer"})
    m = engine.matcher(compiled)
    feed(m, "12")
    a = allowed_of(m)
    out["eos_after_12_integer"] = {
        "eos_allowed": bool(a[vocab.eos]),
        "n_allowed": int(a.sum()),
        "finished_before_eos": engine.finished(m),
    }
    compiled, _ = engine.compile(_OBJ_A)
    m = engine.matcher(compiled)
    feed(m, '{"a":1}')
    a = allowed_of(m)
    out["eos_after_closed_object"] = {
        "eos_allowed": bool(a[vocab.eos]),
        "n_allowed": int(a.sum()),
        "allowed_non_eos": [vocab.token_bytes[i].decode(errors="replace") for i in a.nonzero().flatten()[:5].tolist()],
        "finished_before_eos": engine.finished(m),
    }
    out["eos_consume_after_closed_object"] = engine.consume(m, vocab.eos)
    out["finished_after_eos"] = engine.finished(m)
    # Consuming a token after termination.
    try:
        out["consume_after_eos"] = engine.consume(m, vocab.token_bytes.index(b"1"))
    except Exception as e:  # noqa: BLE001
        out["consume_after_eos"] = f"{type(e).__name__}: {e}"

    # Whitespace with default options.
    ws_cases = {
        "compact": '{"a":1}',
        "spaces": '{ "a" : 1 }',
        "newline_indent": '{\n  "a": 1\n}',
        "leading_ws": ' {"a":1}',
        "trailing_ws": '{"a":1} ',
        "200_spaces": "{" + " " * 200 + '"a":1}',
    }
    out["whitespace_accepted"] = {k: engine.accepts(compiled, v) for k, v in ws_cases.items()}

    # Bitmask wider than the tokenizer (model logits padded, e.g. to a multiple of 64).
    padded = (vocab.size + 63) // 64 * 64 + 64
    m = engine.matcher(compiled)
    for label, w in (("bitmask_wider_than_n_vocab", padded), ("bitmask_narrower_than_n_vocab", vocab.size - 64)):
        try:
            bm = engine.allocate(2, w)
            engine.fill(([m, m.deep_copy()] if args.engine == "llguidance" else [m, engine.matcher(compiled)]), bm)
            bits = _unpack(bm, w, torch.arange(32, dtype=torch.int32))
            out[label] = f"ok, allowed={int(bits[0].sum())}, padded ids allowed={int(bits[0, vocab.size :].sum())}"
        except Exception as e:  # noqa: BLE001
            out[label] = f"{type(e).__name__}: {str(e)[:200]}"
    try:
        e2 = cls(vocab, n_vocab=padded, threads=args.threads)
        c2, _ = e2.compile(_OBJ_A)
        m2 = e2.matcher(c2)
        bm = e2.allocate(1, padded)
        e2.fill([m2], bm)
        bits = _unpack(bm, padded, torch.arange(32, dtype=torch.int32))
        out["n_vocab_padded_tokenizer"] = (
            f"ok, allowed={int(bits[0].sum())}, padded ids allowed={int(bits[0, vocab.size :].sum())}"
        )
    except Exception as e:  # noqa: BLE001
        out["n_vocab_padded_tokenizer"] = f"{type(e).__name__}: {str(e)[:200]}"

    # GIL: do two Python threads filling masks for their own matchers overlap?
    compiled, _ = engine.compile(TIMING_SCHEMAS["order_nested"])
    ms = [engine.matcher(compiled) for _ in range(2)]
    for mm in ms:
        feed(mm, '{"id":"ORD-123456","status":"paid","customer":{"name":"')
    bms = [engine.allocate(1, width) for _ in range(2)]
    n = 200

    def loop(k):
        for _ in range(n):
            engine.fill_one(ms[k], bms[k])

    t0 = time.perf_counter()
    loop(0)
    loop(1)
    seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    ths = [threading.Thread(target=loop, args=(k,)) for k in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    par = time.perf_counter() - t0
    out["two_threads_fill_speedup"] = round(seq / par, 2)
    out["single_fill_in_string_us"] = round(seq / (2 * n) * 1e6, 1)

    # Same matcher from two threads at once, in a forked child so that a crash does not end the run.
    print(json.dumps(out, indent=1), flush=True)
    pid = os.fork()
    if pid == 0:
        errs: list[str] = []

        def hammer():
            try:
                for _ in range(n):
                    engine.fill_one(ms[0], bms[0])
            except Exception:  # noqa: BLE001
                errs.append("x")

        ths = [threading.Thread(target=hammer) for _ in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        os._exit(3 if errs else 0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        out["same_matcher_two_threads"] = f"process killed by signal {os.WTERMSIG(status)}"
    else:
        code = os.WEXITSTATUS(status)
        out["same_matcher_two_threads"] = "exception raised" if code == 3 else "no error raised"
    print(json.dumps({"same_matcher_two_threads": out["same_matcher_two_threads"]}), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=sorted(ENGINES))
    p.add_argument("--section", choices=["timing", "coverage", "quirks"], default="timing")
    p.add_argument("--tokenizer", action="append", help="tokenizer.json (repeatable)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--max-doc-tokens", type=int, default=160)
    p.add_argument("--samples", type=int, default=8, help="coverage: min generated docs per keyword")
    p.add_argument("--threads", type=int, default=2, help="engine worker threads (LLExecutor/BatchGrammarMatcher)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="timing: runs (seeds seed..seed+N-1) pooled per schema")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (apply kernels)")
    p.add_argument("--json-out", help="write raw results here")
    p.add_argument("--build-tokenizer", type=int, metavar="VOCAB", help="train a byte-level BPE and exit")
    p.add_argument("--corpus-mb", type=float, default=None, help="with --build-tokenizer (default 24, 100 if >64k)")
    p.add_argument("--out", help="with --build-tokenizer: tokenizer.json path")
    args = p.parse_args(argv)
    if args.build_tokenizer:
        mb = args.corpus_mb or (100.0 if args.build_tokenizer > 64000 else 24.0)
        build_tokenizer(args.build_tokenizer, args.out, corpus_mb=mb)
        return
    if not args.engine or not args.tokenizer:
        p.error("--engine and --tokenizer are required")
    import torch

    torch.set_num_threads(args.torch_threads)
    results: list[Any] = []
    for path in args.tokenizer:
        vocab = load_vocab(path)
        print(f"# {args.engine} {args.section} vocab={vocab.size} ({vocab.kind}) {path}", flush=True)
        fn = {"timing": section_timing, "coverage": section_coverage, "quirks": section_quirks}[args.section]
        results.append({"tokenizer": path, "vocab": vocab.size, "result": fn(args, vocab)})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
