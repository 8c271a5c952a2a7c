"""One shared-memory file that holds a CPU model's weights, so another process can map the very bytes it serves.

CUDA shares a storage through an IPC handle; on a CPU host the equivalent is a file in shared memory that both
processes map. The file is created owner-only (as CUDA's own IPC files are), so only the serving user can attach.
It is unlinked when the arena is closed or collected: an unloaded model leaves no file behind, and a process that
mapped it keeps its mapping until it lets go.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import weakref
from pathlib import Path

import torch

ALIGNMENT = 64  # every carved region starts on a cache line, which also aligns it for any element size
SHM_DIR = Path("/dev/shm")


def aligned(offset: int) -> int:
    """`offset` rounded up to the next ALIGNMENT boundary."""
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SharedArena:
    """`nbytes` of shared memory backed by one file; `carve` hands out typed views of it."""

    def __init__(self, nbytes: int):
        if nbytes <= 0:
            raise ValueError(f"an arena needs a positive size, got {nbytes}")
        folder = SHM_DIR if SHM_DIR.is_dir() else Path(tempfile.gettempdir())
        self.path = str(folder / f"pantheon-weights-{os.getpid()}-{secrets.token_hex(8)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._finalizer = weakref.finalize(self, _unlink, self.path)
        try:
            os.fchmod(fd, 0o600)  # the umask may only remove bits, but say it outright
            # Reserved now, not on first touch: a shared-memory folder too small for the weights (a container's
            # default /dev/shm) then fails the load here instead of killing the worker with SIGBUS mid-copy.
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            self._finalizer()
            raise MemoryError(f"{folder} has no room for {nbytes} bytes of attachable weights: {exc}") from exc
        finally:
            os.close(fd)
        self.tensor = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel()

    def carve(self, offset_bytes: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous `dtype` view of `shape` starting `offset_bytes` into the arena (a multiple of ALIGNMENT)."""
        if offset_bytes % ALIGNMENT:
            raise ValueError(f"offset {offset_bytes} is not {ALIGNMENT}-byte aligned")
        count = 1
        for size in shape:
            count *= size
        end = offset_bytes + count * dtype.itemsize
        if offset_bytes < 0 or end > self.nbytes:
            raise ValueError(f"bytes {offset_bytes}..{end} lie outside the {self.nbytes}-byte arena")
        return self.tensor[offset_bytes:end].view(dtype).view(shape)

    def close(self) -> None:
        """Unlinks the file (idempotent). Views stay valid; no other process can attach from now on."""
        self._finalizer()


def place_in_arena(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> tuple[SharedArena, dict[str, torch.Tensor]]:
    """Copies `tensors` (converted to `dtype`) into one new arena and returns it with the copies. Names bound to the
    same tensor object (tied weights) get one region, so they stay one tensor."""
    offsets: dict[int, int] = {}  # by source tensor
    end = 0
    for tensor in tensors.values():
        if id(tensor) not in offsets:
            offsets[id(tensor)] = aligned(end)
            end = offsets[id(tensor)] + tensor.numel() * dtype.itemsize
    arena = SharedArena(max(end, ALIGNMENT))
    placed: dict[int, torch.Tensor] = {}
    for tensor in tensors.values():
        if id(tensor) not in placed:
            placed[id(tensor)] = arena.carve(offsets[id(tensor)], tuple(tensor.shape), dtype).copy_(tensor)
    return arena, {name: placed[id(tensor)] for name, tensor in tensors.items()}
