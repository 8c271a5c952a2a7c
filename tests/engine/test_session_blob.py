"""A session blob gives back exactly the KV it was made from, and is refused with a reason the client can act on
when it is damaged, from another model, for other tokens, too long for the context window, or (only when nothing
else is wrong) computed with other weights. The blob's layout is read here with struct and plain msgpack, as the
module's docstring documents it, so the tests also hold the format to its description."""

import hashlib
import struct
from dataclasses import replace

import msgspec
import pytest
import torch

from inference.engine.kv.session_blob import (
    BadSessionBlob,
    SessionLayout,
    SessionSnapshot,
    WeightsVersionMismatch,
    decode_blob,
    encode_blob,
)

LAYOUT = SessionLayout("LlamaForCausalLM", num_layers=3, num_kv_heads=2, head_dim=8, dtype=torch.float32, block_size=16)
TOKENS = [1, 15043, 29892, 0, 2**32 - 1, 338]
VERSION = 7
PREFIX = struct.Struct("<8sHI")


def snapshot(layout=LAYOUT, tokens=TOKENS, weights_version=VERSION, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (layout.num_kv_heads, len(tokens), layout.head_dim)

    def tensors():
        return [torch.randn(shape, generator=gen).to(layout.dtype) for _ in range(layout.num_layers)]

    return SessionSnapshot(layout, weights_version, list(tokens), tensors(), tensors())


def decode(blob, tokens=TOKENS, *, expect=LAYOUT, weights_version=VERSION, max_tokens=64):
    return decode_blob(blob, tokens, expect=expect, weights_version=weights_version, max_tokens=max_tokens)


def split(blob):
    """(version, header as a dict, payload, checksum) read the way the format is documented."""
    magic, version, header_len = PREFIX.unpack_from(blob)
    assert magic == b"PNKVSESS"
    header_end = PREFIX.size + header_len
    return version, msgspec.msgpack.decode(blob[PREFIX.size : header_end]), blob[header_end:-32], blob[-32:]


def seal(version, header, payload):
    """A blob with a valid checksum around whatever header (a dict, or raw bytes) and payload it is given."""
    header = header if isinstance(header, bytes) else msgspec.msgpack.encode(header)
    body = PREFIX.pack(b"PNKVSESS", version, len(header)) + header + payload
    return body + hashlib.blake2b(body, digest_size=32).digest()


def reseal(blob, *, version=1, payload=None, **header_changes):
    _, header, old_payload, _ = split(blob)
    return seal(version, header | header_changes, old_payload if payload is None else payload)


def flip(blob, index):
    altered = bytearray(blob)
    altered[index] ^= 0x01
    return bytes(altered)


def assert_same(decoded, original):
    assert decoded.layout == original.layout
    assert decoded.weights_version == original.weights_version
    assert decoded.tokens == original.tokens
    for got, want in zip(decoded.keys + decoded.values, original.keys + original.values, strict=True):
        assert got.dtype == want.dtype and got.device.type == "cpu"
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))  # bit for bit, NaN payloads too


# -- round trip ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_blob_gives_back_exactly_the_kv_it_was_made_from(dtype):
    original = snapshot(replace(LAYOUT, dtype=dtype))
    assert_same(decode(encode_blob(original), expect=replace(LAYOUT, dtype=dtype)), original)


@pytest.mark.parametrize("weights_version", [-(2**63), -1, 0, 2**63 - 1])
def test_any_signed_64_bit_weights_version_round_trips(weights_version):
    original = snapshot(weights_version=weights_version)
    assert decode(encode_blob(original), weights_version=weights_version).weights_version == weights_version


def test_a_slots_kv_exports_straight_from_the_cache_without_being_made_contiguous_first():
    # keys[layer][slot, :, :length] of a KV cache shaped [max_concurrent, Hkv, context_window, hd] is not contiguous
    cache = [torch.randn(4, 2, 32, 8, dtype=torch.bfloat16) for _ in range(2 * LAYOUT.num_layers)]
    slot, length = 2, len(TOKENS)
    layout = replace(LAYOUT, dtype=torch.bfloat16)
    rows = [layer[slot, :, :length] for layer in cache]
    assert not rows[0].is_contiguous()
    original = SessionSnapshot(layout, VERSION, TOKENS, rows[: layout.num_layers], rows[layout.num_layers :])
    assert_same(decode(encode_blob(original), expect=layout), original)


def test_decoded_tensors_are_copies_that_outlive_the_blobs_buffer():
    original = snapshot()
    buffer = bytearray(encode_blob(original))
    decoded = decode(buffer)
    buffer[:] = bytes(len(buffer))
    assert_same(decoded, original)
    decoded.keys[0].zero_()  # writable, and its own memory
    assert not torch.equal(decoded.keys[1], torch.zeros_like(decoded.keys[1]))


def test_the_block_size_is_recorded_not_required_to_match():
    blob = encode_blob(snapshot(replace(LAYOUT, block_size=256)))
    assert decode(blob).layout.block_size == 256


def test_the_blob_is_laid_out_as_documented():
    original = snapshot(replace(LAYOUT, dtype=torch.bfloat16), weights_version=-3)
    blob = encode_blob(original)
    version, header, payload, checksum = split(blob)
    assert version == 1
    assert header == {
        "architecture": "LlamaForCausalLM",
        "num_layers": 3,
        "num_kv_heads": 2,
        "head_dim": 8,
        "dtype": "bfloat16",
        "block_size": 16,
        "weights_version": -3,
        "n_tok": len(TOKENS),
        "tokens_digest": hashlib.blake2b(struct.pack(f"<{len(TOKENS)}I", *TOKENS), digest_size=32).digest(),
        "payload_bytes": len(payload),
    }
    layers = [t for pair in zip(original.keys, original.values, strict=True) for t in pair]
    assert payload == b"".join(t.view(torch.int16).numpy().astype("<i2").tobytes() for t in layers)
    assert checksum == hashlib.blake2b(blob[:-32], digest_size=32).digest()


# -- damaged blobs --------------------------------------------------------------------------------------------------

BLOB = encode_blob(snapshot())


@pytest.mark.parametrize("length", [0, 7, 13, 20, 45, len(BLOB) // 2, len(BLOB) - 32, len(BLOB) - 1])
def test_a_truncated_blob_is_refused(length):
    with pytest.raises(BadSessionBlob, match="truncated"):
        decode(BLOB[:length])


def test_a_blob_with_bytes_after_its_end_is_refused():
    with pytest.raises(BadSessionBlob, match="checksum"):
        decode(BLOB + b"\0")


def test_something_else_than_a_session_blob_is_refused():
    with pytest.raises(BadSessionBlob, match="magic"):
        decode(b"GGUF" + BLOB[4:])


@pytest.mark.parametrize("version", [0, 2])  # older and newer than the one this server reads
def test_an_unknown_format_version_is_refused_even_with_a_valid_checksum(version):
    with pytest.raises(BadSessionBlob, match=f"format version {version} is unknown"):
        decode(reseal(BLOB, version=version))


@pytest.mark.parametrize("where", ["magic", "version", "header length", "header", "payload", "checksum"])
def test_one_flipped_bit_anywhere_is_refused(where):
    header_len = PREFIX.unpack_from(BLOB)[2]
    index = {
        "magic": 3,
        "version": 9,
        "header length": 11,
        "header": PREFIX.size + header_len // 2,
        "payload": PREFIX.size + header_len + 100,
        "checksum": len(BLOB) - 5,
    }[where]
    with pytest.raises(BadSessionBlob):
        decode(flip(BLOB, index))


@pytest.mark.parametrize("where", ["header", "first payload byte", "last payload byte", "checksum"])
def test_altered_bytes_are_caught_by_the_checksum(where):
    header_len = PREFIX.unpack_from(BLOB)[2]
    index = {
        "header": PREFIX.size + header_len // 2,
        "first payload byte": PREFIX.size + header_len,
        "last payload byte": len(BLOB) - 33,
        "checksum": len(BLOB) - 1,
    }[where]
    with pytest.raises(BadSessionBlob, match="checksum does not match"):
        decode(flip(BLOB, index))


@pytest.mark.parametrize(
    "header",
    [
        b"\xc1",  # never valid msgpack
        b"\x93\x01\x02\x03",  # an array, not a map
        {"architecture": "LlamaForCausalLM"},  # fields missing
        split(BLOB)[1] | {"n_tok": "six"},  # a field of the wrong type
        split(BLOB)[1] | {"extra": 1},  # a field this version does not know
    ],
    ids=["junk", "array", "missing fields", "wrong type", "unknown field"],
)
def test_an_unreadable_header_is_refused(header):
    with pytest.raises(BadSessionBlob, match="header cannot be read"):
        decode(seal(1, header, split(BLOB)[2]))


def test_a_header_length_past_the_end_is_refused():
    _, header, payload, _ = split(BLOB)
    body = PREFIX.pack(b"PNKVSESS", 1, 10**6) + msgspec.msgpack.encode(header) + payload
    with pytest.raises(BadSessionBlob, match="runs past its end"):
        decode(body + hashlib.blake2b(body, digest_size=32).digest())


@pytest.mark.parametrize(
    "change",
    [
        {"payload_bytes": len(split(BLOB)[2]) - 1},  # the header disagrees with the payload
        {"payload": split(BLOB)[2][:-4]},  # both agree, the layout needs more
        {"payload": split(BLOB)[2] + b"\0" * 4, "payload_bytes": len(split(BLOB)[2]) + 4},  # both agree, too many
    ],
    ids=["header says otherwise", "payload short", "payload long"],
)
def test_a_payload_of_the_wrong_length_is_refused(change):
    with pytest.raises(BadSessionBlob, match="payload is"):
        decode(reseal(BLOB, **change))


def test_a_block_size_that_is_not_positive_is_refused():
    with pytest.raises(BadSessionBlob, match="block_size"):
        decode(reseal(BLOB, block_size=0))


# -- a sound blob that does not belong here -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "other",
    [
        replace(LAYOUT, architecture="Qwen2ForCausalLM"),
        replace(LAYOUT, num_layers=2),
        replace(LAYOUT, num_kv_heads=4),
        replace(LAYOUT, head_dim=16),
        replace(LAYOUT, dtype=torch.bfloat16),
    ],
    ids=["architecture", "num_layers", "num_kv_heads", "head_dim", "dtype"],
)
def test_a_blob_from_another_architecture_or_shape_is_refused(other):
    with pytest.raises(BadSessionBlob, match="another architecture or shape") as refused:
        decode(encode_blob(snapshot(other)))
    assert "this model is LlamaForCausalLM, 3 layers of 2 KV heads x 8 float32" in str(refused.value)


@pytest.mark.parametrize(
    "tokens, reason",
    [
        (TOKENS[:-1], "covers 6 tokens but 5 were sent"),
        ([*TOKENS, 5], "covers 6 tokens but 7 were sent"),
        ([], "covers 6 tokens but 0 were sent"),
        ([*TOKENS[:-1], 339], "not the ones the session was exported with"),
        (TOKENS[::-1], "not the ones the session was exported with"),
        ([*TOKENS[:-1], -1], "token id -1 is out of range"),
        ([*TOKENS[:-1], 2**32], "token id 4294967296 is out of range"),
    ],
    ids=["fewer", "more", "none", "one differs", "reordered", "negative", "over 32 bits"],
)
def test_a_blob_restored_with_other_tokens_is_refused(tokens, reason):
    with pytest.raises(BadSessionBlob, match=reason):
        decode(BLOB, tokens)


def test_a_blob_that_covers_no_tokens_is_refused():
    empty = seal(1, split(BLOB)[1] | {"n_tok": 0, "payload_bytes": 0}, b"")
    with pytest.raises(BadSessionBlob, match="covers no tokens"):
        decode(empty, [])


def test_a_session_longer_than_the_context_window_is_refused():
    assert decode(BLOB, max_tokens=len(TOKENS)).tokens == TOKENS
    with pytest.raises(BadSessionBlob, match="do not fit this model's context window of 5 tokens"):
        decode(BLOB, max_tokens=len(TOKENS) - 1)


def test_a_session_longer_than_the_context_window_is_refused_before_its_blob_is_read():
    for unread in (flip(BLOB, len(BLOB) - 40), b"not a blob at all"):  # a checksum or magic bytes would refuse these
        with pytest.raises(BadSessionBlob, match="do not fit this model's context window of 5 tokens"):
            decode(unread, max_tokens=len(TOKENS) - 1)


# -- other weights --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("served", [VERSION + 1, VERSION - 1])  # weights newer or older than the blob's
def test_a_sound_blob_from_other_weights_is_a_weights_version_mismatch(served):
    with pytest.raises(WeightsVersionMismatch, match="replay the conversation") as refused:
        decode(BLOB, weights_version=served)
    assert (refused.value.found, refused.value.expected) == (VERSION, served)
    assert not isinstance(refused.value, BadSessionBlob)  # 409 for the client, not 400


@pytest.mark.parametrize(
    "blob, tokens, max_tokens",
    [
        (flip(BLOB, len(BLOB) - 40), TOKENS, 64),  # altered
        (BLOB[:-1], TOKENS, 64),  # truncated
        (encode_blob(snapshot(replace(LAYOUT, head_dim=4))), TOKENS, 64),  # another shape
        (BLOB, [*TOKENS[:-1], 7], 64),  # other tokens
        (BLOB, TOKENS, 3),  # too long
        (reseal(BLOB, payload_bytes=1), TOKENS, 64),  # payload length
    ],
    ids=["altered", "truncated", "another shape", "other tokens", "too long", "payload length"],
)
def test_a_blob_that_is_wrong_in_another_way_too_is_a_bad_blob_whatever_its_weights(blob, tokens, max_tokens):
    with pytest.raises(BadSessionBlob):
        decode(blob, tokens, weights_version=VERSION + 1, max_tokens=max_tokens)


# -- what a snapshot must be ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"tokens": []},
        {"tokens": [-5]},
        {"weights_version": 2**63},
        {"keys": snapshot().keys[:2]},
        {"values": [t.to(torch.bfloat16) for t in snapshot().values]},
        {"keys": [t[:, :-1] for t in snapshot().keys]},
        {"keys": [t.to("meta") for t in snapshot().keys]},
    ],
    ids=["no tokens", "negative token", "weights_version over 64 bits", "a layer missing", "dtype", "shape", "device"],
)
def test_a_snapshot_that_could_not_be_restored_cannot_be_made(change):
    with pytest.raises(ValueError):
        replace(snapshot(), **change)


def test_a_layout_needs_positive_sizes():
    with pytest.raises(ValueError, match="block_size must be positive"):
        replace(LAYOUT, block_size=0)
