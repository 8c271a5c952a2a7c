"""The folder where every process of one `serve` run writes its metrics (prometheus_client's multi-process mode).

prometheus_client decides at import whether values go to files, so the folder must be in the environment before
anything imports it: `serve` calls `prepare` first, and this module imports nothing of prometheus_client. The
workers inherit the environment. The folder is emptied at every start, so a pid reused from an earlier run never
adds its old values.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # the name prometheus_client reads (contract/metrics.py's too)


def prepare(run_dir: Path) -> Path:
    """Makes `run_dir`/metrics a fresh, empty folder and points PROMETHEUS_MULTIPROC_DIR at it."""
    if "prometheus_client" in sys.modules and os.environ.get(MULTIPROC_ENV) is None:
        raise RuntimeError("prometheus_client was imported before the metrics folder was set")
    folder = run_dir / "metrics"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ[MULTIPROC_ENV] = str(folder)
    return folder
