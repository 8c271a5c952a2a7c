"""What a checkpoint path is, read without torch: its format, architecture and size on disk.

The control plane and `manage.py load_model` use this to refuse a bad path before a worker is involved, and to fill
the catalogue row. The worker reads the weights themselves (inference/engine/loading.py) and has the last word on
whether they load.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inference.models import ModelFormat
from pantheon_site.errors import LoadFailed

GGUF_MAGIC = b"GGUF"
WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(slots=True)
class CheckpointInfo:
    path: str  # absolute
    format: str  # ModelFormat value
    architecture: str  # "" when it cannot be read here (the worker then reports why the load fails)
    size_bytes: int

    @property
    def default_name(self) -> str:
        """The served name a load without `name` gets: the file or directory name, without a .gguf suffix."""
        name = Path(self.path).name
        return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def inspect_checkpoint(path: str) -> CheckpointInfo:
    """Raises LoadFailed: 404 when nothing is at `path`, 400 when it is neither a Hugging Face checkpoint
    directory (config.json) nor a GGUF file."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise LoadFailed(f"{path}: no such file or directory", status=404, reason="not_found")
    if resolved.is_dir():
        config = resolved / "config.json"
        if not config.is_file():
            raise LoadFailed(f"{path}: a directory without config.json is not a checkpoint", status=400,
                             reason="not_a_checkpoint")  # fmt: skip
        size = sum(f.stat().st_size for f in resolved.iterdir() if f.suffix in WEIGHT_SUFFIXES)
        return CheckpointInfo(str(resolved), ModelFormat.HF, _hf_architecture(config), size)
    if resolved.suffix.lower() != ".gguf":
        raise LoadFailed(f"{path}: not a Hugging Face checkpoint directory or a .gguf file", status=400,
                         reason="not_a_checkpoint")  # fmt: skip
    return CheckpointInfo(str(resolved), ModelFormat.GGUF, _gguf_architecture(resolved), resolved.stat().st_size)


def _hf_architecture(config: Path) -> str:
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return ""
    return str(data.get("model_type") or "")[:64]


def _gguf_architecture(path: Path) -> str:
    try:
        with path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                return ""
        from gguf import GGUFReader  # numpy only; maps the file without reading the tensors

        field = GGUFReader(path).get_field("general.architecture")
        return str(field.contents())[:64] if field is not None else ""
    except Exception:  # a damaged file: the worker's loader names the problem when the load runs
        return ""
