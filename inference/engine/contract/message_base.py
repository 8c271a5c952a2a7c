"""What every message of the worker protocol is (messages.py says how they travel), and the error for a frame that
is not one. Apart from messages.py so that both directions' messages build on it."""

from __future__ import annotations

import msgspec


class ProtocolError(ValueError):
    """A frame that is not a message the receiver accepts. `request_id` is the id the frame seemed to carry (its
    second element, when that is a string), so the receiver can still fail that one request instead of leaving it
    waiting."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


class Message(msgspec.Struct, array_like=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every message. Subclasses set `tag` (their one-letter kind on the wire)."""
