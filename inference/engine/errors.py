"""Errors the engine raises to its callers."""

from __future__ import annotations

from pathlib import Path


class LoadError(Exception):
    """A model could not be loaded. Names the file and what is wrong with it, so an operator can act on it."""

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
