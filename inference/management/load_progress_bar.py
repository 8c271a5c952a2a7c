"""The progress bar `manage.py load_model` draws while the running server loads: it polls GET /api/health/detailed
(no token, not audited) for the model's `load_progress` and redraws one line on stderr."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import TextIO

from inference.management.run_file import RunInfo

POLL_INTERVAL_S = 0.25
BAR_WIDTH = 30


def progress_line(progress: dict[str, int]) -> str:
    """`[######........] 12/30 tensors, 1.2/4.0 MiB` for one load_progress object."""
    done, total = progress["bytes_read"], progress["bytes_total"]
    filled = int(BAR_WIDTH * done / total) if total else 0
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    tensors = f"{progress['tensors_read']}/{progress['tensors_total']} tensors"
    return f"[{bar}] {tensors}, {done / 2**20:.1f}/{total / 2**20:.1f} MiB"


class LoadProgressBar:
    """`with LoadProgressBar(server, name, stream):` around the load call; draws while the call waits."""

    def __init__(self, server: RunInfo, name: str, stream: TextIO):
        self.url, self.name, self.stream = server.url + "/api/health/detailed", name, stream
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-progress", daemon=True)
        self._drawn = ""

    def __enter__(self) -> LoadProgressBar:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    def _progress(self) -> dict[str, int] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=POLL_INTERVAL_S * 4) as response:
                models = json.loads(response.read()).get("models", [])
        except (urllib.error.URLError, OSError, ValueError):
            return None
        # a name already served has a ready replica beside the one loading: the one with progress is this load's
        loading = (m.get("load_progress") for m in models if m.get("name") == self.name and m.get("load_progress"))
        return next(loading, None)

    def _run(self) -> None:
        while not self._stop.wait(POLL_INTERVAL_S):
            progress = self._progress()
            if progress is None:
                continue
            line = progress_line(progress)
            if line != self._drawn:
                self.stream.write("\r" + line)
                self.stream.flush()
                self._drawn = line
