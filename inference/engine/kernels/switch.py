"""Whether the engine runs its C kernels: `PANTHEON_KERNELS=off` in the environment makes every wrapper see its
extension as missing, so the engine takes torch's path everywhere, as on a host built without a C compiler (the
fallback CI tests that way). Read once, at import: a worker process inherits it from `serve`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_SETTING = os.environ.get("PANTHEON_KERNELS", "on").strip().lower() or "on"
if _SETTING not in ("on", "off"):
    raise ValueError(f"PANTHEON_KERNELS must be 'on' or 'off', not {_SETTING!r}")
ENABLED = _SETTING == "on"


def load(name: str) -> ModuleType | None:
    """The extension `inference.engine.kernels.<name>`, or None when the kernels are off or it was not built."""
    if not ENABLED:
        return None
    try:
        return importlib.import_module(f"inference.engine.kernels.{name}")
    except ImportError:  # built without a C compiler
        return None
