"""The resident memory of a server and its workers (a process and its children), sampled in a thread while a bench
drives the server: bench/overload.py and bench/faults.py report what it saw."""

from __future__ import annotations

import threading

import psutil


class MemoryWatch:
    """Samples the RSS of process `pid` and its children every `interval` s while it is entered."""

    def __init__(self, pid: int, interval: float = 0.25):
        self._process, self._interval = psutil.Process(pid), interval
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        total = 0
        for process in [self._process, *self._process.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except psutil.Error:  # a worker that just exited
                continue
        return total

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.rss())
            except psutil.Error:  # the server itself is gone (a bench that stops it)
                pass
            self._stop.wait(self._interval)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
