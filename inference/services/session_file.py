"""A session file: an exported session as raw bytes (application/octet-stream), so that a session of any size can
be exported and restored without base64 or a JSON body (which stays under PANTHEON_MAX_BODY_BYTES).

`POST /admin/session/export` answers one when asked with `Accept: application/octet-stream`, and
`POST /session/restore` takes one as its body with `Content-Type: application/octet-stream` (up to
PANTHEON_SESSION_RESTORE_MAX_BYTES). It holds what export's JSON holds that restore needs, the tokens and the blob:

    n_tok    u32            how many tokens the session covers
    tokens   n_tok x u32    the token ids
    blob     the rest       the session blob, byte for byte what export's `blob_b64` decodes to

Every integer is little-endian. The blob's own format is the engine's (inference/engine/kv/session_blob.py).
"""

from __future__ import annotations

import struct
import sys
from array import array

from pantheon_site.errors import BadSessionBlob

_COUNT = struct.Struct("<I")


def session_file(tokens: list[int], blob: bytes) -> bytes:
    """The session file of an exported session."""
    return b"".join([_COUNT.pack(len(tokens)), _little_endian(array("I", tokens)).tobytes(), blob])


def read_session_file(raw: bytes) -> tuple[list[int], bytes]:
    """The tokens and the blob of a session file; BadSessionBlob (400) for bytes that cannot be one."""
    if len(raw) < _COUNT.size:
        raise BadSessionBlob("the session file is empty or truncated", reason="session_file_truncated")
    (n_tok,) = _COUNT.unpack_from(raw)
    end = _COUNT.size * (1 + n_tok)
    if n_tok == 0 or end >= len(raw):
        raise BadSessionBlob(
            f"the session file says it covers {n_tok} tokens, and {len(raw)} bytes leave no blob after them",
            reason="session_file_truncated",
        )
    return _little_endian(array("I", raw[_COUNT.size : end])).tolist(), raw[end:]


def _little_endian(ids: array) -> array:
    """`ids` (C unsigned ints, 4 bytes wherever this serves) swapped to or from the file's byte order, if the
    host's differs."""
    assert ids.itemsize == _COUNT.size
    if sys.byteorder == "big":
        ids.byteswap()
    return ids
