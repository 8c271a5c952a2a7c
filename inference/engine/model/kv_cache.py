"""Preallocated KV storage: one fixed block of keys and values per layer, carved into slots.

A slot holds one sequence's keys and values, positions `[0, length)`. Whoever allocates a slot owns it until it
frees it: a slot belongs to a sequence, not to a request, so a chat session can keep its KV between requests, a
shared prefix can be kept by truncating instead of recomputing, and a slot's KV is one fixed region per layer
(`keys[layer][slot, :, :length]`) that can be copied out to bytes and back in. The bookkeeping (free list, lengths)
lives on the host as plain ints, so scheduling never waits on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.errors import ContextOverflow, KVCacheFull


@dataclass(slots=True)
class CacheView:
    """Where one forward step writes its new keys and values and what it attends over."""

    positions: torch.Tensor  # [B, S] long: absolute position of each new token (also its RoPE index)
    write_rows: torch.Tensor  # [B * S * Hkv] long: where each new (token, kv head) row of hd goes in a layer's cache
    rows: slice | torch.Tensor  # the slots as a slice when they are consecutive (read as a view), else an index
    length: int  # keys attended over: positions [0, length) of each row's slot
    mask: torch.Tensor | None  # [B, 1, S, length] bool, True = attend; None when every row attends to everything


class KVCache:
    """Keys and values of every layer, allocated once: `[max_concurrent, num_kv_heads, context_window, head_dim]`
    each (one slot per sequence that may run)."""

    def __init__(
        self,
        *,
        num_layers: int,
        max_concurrent: int,
        num_kv_heads: int,
        context_window: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.max_concurrent = max_concurrent
        self.context_window = context_window
        self.device = torch.device(device)
        shape = (max_concurrent, num_kv_heads, context_window, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._lengths: list[int | None] = [None] * max_concurrent  # None = free
        self._positions = torch.arange(context_window, device=device)
        self._kv_heads = torch.arange(num_kv_heads, device=device)

    # -- slot bookkeeping -------------------------------------------------------------------------------------

    def allocate(self) -> int:
        """The lowest free slot (so a full batch tends to be consecutive slots, which read without a copy)."""
        for slot, length in enumerate(self._lengths):
            if length is None:
                self._lengths[slot] = 0
                return slot
        raise KVCacheFull(self.max_concurrent)

    def free(self, slot: int) -> None:
        """Releases a slot; freeing a free slot is a no-op."""
        self._check_range(slot)
        self._lengths[slot] = None

    def length(self, slot: int) -> int:
        """Tokens held in that slot's KV."""
        length = self._lengths[self._check_range(slot)]
        if length is None:
            raise ValueError(f"KV-cache slot {slot} is not allocated")
        return length

    def truncate(self, slot: int, length: int) -> None:
        """Forgets positions `[length, ...)`; the rows stay in memory and are overwritten by the next tokens."""
        if not 0 <= length <= self.length(slot):
            raise ValueError(f"cannot truncate slot {slot} of length {self.length(slot)} to {length}")
        self._lengths[slot] = length

    def advance(self, slots: list[int], count: int) -> None:
        """Records that `count` tokens were written after each slot's current length."""
        for slot in slots:
            self._lengths[slot] += count

    def _check_range(self, slot: int) -> int:
        if not 0 <= slot < self.max_concurrent:
            raise ValueError(f"KV-cache slot {slot} does not exist (max_concurrent={self.max_concurrent})")
        return slot

    # -- one forward step --------------------------------------------------------------------------------------

    def view(self, slots: list[int], count: int) -> CacheView:
        """The view for appending `count` tokens to each of `slots` (every slot allocated, no duplicates)."""
        starts = [self.length(slot) for slot in slots]
        longest = max(starts) + count
        if longest > self.context_window:
            slot = slots[starts.index(max(starts))]
            raise ContextOverflow(slot, longest, self.context_window)
        if len(set(slots)) != len(slots):
            raise ValueError(f"a slot appears twice in one step: {slots}")
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        slot_index = torch.tensor(slots, device=self.device)
        start_index = torch.tensor(starts, device=self.device)
        positions = start_index[:, None] + self._positions[:count]  # [B, S]
        mask = None
        if count > 1 or min(starts) != max(starts):
            mask = (self._positions[:longest] <= positions[:, :, None]).unsqueeze(1)  # [B, 1, S, L]
        rows = slice(slots[0], slots[0] + len(slots)) if consecutive else slot_index
        # row index into a layer's cache seen as [max_concurrent * Hkv * context_window, hd], in [B, S, Hkv] order
        heads = slot_index[:, None, None] * len(self._kv_heads) + self._kv_heads  # [B, 1, Hkv]
        write_rows = (heads * self.context_window + positions[:, :, None]).flatten()
        return CacheView(positions=positions, write_rows=write_rows, rows=rows, length=longest, mask=mask)

    def update(
        self, layer: int, view: CacheView, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores a step's new keys/values and returns everything the step attends over."""
        # k, v: [B, S, Hkv, hd] -> returns keys, values: [B, Hkv, L, hd]
        keys, values = self.keys[layer], self.values[layer]
        head_dim = keys.shape[-1]
        keys.view(-1, head_dim).index_copy_(0, view.write_rows, k.reshape(-1, head_dim))
        values.view(-1, head_dim).index_copy_(0, view.write_rows, v.reshape(-1, head_dim))
        return keys[view.rows, :, : view.length], values[view.rows, :, : view.length]
