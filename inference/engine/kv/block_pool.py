"""The KV pool's bookkeeping: which blocks are free, who holds each one, and which hold a reusable prefix.

KV lives in fixed-size blocks (kv_cache.py); a sequence's KV is a list of blocks. A block is held by every table
that lists it (`refs`), so two sequences that start with the same tokens hold the same blocks once. A full block is
named by a key chained over the tokens before it (the previous block's hash and this block's token ids, as vLLM's
automatic prefix caching does), so a new prompt finds the blocks of any earlier sequence that began the same way.
When the last holder lets go, a named block is not wiped: it stays findable, in least-recently-released order, until
an allocation needs it (`cached`); an unnamed one is free at once. Named blocks are also found by the key of the
block before them (`children`), so a prompt that goes on differently in the middle of a block can still take the
positions it shares with one (kv_cache.py's `reuse_prefix`).

The key holds the token ids themselves, so a dict lookup compares them exactly: two different prefixes can only
share a block if their earlier blocks' 64-bit hashes collide. All of this is plain Python on the host, so scheduling
never waits on the device.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from inference.engine.errors import KVCacheFull

BlockKey = tuple[int, tuple[int, ...]]  # (the previous block's chain hash, or 0 for the first; this block's tokens)


def chain_keys(token_ids: list[int], block_size: int, parent: int = 0) -> list[BlockKey]:
    """The key of every full block of `token_ids`, the first one chained to `parent`."""
    keys = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = (parent, tuple(token_ids[start : start + block_size]))
        keys.append(key)
        parent = hash(key)
    return keys


class BlockPool:
    """`num_blocks` blocks, each free, held (refs > 0) or cached (free but still named by its key).

    `reclaim` is called when no block is free or cached: it may release holders (idle sessions) and returns whether
    it freed anything, so an allocation can try again before it fails with KVCacheFull. `evicting(block, key)` is
    called when an allocation takes back a cached block, before its KV is overwritten, so a host tier can keep a copy
    (kv/host_tier.py).
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("a block pool needs at least one block of at least one position")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refs = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack: the lowest block comes out first
        self._cached: OrderedDict[int, None] = OrderedDict()  # unheld named blocks, least recently released first
        self._key_of: list[BlockKey | None] = [None] * num_blocks
        self._by_key: dict[BlockKey, int] = {}
        self._by_parent: dict[int, set[int]] = {}  # a chain hash -> the named blocks that follow it
        self.reclaim: Callable[[], bool] = lambda: False
        self.evicting: Callable[[int, BlockKey], None] = lambda block, key: None

    # -- counts ------------------------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks no table holds (cached ones included: they are taken back on demand)."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        """Blocks some table holds, each counted once however many tables share it."""
        return self.num_blocks - self.num_free

    # -- holding and letting go ------------------------------------------------------------------------------------

    def allocate(self) -> int:
        """A block for new KV, held once: a free one, else the least recently released cached one (forgetting its
        prefix), else whatever `reclaim` frees. Raises KVCacheFull."""
        while not self._free and not self._cached:
            if not self.reclaim():
                raise KVCacheFull(self.num_blocks)
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._cached.popitem(last=False)
            self.evicting(block, self._key_of[block])
            self._unname(block)
        self.refs[block] = 1
        return block

    def hold(self, block: int) -> None:
        """One more holder of an allocated or cached block."""
        if self.refs[block] == 0:
            if block not in self._cached:
                raise ValueError(f"block {block} is free")
            del self._cached[block]
        self.refs[block] += 1

    def release(self, block: int) -> None:
        """One holder fewer; the last one's release frees the block, or caches it when it is named."""
        if self.refs[block] <= 0:
            raise ValueError(f"block {block} is not held")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if self._key_of[block] is None:
                self._free.append(block)
            else:
                self._cached[block] = None

    # -- prefixes --------------------------------------------------------------------------------------------------

    def name(self, block: int, key: BlockKey) -> None:
        """Records that a held block is full and holds the prefix `key` names. When another block already holds it
        (two sequences computed the same prefix side by side) the first stays the one found."""
        if self._key_of[block] is None and key not in self._by_key:
            self._key_of[block] = key
            self._by_key[key] = block
            self._by_parent.setdefault(key[0], set()).add(block)

    def _unname(self, block: int) -> None:
        key = self._key_of[block]
        del self._by_key[key]
        siblings = self._by_parent[key[0]]
        siblings.discard(block)
        if not siblings:
            del self._by_parent[key[0]]
        self._key_of[block] = None

    def is_named(self, block: int) -> bool:
        return self._key_of[block] is not None

    def find(self, key: BlockKey) -> int | None:
        """The block that holds the prefix `key` names, if it is still in the pool (held or cached)."""
        return self._by_key.get(key)

    def longest_start(self, parent: int, token_ids: list[int]) -> tuple[int | None, int]:
        """Of the named blocks that follow the chain hash `parent`, the one whose tokens begin with the longest run
        of `token_ids`, and that run's length ((None, 0) when none begins with the first of them)."""
        best, best_common = None, 0
        for block in self._by_parent.get(parent, ()):
            tokens = self._key_of[block][1]
            common = 0
            for mine, theirs in zip(token_ids, tokens, strict=False):  # `token_ids` may be shorter
                if mine != theirs:
                    break
                common += 1
            if common > best_common:
                best, best_common = block, common
        return best, best_common

    def forget_prefixes(self) -> None:
        """Drops every name (the weights changed, so no cached KV is valid); cached blocks become free."""
        self._by_key.clear()
        self._by_parent.clear()
        self._key_of = [None] * self.num_blocks
        self._free.extend(self._cached)
        self._cached.clear()
