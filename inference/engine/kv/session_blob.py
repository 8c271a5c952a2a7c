"""The bytes of one exported chat session's KV cache, and the checks that decide whether they may be restored.

A session's keys and values can outlive its slot: the operator exports them (`POST /admin/session/export`, base64
on the wire) and a client restores them later, perhaps on another server, instead of paying for a re-prefill.
Restoring KV that does not belong to the model would not fail; it would make the model say nonsense. So a blob
records what its KV was computed for, and `decode_blob` refuses, with a message the client can act on, anything
that does not match: damaged bytes, another format version, another architecture or shape, tokens other than the
ones exported (they travel beside the blob, since the client keeps the conversation anyway; the blob holds only a
digest of them), or more tokens than this model's context window. Each of those is `BadSessionBlob` (400). A blob
that is sound but was computed with other weights is `WeightsVersionMismatch` (409), raised only once nothing else
is wrong, because its remedy differs: the client replays the conversation instead.

Layout of a blob (every integer little-endian):

    magic        8 bytes   b"PNKVSESS"
    version      u16       FORMAT_VERSION; another is refused
    header_len   u32
    header       msgpack map (BlobHeader), header_len bytes
    payload      for each layer its keys then its values, [num_kv_heads, n_tok, head_dim] each, the tensor's raw
                 contiguous bytes (little-endian, the byte order of every host torch serves on)
    checksum     blake2b-256 of everything before it

The checksum catches damage, not forgery: a crafted blob can only put its own numbers into its own session's KV,
and the checks here keep those numbers to the model's shape.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, replace

import msgspec
import numpy as np
import torch

MAGIC = b"PNKVSESS"
FORMAT_VERSION = 1
CHECKSUM_BYTES = 32
MAX_TOKEN_ID = 2**32 - 1  # token ids are digested as u32
_PREFIX = struct.Struct("<8sHI")  # magic, version, header_len
_INT64 = range(-(2**63), 2**63)


class BadSessionBlob(ValueError):
    """The blob cannot be restored into this model: the message says why, in words meant for the client."""


class WeightsVersionMismatch(ValueError):
    """The blob is sound but its KV was computed with other weights (`found`) than the model serves (`expected`)."""

    def __init__(self, found: int, expected: int):
        self.found = found
        self.expected = expected
        super().__init__(
            f"the session was exported under weights version {found} but this model serves version {expected}; "
            "replay the conversation instead"
        )


@dataclass(frozen=True, slots=True)
class SessionLayout:
    """What a blob must match to be restored into a model."""

    architecture: str  # e.g. "LlamaForCausalLM"
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the KV cache's
    block_size: int  # the KV pool's positions per block; recorded for diagnosis, not required to match

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """One session's KV: `keys[layer]` and `values[layer]` are `[num_kv_heads, n_tok, head_dim]` on the CPU, in
    the layout's dtype, covering `tokens` (n_tok = len(tokens) >= 1)."""

    layout: SessionLayout
    weights_version: int  # signed 64-bit: which weights the KV was computed with
    tokens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def __post_init__(self):
        if self.weights_version not in _INT64:
            raise ValueError(f"weights_version {self.weights_version} does not fit a signed 64-bit integer")
        if problem := _token_problem(self.tokens):
            raise ValueError(problem)
        layout = self.layout
        if not len(self.keys) == len(self.values) == layout.num_layers:
            raise ValueError(
                f"{len(self.keys)} key and {len(self.values)} value tensors for {layout.num_layers} layers"
            )
        shape = (layout.num_kv_heads, len(self.tokens), layout.head_dim)
        for tensor in (*self.keys, *self.values):
            if tuple(tensor.shape) != shape or tensor.dtype != layout.dtype or tensor.device.type != "cpu":
                raise ValueError(
                    f"a KV tensor is {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}; "
                    f"expected {shape} {layout.dtype} on cpu"
                )


class BlobHeader(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What a blob's KV was computed for (a msgpack map, readable by any msgpack tool when diagnosing a blob)."""

    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # torch's name without "torch.", e.g. "bfloat16"
    block_size: int
    weights_version: int
    n_tok: int
    tokens_digest: bytes  # blake2b-256 of the token ids as little-endian u32
    payload_bytes: int


_header_decoder = msgspec.msgpack.Decoder(BlobHeader)


def encode_blob(snapshot: SessionSnapshot) -> bytes:
    """The blob of `snapshot`, in the current FORMAT_VERSION."""
    layout = snapshot.layout
    tensors = [_raw_bytes(t) for pair in zip(snapshot.keys, snapshot.values, strict=True) for t in pair]
    header = msgspec.msgpack.encode(
        BlobHeader(
            architecture=layout.architecture,
            num_layers=layout.num_layers,
            num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim,
            dtype=_dtype_name(layout.dtype),
            block_size=layout.block_size,
            weights_version=snapshot.weights_version,
            n_tok=len(snapshot.tokens),
            tokens_digest=_tokens_digest(snapshot.tokens),
            payload_bytes=sum(t.nbytes for t in tensors),
        )
    )
    chunks = [_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header, *tensors]
    checksum = hashlib.blake2b(digest_size=CHECKSUM_BYTES)
    for chunk in chunks:
        checksum.update(chunk)
    return b"".join([*chunks, checksum.digest()])


def decode_blob(
    blob: bytes, tokens: list[int], *, expect: SessionLayout, weights_version: int, max_tokens: int
) -> SessionSnapshot:
    """The snapshot in `blob`, which must cover exactly `tokens`, match `expect` and fit `max_tokens` (the model's
    context window), else BadSessionBlob; then, computed with other weights than `weights_version`,
    WeightsVersionMismatch. The tensors are copies, on the CPU: `blob` may be dropped or reused afterwards. A session
    longer than the window is refused first, before the blob is read (a checksum over a large one takes a while)."""
    if len(tokens) > max_tokens:
        raise BadSessionBlob(
            f"the session's {len(tokens)} tokens do not fit this model's context window of {max_tokens} tokens"
        )
    view = memoryview(blob)
    if len(view) < _PREFIX.size + CHECKSUM_BYTES:
        raise BadSessionBlob(f"the session blob is truncated: {len(view)} bytes is too short to be one")
    magic, version, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise BadSessionBlob("not a session blob (wrong magic bytes)")
    if version != FORMAT_VERSION:
        raise BadSessionBlob(f"session blob format version {version} is unknown; this server reads {FORMAT_VERSION}")
    body = view[:-CHECKSUM_BYTES]
    if hashlib.blake2b(body, digest_size=CHECKSUM_BYTES).digest() != view[-CHECKSUM_BYTES:]:
        raise BadSessionBlob("the session blob's checksum does not match: it was truncated or altered")
    header_end = _PREFIX.size + header_len
    if header_end > len(body):
        raise BadSessionBlob(f"the session blob's header ({header_len} bytes) runs past its end")
    try:
        header = _header_decoder.decode(body[_PREFIX.size : header_end])
    except msgspec.DecodeError as exc:
        raise BadSessionBlob(f"the session blob's header cannot be read: {exc}") from None
    layout = _check_header(header, tokens, expect=expect)
    payload = body[header_end:]
    tensor_bytes = layout.num_kv_heads * header.n_tok * layout.head_dim * layout.dtype.itemsize
    if not header.payload_bytes == len(payload) == 2 * layout.num_layers * tensor_bytes:
        raise BadSessionBlob(
            f"the session blob's payload is {len(payload)} bytes; its header says {header.payload_bytes} and "
            f"{header.n_tok} tokens of this layout take {2 * layout.num_layers * tensor_bytes}"
        )
    if header.weights_version != weights_version:
        raise WeightsVersionMismatch(header.weights_version, weights_version)
    shape = (layout.num_kv_heads, header.n_tok, layout.head_dim)
    tensors = [
        torch.frombuffer(bytearray(payload[i * tensor_bytes : (i + 1) * tensor_bytes]), dtype=layout.dtype).view(shape)
        for i in range(2 * layout.num_layers)
    ]
    return SessionSnapshot(layout, header.weights_version, list(tokens), tensors[0::2], tensors[1::2])


def _check_header(header: BlobHeader, tokens: list[int], *, expect: SessionLayout) -> SessionLayout:
    """The blob's layout once the header agrees with the model and the tokens sent with it; else BadSessionBlob."""
    found = (header.architecture, header.num_layers, header.num_kv_heads, header.head_dim, header.dtype)
    wanted = (expect.architecture, expect.num_layers, expect.num_kv_heads, expect.head_dim, _dtype_name(expect.dtype))
    if found != wanted:
        raise BadSessionBlob(
            f"the session blob is from another architecture or shape: {_describe(*found)}; "
            f"this model is {_describe(*wanted)}"
        )
    if header.n_tok < 1:
        raise BadSessionBlob("the session blob covers no tokens")
    if header.n_tok != len(tokens):
        raise BadSessionBlob(f"the session blob covers {header.n_tok} tokens but {len(tokens)} were sent with it")
    if problem := _token_problem(tokens):
        raise BadSessionBlob(problem)
    if header.tokens_digest != _tokens_digest(tokens):
        raise BadSessionBlob("the tokens sent are not the ones the session was exported with")
    if header.block_size < 1:
        raise BadSessionBlob(f"the session blob's block_size {header.block_size} is not positive")
    return replace(expect, block_size=header.block_size)


def _token_problem(tokens: list[int]) -> str | None:
    """Why `tokens` cannot be a session's history, or None when they can."""
    if not tokens:
        return "a session covers at least one token"
    if min(tokens) < 0 or max(tokens) > MAX_TOKEN_ID:
        bad = next(t for t in tokens if not 0 <= t <= MAX_TOKEN_ID)
        return f"token id {bad} is out of range (0 to {MAX_TOKEN_ID})"
    return None


def _tokens_digest(tokens: list[int]) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype="<u4").tobytes(), digest_size=32).digest()


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's contiguous bytes, without a copy when it is already contiguous (any dtype, bfloat16 included)."""
    return tensor.contiguous().view(torch.uint8).numpy()


def _describe(architecture: str, num_layers: int, num_kv_heads: int, head_dim: int, dtype: str) -> str:
    return f"{architecture}, {num_layers} layers of {num_kv_heads} KV heads x {head_dim} {dtype}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
