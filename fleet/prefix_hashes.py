"""A request's prompt as text, cut into chunks whose hashes chain, the one measure of shared prefixes that a router and
a serve instance both use.

A router cannot see an instance's prefix cache (token ids in KV blocks, inside a worker), and tokenizing every
request at the router would cost what the instance already pays. So both sides look at the request as the client
sent it: `prefix_text` writes its prompt as one text (each message's role and text, in order; the completion prompt;
the responses instructions and input), `chunk_hashes` cuts it into CHUNK_CHARS-character chunks from the start and
names each by a hash chained over every chunk before it (as the engine's block keys are), so two prompts share their
first n hashes exactly when they share their first n chunks. Only whole chunks count: a prompt's last partial chunk
is never matched.

The router records the hashes of what it sent each instance (fleet/prefix_index.py); a serve instance records those of
what it served (`ServedPrefixes`, when it registers with a router) and reports the newest in its heartbeats, so
several routers see what every one of them sent. Both are a picture of the instance's cache, not the cache: docs/
fleet.md says what is exact and what is estimated.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from threading import Lock
from typing import Any

CHUNK_CHARS = 64  # the wire's chunk: a router and its instances must agree on it, so it is no setting
_SEP_FIELD, _SEP_MESSAGE = "\x1f", "\x1e"


def prefix_text(body: Any) -> str:
    """The prompt of a /v1 generation body as one text in the order a model reads it ("" for a body without one):
    chat `messages`, completion `prompt` (text, texts, or token ids), responses `instructions` then `input`."""
    if not isinstance(body, dict):
        return ""
    parts: list[str] = []
    if isinstance(body.get("instructions"), str):
        parts.append(_message("system", body["instructions"]))
    for key in ("messages", "input", "prompt"):
        value = body.get(key)
        if isinstance(value, str):
            parts.append(_message("user" if key != "prompt" else "", value))
        elif isinstance(value, list):
            parts.extend(_item(item) for item in value)
    return "".join(parts)


def _item(item: Any) -> str:
    """One message (or input item, or prompt element) as text."""
    if isinstance(item, dict):
        return _message(str(item.get("role") or item.get("type") or ""), _content(item.get("content")))
    return _message("", _content(item))


def _content(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts (images and other parts leave a mark)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_content(part) for part in content)
    if isinstance(content, dict):
        text = content.get("text")
        return text if isinstance(text, str) else f"<{content.get('type', 'part')}>"
    return str(content)  # a token id of a completion prompt


def _message(role: str, text: str) -> str:
    return f"{role}{_SEP_FIELD}{text}{_SEP_MESSAGE}"


def chunk_hashes(text: str, limit: int | None = None) -> list[str]:
    """The chained hash of each whole CHUNK_CHARS chunk of `text`, in order (at most `limit`): hex strings, 16
    characters, the i-th naming the first i + 1 chunks."""
    hashes: list[str] = []
    parent = b""
    count = len(text) // CHUNK_CHARS
    if limit is not None:
        count = min(count, limit)
    for i in range(count):
        parent = hashlib.blake2b(
            parent + text[i * CHUNK_CHARS : (i + 1) * CHUNK_CHARS].encode(), digest_size=8
        ).digest()
        hashes.append(parent.hex())
    return hashes


class ServedPrefixes:
    """The chunk hashes of the prompts a serve instance served for one model, newest first, at most `capacity`
    (least recently served dropped first, like the instance's own prefix cache), emptied when the instance's caches
    are (`report` with a new epoch). Thread-safe: requests record while the registration agent reports."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.epoch: str | None = None
        self._hashes: OrderedDict[str, None] = OrderedDict()
        self._lock = Lock()

    def record(self, hashes: Iterable[str]) -> None:
        """A prompt was served: its hashes become the newest (its first chunk's last, so a prompt's own prefixes are
        never older than its longer ones)."""
        if self.capacity <= 0:
            return
        with self._lock:
            for h in reversed(list(hashes)):
                self._hashes[h] = None
                self._hashes.move_to_end(h)
            while len(self._hashes) > self.capacity:
                self._hashes.popitem(last=False)

    def report(self, epoch: str) -> list[str]:
        """The hashes to report under `epoch`, newest first; none kept from an earlier epoch (those recorded before
        the first report belong to the first epoch)."""
        with self._lock:
            if epoch != self.epoch:
                if self.epoch is not None:
                    self._hashes.clear()
                self.epoch = epoch
            return list(reversed(self._hashes))


_served: dict[str, ServedPrefixes] = {}
_served_lock = Lock()


def served_prefixes(model_id: str, capacity: int | None = None) -> ServedPrefixes:
    """This process's record of what it served for `model_id` (made on first use with `capacity`, else the
    PANTHEON_FLEET_PREFIX_REPORT setting)."""
    with _served_lock:
        if model_id not in _served:
            if capacity is None:
                from django.conf import settings

                capacity = settings.PANTHEON_FLEET_PREFIX_REPORT
            _served[model_id] = ServedPrefixes(capacity)
        return _served[model_id]


def record_served(model_id: str, raw_body: bytes) -> None:
    """A serve instance admitted the /v1 generation request `raw_body` (its JSON, as the client sent it and as the
    router read it) for `model_id`: its prompt's hashes are recorded for the heartbeat."""
    prefixes = served_prefixes(model_id)
    if prefixes.capacity > 0:
        try:
            body = json.loads(raw_body)
        except ValueError:
            return
        prefixes.record(chunk_hashes(prefix_text(body)))
