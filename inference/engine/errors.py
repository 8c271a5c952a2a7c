"""Errors the engine raises to its callers."""

from __future__ import annotations

from pathlib import Path


class LoadError(Exception):
    """A model could not be loaded. Names the file and what is wrong with it, so an operator can act on it."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class KVCacheFull(Exception):
    """Every KV-cache slot is taken; the caller should wait for a sequence to finish (or evict one)."""

    def __init__(self, max_concurrent: int):
        self.max_concurrent = max_concurrent
        super().__init__(f"all {max_concurrent} KV-cache slots are in use")


class ContextOverflow(Exception):
    """A sequence would grow past the context the KV cache was sized for."""

    def __init__(self, slot: int, needed: int, context_window: int):
        self.slot = slot
        self.needed = needed
        self.context_window = context_window
        super().__init__(f"slot {slot} needs {needed} positions but the context holds {context_window}")
