"""A second tier of the prefix cache in host memory: the KV of named blocks the pool takes back, kept under a byte
budget, and copied back into the pool when a prompt's chain of cached blocks reaches them.

The pool (block_pool.py) forgets a cached block's prefix when an allocation needs the block. With a host tier the
pool first hands the block over (`BlockPool.evicting`): every layer's keys and values of that block are copied into a
slot of one preallocated host tensor, found again by the block's key (the chain key, so the same exact comparison of
token ids as the pool's own lookup). `KVCache.reuse_prefix` continues a prompt's chain here where the pool's ends,
so a long shared system prompt or an idle conversation pushed out of a device's pool is copied back, not prefilled
again: SGLang's hierarchical cache, vLLM's CPU offloading and llama.cpp's `--cache-ram` do the same. A block moves:
restored, it leaves the tier (it is in the pool again, named), and is copied out again if the pool evicts it again.
Inside the tier the least recently stored entry goes first when a new one needs room.

On CUDA the tier is pinned memory. A block is copied out on the current stream (ordered before any later write to
that pool block), without the host waiting for it; a block is copied back on a side stream that first waits for the
current stream's work so far (the copy out into the same host slot, the zeroing of the new pool block), and the
current stream then waits for the side stream's copy, so the next step's attention reads the restored KV and the
host never blocks. On a CPU the copies are plain copies.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from inference.engine.kv.block_pool import BlockKey


class HostTier:
    """Room for as many blocks of every layer's keys and values (`layers`: the pool's tensors, keys then values, each
    `[Hkv, num_blocks + 1, block_size, hd]`) as `budget_bytes` holds; `capacity` is 0 when not even one fits."""

    def __init__(self, layers: list[torch.Tensor], budget_bytes: int):
        heads, _, block_size, head_dim = layers[0].shape
        self.layers = layers
        self.block_bytes = len(layers) * heads * block_size * head_dim * layers[0].element_size()
        self.capacity = max(0, budget_bytes) // self.block_bytes
        device = layers[0].device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        shape = (self.capacity, len(layers), heads, block_size, head_dim)
        self._store = torch.empty(shape, dtype=layers[0].dtype, pin_memory=self._stream is not None)
        self._slots: OrderedDict[BlockKey, int] = OrderedDict()  # key -> slot, least recently stored first
        self._free = list(range(self.capacity - 1, -1, -1))
        self.offloaded = 0  # blocks copied in from the pool since the tier was made
        self.restored = 0  # blocks copied back into the pool

    @property
    def bytes_used(self) -> int:
        """Bytes of KV the tier holds (taken slots, being copied back, included)."""
        return (self.capacity - len(self._free)) * self.block_bytes

    @torch.inference_mode()
    def offload(self, block: int, key: BlockKey) -> None:
        """Keeps a copy of pool block `block`'s KV, found by `key` (the pool's eviction callback); the least recently
        stored entry makes room when the tier is full. A key the tier already holds keeps its copy (same tokens, same
        KV) and counts as stored now."""
        if key in self._slots:
            self._slots.move_to_end(key)
            return
        if not self._free:
            if not self._slots:  # every slot is being copied back: keep nothing
                return
            _, slot = self._slots.popitem(last=False)
            self._free.append(slot)
        slot = self._free.pop()
        staged = torch.stack([layer[:, block] for layer in self.layers])  # [2L, Hkv, bs, hd] on the pool's device
        self._store[slot].copy_(staged, non_blocking=True)
        self._slots[key] = slot
        self.offloaded += 1

    def take(self, key: BlockKey) -> int | None:
        """The slot holding `key`'s KV, out of the tier's order so that no offload reuses it before `restore` (or
        `put_back`) lets it go; None when the tier does not hold it."""
        return self._slots.pop(key, None)

    def put_back(self, key: BlockKey, slot: int) -> None:
        """Returns a taken slot unrestored, as the least recently stored entry."""
        self._slots[key] = slot
        self._slots.move_to_end(key, last=False)

    @torch.inference_mode()
    def restore(self, slot: int, block: int) -> None:
        """Copies a taken slot's KV into pool block `block` and frees the slot (see the module docstring for the
        streams on CUDA)."""
        if self._stream is None:
            for layer, saved in zip(self.layers, self._store[slot], strict=True):
                layer[:, block].copy_(saved)
        else:
            current = torch.cuda.current_stream(self._stream.device)
            self._stream.wait_stream(current)
            with torch.cuda.stream(self._stream):
                staged = self._store[slot].to(self._stream.device, non_blocking=True)
                for layer, saved in zip(self.layers, staged, strict=True):
                    layer[:, block].copy_(saved, non_blocking=True)
            current.wait_stream(self._stream)
        self._free.append(slot)
        self.restored += 1

    def clear(self) -> None:
        """Forgets every entry (the weights changed, so no stored KV is valid)."""
        self._free.extend(self._slots.values())
        self._slots.clear()
