"""Paged KV storage: one pool of fixed-size blocks per layer, and a block table per sequence.

A slot is a handle to one sequence's KV: the blocks that hold its positions `[0, length)`, in order, and the token ids
they were computed from. Memory is spent on the tokens held, not on a full window per sequence, and sequences that
begin with the same tokens share those blocks (block_pool.py): a new slot starts from the longest run of cached full
blocks its prompt begins with, and from the positions after them that a cached block shares with it, copied into a
block of its own (`reuse_prefix`), so only the rest is prefilled. A slot belongs to whoever allocated
it until it is freed, so a session keeps its conversation's slot between turns and a turn continues it. With a
host tier (`host_cache_bytes`, host_tier.py) the cached blocks the pool takes back are copied to host memory first,
and a prompt's run of cached full blocks goes on there where the pool's ends.

Each layer's keys (and values) are one tensor `[num_kv_heads, num_blocks + 1, block_size, head_dim]`. The extra last
block is scratch: positions a step computes but no sequence keeps (the padding rows of a compiled decode step's
batch) are written there, and a decode row shorter than others in its batch reads it, masked, past its own blocks. A
step reads a sequence's keys by gathering its blocks in table order (on any device: torch has no paged
attention kernel for CPU); a lone sequence whose blocks are consecutive, as a fresh pool hands them out, is read as
a view without a copy. The gather writes into two buffers kept across steps (keys, values; every layer reuses them,
since a layer's attention is done before the next one reads), grown to the largest step read so far: a fresh
tensor of that size per layer and step costs more in page faults on a CPU than the copy itself. With the "flex"
attention backend nothing is gathered: every view carries its rows' block tables, and attention reads the pool in
place (model/flex_attention.py).

Only full blocks are shared. Before a slot writes into a partial last block that others hold or that is named as
a cached prefix (after `truncate`), the block is copied (copy on write).

The pool is allocated empty and a block is zeroed when it is first handed out (with the next few, in one op per
layer), not all at once: the pool includes the prefix cache's budget (kv_budget.py), and on a CPU memory that was
never written costs nothing, so the cache takes the host's memory as it fills rather than at load. Zeroes matter
because a step reads a block's positions past a row's length (masked: weight 0, but 0 times a NaN left in
uninitialized memory is NaN); a block that held KV before holds finite values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from inference.engine.errors import ContextOverflow
from inference.engine.kernels.paged_attention import kernel_serves
from inference.engine.kv.block_pool import BlockKey, BlockPool, chain_keys
from inference.engine.kv.host_tier import HostTier
from inference.engine.kv.long_tensor import long_tensor

ZEROED_AT_ONCE = 64  # blocks zeroed together when a fresh one is first handed out

# A change to the pool's tensors outside a step: ("zero", first, end) or ("copy", to, source, positions)
PoolChange = tuple[str, int, int] | tuple[str, int, int, int]


@dataclass(slots=True)
class CacheView:
    """Where one forward step writes its new keys and values and what it attends over."""

    positions: torch.Tensor  # [B, S] long: absolute position of each new token (also its RoPE index)
    write_rows: torch.Tensor  # [B * S * Hkv] long: where each new (token, kv head) row of hd goes in a layer's pool
    blocks: slice | torch.Tensor | None  # a slice of the blocks for one row read as a view, else [Hkv * B * nb] rows
    # of a layer's pool seen as [Hkv * (num_blocks + 1), block_size * hd], in (kv head, row, block) order
    # (scratch-padded); None for a view that carries `table` instead
    num_rows: int
    length: int  # keys attended over: positions [0, length) of each row
    mask: torch.Tensor | None  # [B, 1, S, length] bool, True = attend; None when every row attends to everything
    # a decode step the paged kernel serves (paged_attention.py), or any step of the flex backend: each row's blocks
    # [B, nb] long (scratch-padded) and its length after this step [B] long; None otherwise
    table: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


@dataclass(slots=True)
class BlockTable:
    """One slot's KV: `blocks[i]` holds positions `[i * block_size, (i + 1) * block_size)`; `token_ids` are the
    tokens whose KV is stored (its length); `hashes[i]` is the chain hash of full block i, for each block named so
    far (the next full block's key starts from the last of them)."""

    blocks: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


class KVCache:
    """Keys and values of every layer in a pool of `num_blocks` blocks of `block_size` positions; any sequence may
    hold up to `context_window` positions. `attention` is the backend that reads it (runner.ATTENTION_BACKENDS):
    "flex" views carry block tables instead of gather indices and masks."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        context_window: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        attention: str = "gather",
        host_cache_bytes: int = 0,
    ):
        self.attention = attention
        self.context_window = context_window
        self.block_size = block_size
        self.device = torch.device(device)
        self.pool = BlockPool(num_blocks, block_size)
        self.scratch = num_blocks  # the block past the pool, see the module docstring
        shape = (num_kv_heads, num_blocks + 1, block_size, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._zeroed = 0  # blocks below this were zeroed (see the module docstring)
        for layer in (*self.keys, *self.values):
            layer[:, self.scratch].zero_()
        self.lookup_tokens = 0  # prompt tokens reuse_prefix looked up, since the pool was made
        self.hit_tokens = 0  # of those, the tokens it reused
        self._tables: dict[int, BlockTable] = {}
        self._next_slot = 0
        self._positions = torch.arange(context_window, device=device)
        self._num_kv_heads = num_kv_heads
        self._gathered = [torch.empty(0, dtype=dtype, device=device) for _ in range(2)]  # keys, values
        self._head_offsets = torch.arange(num_kv_heads, device=device)[:, None] * (num_blocks + 1)  # [Hkv, 1]
        self.paged_decode = kernel_serves(self.device, dtype)  # decode views carry what the kernel reads
        self.journal: list[PoolChange] | None = None  # the changes made since the last step (see `change`)
        self.host: HostTier | None = None  # the prefix cache's second tier, in host memory
        if host_cache_bytes > 0:
            self.host = HostTier([*self.keys, *self.values], host_cache_bytes)
            self.pool.evicting = self.host.offload

    @property
    def zeroed_blocks(self) -> int:
        """Blocks [0, n) of the pool hold finite values (zeroed when first handed out, or written since); every block a
        slot holds is among them, the scratch block aside."""
        return self._zeroed

    @property
    def num_slots(self) -> int:
        """Slots allocated and not freed (running sequences and kept sessions)."""
        return len(self._tables)

    # -- slot bookkeeping -------------------------------------------------------------------------------------

    def allocate(self) -> int:
        """A new, empty slot (it holds no block until tokens are written to it)."""
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self._tables[slot] = BlockTable()
        return slot

    def free(self, slot: int) -> None:
        """Lets go of the slot's blocks (full ones stay cached for reuse); freeing a free slot is a no-op."""
        table = self._tables.pop(slot, None)
        if table is not None:
            for block in reversed(table.blocks):  # the last block is taken back first: the start stays findable
                self.pool.release(block)

    def length(self, slot: int) -> int:
        """Tokens held in that slot's KV."""
        return len(self._table(slot).token_ids)

    def token_ids(self, slot: int) -> list[int]:
        """The tokens whose KV the slot holds (a copy)."""
        return list(self._table(slot).token_ids)

    def blocks(self, slot: int) -> list[int]:
        """The blocks the slot holds, in position order (a copy)."""
        return list(self._table(slot).blocks)

    @torch.inference_mode()
    def truncate(self, slot: int, length: int) -> None:
        """Forgets positions `[length, ...)`: blocks past them are let go, and a partial last block that is shared or
        named is replaced by a private copy, so the next tokens written cannot change anyone else's KV."""
        table = self._table(slot)
        if not 0 <= length <= len(table.token_ids):
            raise ValueError(f"cannot truncate slot {slot} of length {len(table.token_ids)} to {length}")
        keep = -(-length // self.block_size)
        for block in table.blocks[keep:]:
            self.pool.release(block)
        del table.blocks[keep:]
        del table.token_ids[length:]
        del table.hashes[length // self.block_size :]
        if length % self.block_size:
            last = table.blocks[-1]
            if self.pool.refs[last] > 1 or self.pool.is_named(last):
                copy = self._allocate()
                self.change(("copy", copy, last, self.block_size))
                self.pool.release(last)
                table.blocks[-1] = copy

    @torch.inference_mode()
    def reuse_prefix(self, slot: int, token_ids: list[int]) -> int:
        """Starts an empty slot from the cached full blocks `token_ids` begins with, then from the first positions
        of the next block that a cached block shares with it (copied: the rest of that block is this prompt's own),
        leaving at least its last token to be computed (a step needs one to produce logits). Returns the number of
        tokens reused.

        The copy makes reuse as fine as a token rather than a block, as llama.cpp's slots and SGLang's radix cache
        reuse: chat prompts that share a system prompt or a template's opening rarely share it to a block's end."""
        table = self._table(slot)
        if table.token_ids:
            raise ValueError(f"slot {slot} is not empty")
        usable = token_ids[: len(token_ids) - 1]
        self._hold_chain(table, chain_keys(usable, self.block_size))
        rest = usable[len(table.token_ids) : len(table.token_ids) + self.block_size]
        source, common = self.pool.longest_start(table.hashes[-1] if table.hashes else 0, rest)
        if common:
            self.pool.hold(source)  # an allocation below may otherwise take it back from the cache
            try:
                copy = self._allocate()
            finally:
                self.pool.release(source)
            self.change(("copy", copy, source, common))
            table.blocks.append(copy)
            table.token_ids += rest[:common]
        self.lookup_tokens += len(token_ids)
        self.hit_tokens += len(table.token_ids)
        return len(table.token_ids)

    def _hold_chain(self, table: BlockTable, keys: list[BlockKey]) -> None:
        """Appends to an empty table the blocks of the longest run of `keys` the cache holds: each one found in the
        pool is held, each one found in the host tier is copied back into a new block, named and held. The whole run
        is held or taken out of the tier before the first copy, so the allocations the copies need cannot take back
        a block of the run."""
        run: list[tuple[BlockKey, int, int | None]] = []  # (key, pool block or -1, host slot or None)
        for key in keys:
            block = self.pool.find(key)
            slot = None if block is not None or self.host is None else self.host.take(key)
            if block is None and slot is None:
                break
            if block is not None:
                self.pool.hold(block)
            run.append((key, -1 if block is None else block, slot))
        for done, (key, block, slot) in enumerate(run):
            if slot is not None:
                try:
                    block = self._allocate()
                except BaseException:
                    self._let_go(run[done:])
                    raise
                self.host.restore(slot, block)
                self.pool.name(block, key)
            table.blocks.append(block)
            table.token_ids += key[1]
            table.hashes.append(hash(key))

    def _let_go(self, run: list[tuple[BlockKey, int, int | None]]) -> None:
        """Undoes `_hold_chain`'s first pass for the part of a run it did not reach."""
        for key, block, slot in run:
            if slot is None:
                self.pool.release(block)
            else:
                self.host.put_back(key, slot)

    def forget_prefixes(self) -> None:
        """Forgets every cached prefix, in the pool and the host tier (the weights changed)."""
        self.pool.forget_prefixes()
        if self.host is not None:
            self.host.clear()

    def advance(self, slot: int, token_ids: list[int]) -> None:
        """Records that `token_ids` were written after the slot's current length; names the blocks they filled."""
        table = self._table(slot)
        table.token_ids += token_ids
        named, full = len(table.hashes), len(table.token_ids) // self.block_size
        if full > named:
            parent = table.hashes[-1] if table.hashes else 0
            filled = table.token_ids[named * self.block_size : full * self.block_size]
            for block, key in zip(table.blocks[named:full], chain_keys(filled, self.block_size, parent), strict=True):
                self.pool.name(block, key)
                table.hashes.append(hash(key))

    @torch.inference_mode()
    def change(self, op: PoolChange) -> None:
        """Applies one change to the pool's tensors that is not a step's store: ("zero", first, end) zeroes blocks
        [first, end), ("copy", to, source, positions) copies a block's first positions into another. Every such
        change goes through here, so a split model's rank 0 can hand its `journal` to the other ranks, whose pools
        then hold what its pool holds (parallel/ranks.py)."""
        if op[0] == "zero":
            for layer in (*self.keys, *self.values):
                layer[:, op[1] : op[2]].zero_()
        else:
            _, to, source, positions = op
            for layer in (*self.keys, *self.values):
                layer[:, to, :positions] = layer[:, source, :positions]
        if self.journal is not None:
            self.journal.append(op)

    def _table(self, slot: int) -> BlockTable:
        table = self._tables.get(slot)
        if table is None:
            raise ValueError(f"KV-cache slot {slot} is not allocated")
        return table

    def _reserve(self, table: BlockTable, length: int) -> None:
        """Allocates the blocks positions `[0, length)` need (KVCacheFull when the pool has no more)."""
        while len(table.blocks) * self.block_size < length:
            table.blocks.append(self._allocate())

    def _allocate(self) -> int:
        """A block from the pool (KVCacheFull when it has none), zeroed first if it was never handed out before."""
        block = self.pool.allocate()
        if block >= self._zeroed:
            end = min(self.scratch, max(block + 1, self._zeroed + ZEROED_AT_ONCE))
            self.change(("zero", self._zeroed, end))
            self._zeroed = end
        return block

    # -- copying a slot's KV out and in (session export and restore) -------------------------------------------

    def read(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The slot's keys and values per layer, `[num_kv_heads, length, head_dim]` each, copied to the CPU."""
        table = self._table(slot)
        length = len(table.token_ids)
        blocks = torch.tensor(table.blocks, device=self.device)

        def gather(layer: torch.Tensor) -> torch.Tensor:
            rows = layer[:, blocks].flatten(1, 2)[:, :length]
            return rows.to("cpu", copy=True).contiguous()

        return [gather(k) for k in self.keys], [gather(v) for v in self.values]

    @torch.inference_mode()
    def write(self, slot: int, token_ids: list[int], keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Fills an empty slot with given KV (per layer `[num_kv_heads, len(token_ids), head_dim]`, on any device).
        Staged in the pool's device memory: KV already there (bench/gpu_check.py fills its contexts so) never crosses
        to the host and back."""
        table = self._table(slot)
        if table.token_ids:
            raise ValueError(f"slot {slot} is not empty")
        length = len(token_ids)
        if length > self.context_window:
            raise ContextOverflow(slot, length, self.context_window)
        self._reserve(table, length)
        blocks = torch.tensor(table.blocks, device=self.device)
        padded = len(table.blocks) * self.block_size
        for pool, given in zip((*self.keys, *self.values), (*keys, *values), strict=True):
            staged = torch.zeros(given.shape[0], padded, given.shape[2], dtype=pool.dtype, device=self.device)
            staged[:, :length] = given
            pool[:, blocks] = staged.view(given.shape[0], -1, self.block_size, given.shape[2])
        self.advance(slot, list(token_ids))

    # -- one forward step --------------------------------------------------------------------------------------

    def check_room(self, slot: int, count: int) -> None:
        """Raises ContextOverflow when the slot cannot take `count` more tokens."""
        length = self.length(slot) + count
        if length > self.context_window:
            raise ContextOverflow(slot, length, self.context_window)

    def view(self, slots: list[int], width: int) -> CacheView:
        """The view for appending `width` tokens to each of `slots` (a prompt's chunk: one slot; a decode batch:
        width 1). Allocates the blocks the new tokens need.

        The indices are built as Python ints and copied to the device once each (a table view's all in one tensor): a
        decode step of a small model costs less than the handful of tensor ops that would compute them."""
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears twice in one step: {slots}")
        for slot in slots:
            self.check_room(slot, width)
        tables = [self._table(slot) for slot in slots]
        starts = [len(t.token_ids) for t in tables]
        longest = max(starts) + width
        bs = self.block_size
        heads = range(self._num_kv_heads)
        per_head = (self.scratch + 1) * bs
        positions, write_rows = [], []
        for table, start in zip(tables, starts, strict=True):
            self._reserve(table, start + width)
            row_positions = range(start, start + width)
            positions.append(row_positions)
            for p in row_positions:
                base = table.blocks[p // bs] * bs + p % bs
                write_rows += [h * per_head + base for h in heads]
        nb = -(-longest // bs)
        if self.attention == "flex" or (width == 1 and self.paged_decode):
            return self._table_view(tables, starts, width, write_rows, nb)
        first = tables[0].blocks[0]
        mask = None
        if len(slots) == 1 and tables[0].blocks[:nb] == list(range(first, first + nb)):
            blocks: slice | torch.Tensor = slice(first, first + nb)
        else:
            table = long_tensor(self._padded_blocks(tables, nb), self.device)  # [B * nb]
            blocks = (self._head_offsets + table.view(1, -1)).view(-1)  # [Hkv * B * nb]
        flat_positions = [p for row in positions for p in row]
        position_index = long_tensor(flat_positions, self.device).view(len(slots), width)  # [B, S]
        if width > 1 or min(starts) != max(starts):
            mask = (self._positions[:longest] <= position_index[:, :, None]).unsqueeze(1)  # [B, 1, S, L]
        return CacheView(
            positions=position_index,
            write_rows=long_tensor(write_rows, self.device),
            blocks=blocks,
            num_rows=len(slots),
            length=longest,
            mask=mask,
        )

    def _table_view(
        self, tables: list[BlockTable], starts: list[int], width: int, write_rows: list[int], nb: int
    ) -> CacheView:
        """A view that carries its rows' block tables (a decode step's for the paged kernel, any step's for flex):
        every index cut from one tensor made from one list (each tensor made from a list has a fixed cost larger than
        the few dozen ints it holds)."""
        rows, count, writes = len(tables), len(tables) * width, len(write_rows)
        positions = [p for start in starts for p in range(start, start + width)]
        lengths = [start + width for start in starts]
        index = long_tensor(positions + lengths + write_rows + self._padded_blocks(tables, nb), self.device)
        # positions [B * S], lengths [B], write rows [B * S * Hkv], block table [B * nb]
        return CacheView(
            positions=index[:count].view(rows, width),
            write_rows=index[count + rows : count + rows + writes],
            blocks=None,
            num_rows=rows,
            length=max(starts) + width,
            mask=None,
            table=index[count + rows + writes :].view(rows, nb),
            lengths=index[count : count + rows],
        )

    def _padded_blocks(self, tables: list[BlockTable], nb: int) -> list[int]:
        """The first `nb` blocks of each table, padded with the scratch block, one row after another."""
        padded = []
        for table in tables:
            padded += table.blocks[:nb]
            padded += [self.scratch] * (nb - len(table.blocks))
        return padded

    def store(self, layer: int, view: CacheView, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores a step's new keys and values."""
        # k, v: [B, S, Hkv, hd]
        keys, values = self.keys[layer], self.values[layer]
        head_dim = keys.shape[-1]
        keys.view(-1, head_dim).index_copy_(0, view.write_rows, k.reshape(-1, head_dim).to(keys.dtype))
        values.view(-1, head_dim).index_copy_(0, view.write_rows, v.reshape(-1, head_dim).to(values.dtype))

    def update(
        self, layer: int, view: CacheView, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores a step's new keys/values and returns everything the step attends over (in the pool's dtype)."""
        # k, v: [B, S, Hkv, hd] -> returns keys, values: [B, Hkv, L, hd]
        self.store(layer, view, k, v)
        return self._gather(self.keys[layer], view, 0), self._gather(self.values[layer], view, 1)

    def _gather(self, pool: torch.Tensor, view: CacheView, buffer: int) -> torch.Tensor:
        heads, _, bs, hd = pool.shape
        if isinstance(view.blocks, slice):
            rows = pool[:, view.blocks]  # [Hkv, nb, bs, hd], a view
        else:
            needed = view.blocks.numel() * bs * hd
            if self._gathered[buffer].numel() < needed:
                self._gathered[buffer] = torch.empty(needed, dtype=pool.dtype, device=pool.device)
            out = self._gathered[buffer][:needed].view(-1, bs * hd)
            rows = torch.index_select(pool.view(-1, bs * hd), 0, view.blocks, out=out)  # [Hkv * B * nb, bs * hd]
        rows = rows.reshape(heads, view.num_rows, -1, hd).transpose(0, 1)  # [B, Hkv, nb * bs, hd]
        return rows[:, :, : view.length]
