"""Where every router finds a session: the session -> instance map and each session's last export, in Redis so that
all router processes agree (PANTHEON_FLEET_REDIS_URL), or in this process's memory without it (one router only).

A session's entry names the instance that holds its KV and that instance's epoch when it took the session: an
instance that restarted under the same id (a new epoch) no longer holds it. Entries last `ttl_s` from the session's
last turn, as long as an instance keeps an idle session (PANTHEON_SESSION_IDLE_TTL_S). A new session is claimed with
SET NX, so two routers that place one at once agree on the first claim; a session whose instance is gone is moved with
a compare-and-set, so only one router re-homes it (and restores it there).

The export is the session file (inference/services/session_file.py) of the last `POST /admin/session/export` that
passed through a router, kept `ttl_s` and only up to `export_max_bytes` (a larger one is not kept, and an older one
of the session is dropped: restoring it would lose the turns since).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_PREFIX = "pantheon:fleet:"

# KEYS[1] the session's entry; ARGV: the entry expected, the new entry, the TTL in ms. Returns the entry it holds after.
_MOVE = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return ARGV[2]
end
return held
"""


@dataclass(frozen=True, slots=True)
class Holder:
    """Which instance holds a session's KV, and under which of its epochs it took it."""

    instance_id: str
    epoch: str

    def encode(self) -> str:
        return f"{self.epoch}\n{self.instance_id}"

    @classmethod
    def decode(cls, raw: str | bytes | None) -> Holder | None:
        if raw is None:
            return None
        if isinstance(raw, bytes):
            raw = raw.decode()
        epoch, _, instance_id = raw.partition("\n")
        return cls(instance_id, epoch)


class SessionStore:
    """The map and the exports; `redis` a redis.asyncio client, or None to keep them in memory."""

    def __init__(self, redis, *, ttl_s: float, export_max_bytes: int):
        self.redis = redis
        self.ttl_s = ttl_s
        self.export_max_bytes = export_max_bytes
        self._memory: dict[str, tuple[float, str | bytes]] = {}  # key -> (expires at, value), without Redis

    @classmethod
    def from_url(cls, url: str, **kwargs) -> SessionStore:
        """A store on Redis at `url` ("" : in memory)."""
        if not url:
            return cls(None, **kwargs)
        import redis.asyncio

        return cls(redis.asyncio.from_url(url), **kwargs)

    @staticmethod
    def _key(kind: str, model_id: str, session_key: str) -> str:
        return f"{_PREFIX}{kind}:{model_id}\n{session_key}"

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    # -- the map -------------------------------------------------------------------------------------------------

    async def holder(self, model_id: str, session_key: str) -> Holder | None:
        return Holder.decode(await self._get(self._key("session", model_id, session_key)))

    async def claim(self, model_id: str, session_key: str, holder: Holder) -> Holder:
        """`holder` takes the session unless one already holds it; returns the one that does."""
        key = self._key("session", model_id, session_key)
        if self.redis is None:
            held = self._get_memory(key)
            if held is None:
                self._memory[key] = (time.monotonic() + self.ttl_s, holder.encode())
                return holder
            return Holder.decode(held)
        if await self.redis.set(key, holder.encode(), nx=True, px=self._ttl_ms):
            return holder
        return Holder.decode(await self.redis.get(key)) or await self.claim(model_id, session_key, holder)

    async def move(self, model_id: str, session_key: str, gone: Holder, holder: Holder) -> Holder:
        """The session leaves `gone` for `holder`, unless another router moved it first; returns its holder after."""
        key = self._key("session", model_id, session_key)
        if self.redis is None:
            held = self._get_memory(key)
            if held is None or held == gone.encode():
                self._memory[key] = (time.monotonic() + self.ttl_s, holder.encode())
                return holder
            return Holder.decode(held)
        return Holder.decode(await self.redis.eval(_MOVE, 1, key, gone.encode(), holder.encode(), self._ttl_ms))

    async def touch(self, model_id: str, session_key: str) -> None:
        """The session took a turn: its entry and its export last `ttl_s` from now."""
        for kind in ("session", "export"):
            key = self._key(kind, model_id, session_key)
            if self.redis is None:
                if (value := self._get_memory(key)) is not None:
                    self._memory[key] = (time.monotonic() + self.ttl_s, value)
            else:
                await self.redis.pexpire(key, self._ttl_ms)

    # -- the exports ---------------------------------------------------------------------------------------------

    async def keep_export(self, model_id: str, session_key: str, session_file: bytes) -> bool:
        """The session's latest export; False (and no export of it kept) when it is over `export_max_bytes`."""
        key = self._key("export", model_id, session_key)
        if len(session_file) > self.export_max_bytes:
            await self._delete(key)
            return False
        if self.redis is None:
            self._memory[key] = (time.monotonic() + self.ttl_s, bytes(session_file))
        else:
            await self.redis.set(key, session_file, px=self._ttl_ms)
        return True

    async def export(self, model_id: str, session_key: str) -> bytes | None:
        value = await self._get(self._key("export", model_id, session_key))
        return value if value is None or isinstance(value, bytes) else value.encode()

    # -- storage -------------------------------------------------------------------------------------------------

    async def _get(self, key: str) -> str | bytes | None:
        return self._get_memory(key) if self.redis is None else await self.redis.get(key)

    def _get_memory(self, key: str) -> str | bytes | None:
        entry = self._memory.get(key)
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            del self._memory[key]
            return None
        return entry[1]

    async def _delete(self, key: str) -> None:
        if self.redis is None:
            self._memory.pop(key, None)
        else:
            await self.redis.delete(key)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
