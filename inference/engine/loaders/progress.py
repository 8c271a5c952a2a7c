"""How far a load has read its checkpoint: tensors and bytes read of the totals, counted by the loader thread and
read by the worker's loop, which reports it to the control plane (LOAD_PROGRESS) while the load runs.

One thread writes, another reads plain ints: a reader may see a count a tensor behind, never a torn value."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ReadProgress:
    tensors_total: int = 0
    bytes_total: int = 0
    tensors_read: int = 0
    bytes_read: int = 0

    def expect(self, tensors: int, nbytes: int) -> None:
        """The totals, once the loader knows what it will read."""
        self.tensors_total, self.bytes_total = tensors, nbytes

    def read(self, nbytes: int) -> None:
        """One more tensor of `nbytes` bytes (as stored in the file) was read."""
        self.tensors_read += 1
        self.bytes_read += nbytes

    def counts(self) -> tuple[int, int, int, int]:
        return self.tensors_read, self.tensors_total, self.bytes_read, self.bytes_total
