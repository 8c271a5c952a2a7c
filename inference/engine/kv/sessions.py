"""Sessions: the conversations whose KV a model keeps between turns, keyed by the client's session id.

A turn of a session resumes the conversation its prompt continues: the conversation's slot (kv_cache.py) already
holds the history, so only the new tokens are prefilled. The history is matched token by token, so a turn is warm
exactly when its prompt renders the earlier turns as the model produced them. A conversation's last token may
differ (a stop token the chat template writes differently): that one position is recomputed.

One id may carry several conversations (a client's title request and its real turns); each keeps its own slot, up
to CONVERSATIONS_PER_SESSION, and a turn reports a conflict when conversations of its id competed: it found the one
it continues busy with another turn, or it had to drop another to make room. Only full blocks are shared between
conversations and with other requests, through the pool's prefix cache.

Between turns a session's blocks are pinned: they are not reclaimed while the pool has free or cached blocks. Only
when running sequences need blocks and none is left are idle conversations released, unwatched and least recently
used first (the pool's `reclaim`). `max_sessions` ids may hold KV at once; an idle id is released after `idle_ttl`
seconds, never while a watch is open, and `watch_grace` seconds after its last watch closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inference.engine.contract.messages import SessionInfo
from inference.engine.kv.kv_cache import KVCache

CONVERSATIONS_PER_SESSION = 4


@dataclass(slots=True, eq=False)
class Conversation:
    """One line of turns under a session id. `slot` holds its KV between turns; None while a turn runs on it."""

    slot: int | None
    token_ids: list[int]  # the history the slot's KV covers
    last_used: float


@dataclass(slots=True, eq=False)
class Session:
    session_id: str
    last_used: float
    conversations: list[Conversation] = field(default_factory=list)
    turns: int = 0  # turns submitted and not yet ended (waiting or running)

    @property
    def idle(self) -> list[Conversation]:
        return [c for c in self.conversations if c.slot is not None]


@dataclass(slots=True)
class Turn:
    """What `begin_turn` gives a sequence: the slot to prefill into, how much of its prompt is there already, and
    whether conversations of its id competed."""

    slot: int
    cached_tokens: int
    conflict: bool
    conversation: Conversation


class SessionError(Exception):
    """A session call refused; `reason` is its contract Reason value."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


class SessionTable:
    def __init__(
        self,
        cache: KVCache,
        *,
        max_sessions: int,
        idle_ttl: float,
        watch_grace: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cache = cache
        self.max_sessions = max_sessions
        self.idle_ttl = idle_ttl
        self.watch_grace = watch_grace
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.watchers: dict[str, int] = {}  # open watches per id (an id may be watched before its first turn)
        self.grace_until: dict[str, float] = {}  # ids whose last watch closed: released at that time
        cache.pool.reclaim = self.reclaim_one

    # -- turns ---------------------------------------------------------------------------------------------------

    def claim(self, session_id: str) -> Session | None:
        """The session a new turn runs under, counted as in flight; None when the id is new and `max_sessions` ids
        already hold KV (after releasing the expired ones)."""
        session = self.sessions.get(session_id)
        if session is None:
            if len(self.sessions) >= self.max_sessions:
                self.expire()
            if len(self.sessions) >= self.max_sessions:
                return None
            session = self.sessions[session_id] = Session(session_id, self.clock())
        session.turns += 1
        session.last_used = self.clock()
        return session

    def begin_turn(self, session: Session, prompt_ids: list[int]) -> Turn:
        """The slot a turn prefills into: its conversation's, when the prompt continues one (all of its history, or
        all but the last token), else a new conversation's, started from the prefix cache."""
        conflict, best, best_common = False, None, 0
        for conv in session.conversations:
            common = _common_prefix(conv.token_ids, prompt_ids)
            if common < len(conv.token_ids) - 1 or not conv.token_ids:
                continue
            if conv.slot is None:
                conflict = True  # the conversation this turn continues is busy with another turn
            elif best is None or common > best_common:
                best, best_common = conv, common
        if best is not None:
            slot, best.slot = best.slot, None
            self.cache.truncate(slot, min(best_common, len(prompt_ids) - 1))
            return Turn(slot, self.cache.length(slot), conflict, best)
        idle = session.idle
        if len(session.conversations) >= CONVERSATIONS_PER_SESSION and idle:
            self._drop(session, min(idle, key=lambda c: c.last_used))
            conflict = True
        slot = self.cache.allocate()
        cached = self.cache.reuse_prefix(slot, prompt_ids)
        conv = Conversation(None, [], self.clock())
        session.conversations.append(conv)
        return Turn(slot, cached, conflict, conv)

    def end_turn(self, session: Session, conversation: Conversation | None, slot: int | None) -> None:
        """A turn ended (finished, failed or aborted, admitted or not): its KV becomes its conversation's history,
        or is freed when the session was released meanwhile."""
        session.turns -= 1
        now = session.last_used = self.clock()
        if conversation is not None:
            kept = slot is not None and self.sessions.get(session.session_id) is session
            if kept and self.cache.length(slot):
                conversation.slot, conversation.token_ids, conversation.last_used = (
                    slot,
                    self.cache.token_ids(slot),
                    now,
                )
            else:
                if slot is not None:
                    self.cache.free(slot)
                if conversation in session.conversations:
                    session.conversations.remove(conversation)
        if not session.conversations and not session.turns:
            self.sessions.pop(session.session_id, None)

    # -- release -------------------------------------------------------------------------------------------------

    def release(self, session_id: str) -> bool:
        """Frees every idle conversation of the id now (turns in flight free theirs when they end); whether it held
        anything."""
        session = self.sessions.pop(session_id, None)
        self.grace_until.pop(session_id, None)
        if session is None:
            return False
        for conv in session.idle:
            self._drop(session, conv)
        return True

    def expire(self) -> list[str]:
        """Releases the ids idle past the TTL or past their watch's grace period; never a watched id or one with a
        turn in flight. Returns the released ids."""
        now = self.clock()
        expired = [
            sid
            for sid, s in self.sessions.items()
            if not s.turns
            and not self.watchers.get(sid)
            and (now - s.last_used >= self.idle_ttl or now >= self.grace_until.get(sid, float("inf")))
        ]
        for sid in expired:
            self.release(sid)
        for sid in [sid for sid, t in self.grace_until.items() if now >= t]:
            del self.grace_until[sid]
        return expired

    def reclaim_one(self) -> bool:
        """Frees the idle conversation that matters least (unwatched before watched, least recently used first),
        for an allocation that found the pool empty; False when none is left."""
        idle = [(s, c) for s in self.sessions.values() for c in s.idle]
        if not idle:
            return False
        session, conv = min(idle, key=lambda sc: (bool(self.watchers.get(sc[0].session_id)), sc[1].last_used))
        self._drop(session, conv)
        if not session.conversations and not session.turns:
            del self.sessions[session.session_id]
        return True

    def _drop(self, session: Session, conv: Conversation) -> None:
        session.conversations.remove(conv)
        if conv.slot is not None:
            self.cache.free(conv.slot)

    # -- watches -------------------------------------------------------------------------------------------------

    def watch(self, session_id: str, watching: bool) -> int:
        """Counts a watch opening or closing; the last one's close starts the grace period. Open watches after."""
        count = max(0, self.watchers.get(session_id, 0) + (1 if watching else -1))
        if count:
            self.watchers[session_id] = count
            self.grace_until.pop(session_id, None)
        else:
            self.watchers.pop(session_id, None)
            if not watching:
                self.grace_until[session_id] = self.clock() + self.watch_grace
        if session_id in self.sessions:
            self.sessions[session_id].last_used = self.clock()
        return count

    # -- export and restore --------------------------------------------------------------------------------------

    def conversation_to_export(self, session_id: str) -> Conversation:
        """The id's most recently used conversation; SessionError session_not_found or session_busy."""
        session = self.sessions.get(session_id)
        if session is None or not session.idle and not session.turns:
            raise SessionError("session_not_found", f"no live session {session_id!r}")
        if session.turns:
            raise SessionError("session_busy", f"a turn of session {session_id!r} is in flight; retry after it")
        return max(session.idle, key=lambda c: c.last_used)

    def restore(self, session_id: str, slot: int) -> None:
        """Installs a filled slot as a conversation of the id, replacing the one the restored history continues;
        SessionError session_capacity when the id is new and every place is taken (the slot is freed then)."""
        session = self.claim(session_id)
        if session is None:
            self.cache.free(slot)
            raise SessionError("session_capacity", f"all {self.max_sessions} session places hold a live session")
        token_ids = self.cache.token_ids(slot)
        for conv in session.idle:
            if _common_prefix(conv.token_ids, token_ids) == len(conv.token_ids):
                self._drop(session, conv)
        if len(session.conversations) >= CONVERSATIONS_PER_SESSION and session.idle:
            self._drop(session, min(session.idle, key=lambda c: c.last_used))
        session.conversations.append(Conversation(None, [], self.clock()))
        self.end_turn(session, session.conversations[-1], slot)

    # -- what an operator sees -----------------------------------------------------------------------------------

    def pinned_blocks(self) -> int:
        """Blocks held by idle conversations (each counted once)."""
        blocks: set[int] = set()
        for session in self.sessions.values():
            for conv in session.idle:
                blocks.update(self.cache.blocks(conv.slot))
        return len(blocks)

    def info(self) -> list[SessionInfo]:
        now = self.clock()
        return [
            SessionInfo(
                session_id=s.session_id,
                conversations=len(s.conversations),
                tokens=sum(len(c.token_ids) for c in s.idle),
                idle_seconds=now - s.last_used,
                watched=bool(self.watchers.get(s.session_id)),
                busy=bool(s.turns),
            )
            for s in sorted(self.sessions.values(), key=lambda s: s.last_used, reverse=True)
        ]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
