"""What a path on disk is as a checkpoint, decided in one place for the worker's loader and the control plane.

A directory with a config.json is a Hugging Face checkpoint; a `.gguf` file is a GGUF checkpoint; anything else,
or nothing at all, is refused with `NotACheckpoint` and a reason the caller turns into its own error (the loader a
LoadError, the control plane a 404 or 400 before any worker is involved). Reading what a checkpoint is takes no
torch and no Django: `config.json`'s model_type, or the GGUF header read by gguf's numpy-only reader, imported when
first needed. Whether the weights really load is the loader's to say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

GGUF_MAGIC = b"GGUF"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
MANIFEST_FILE = "manifest.json"  # what makes a directory a trainer's saved checkpoint (engine/weights/)

Format = Literal["hf", "gguf"]
Why = Literal["not_found", "not_a_checkpoint", "unreadable"]  # why a path is not a checkpoint


class NotACheckpoint(Exception):
    """`path` cannot be loaded: nothing is there (`reason` "not_found"), it is neither a checkpoint directory nor
    a GGUF file ("not_a_checkpoint"), or the system refuses to look (a name too long, no permission: "unreadable").
    `problem` says so in words; str() is "{path}: {problem}"."""

    def __init__(self, path: str | Path, reason: Why, problem: str):
        self.path = str(path)
        self.reason = reason
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class CheckpointCorrupt(ValueError):
    """A trainer checkpoint's manifest is missing or unreadable, or its weights are not the ones it recorded."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: str  # absolute, symlinks resolved
    format: Format
    architecture: str  # "" when it cannot be read here (the loader then says why the load fails)
    size_bytes: int  # of the weight files

    @property
    def default_name(self) -> str:
        """The served name a load without `name` gets: the file or directory name, without a .gguf suffix."""
        name = Path(self.path).name
        return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def checkpoint_format(path: str | Path) -> Format:
    """ "hf" for a directory with a config.json, "gguf" for a .gguf file; NotACheckpoint for anything else."""
    try:
        return _sniff(_expanded(path), path)
    except OSError as exc:  # pathlib's tests raise what is not "no such file": a name too long, no permission
        raise NotACheckpoint(path, "unreadable", f"cannot be read: {exc.strerror or exc}") from None


def _expanded(path: str | Path) -> Path:
    """`path` with a leading ~ or ~user expanded; NotACheckpoint not_found when there is no such home directory
    (pathlib raises RuntimeError for `~nobody-here`)."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise NotACheckpoint(path, "not_found", "no such user's home directory") from None


def _sniff(found: Path, path: str | Path) -> Format:
    if found.is_dir():
        if not (found / "config.json").is_file():
            raise NotACheckpoint(path, "not_a_checkpoint", "a directory without config.json is not a checkpoint")
        return "hf"
    if found.is_file() and found.suffix.lower() == ".gguf":
        return "gguf"
    if found.exists():
        raise NotACheckpoint(path, "not_a_checkpoint", "not a Hugging Face checkpoint directory or a .gguf file")
    raise NotACheckpoint(path, "not_found", "no such file or directory")


def inspect_checkpoint(path: str | Path) -> Checkpoint:
    """The checkpoint at `path`: its format (checkpoint_format), resolved path, architecture and size on disk."""
    fmt = checkpoint_format(path)
    resolved = _expanded(path).resolve()
    try:
        if fmt == "hf":
            size = sum(f.stat().st_size for f in resolved.iterdir() if f.suffix in WEIGHT_SUFFIXES)
            return Checkpoint(str(resolved), fmt, _hf_architecture(resolved / "config.json"), size)
        return Checkpoint(str(resolved), fmt, _gguf_architecture(resolved), resolved.stat().st_size)
    except OSError as exc:  # a directory whose listing is refused
        raise NotACheckpoint(path, "unreadable", f"cannot be read: {exc.strerror or exc}") from None


def _hf_architecture(config: Path) -> str:
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return ""
    return str(data.get("model_type") or "") if isinstance(data, dict) else ""


def _gguf_architecture(path: Path) -> str:
    try:
        with path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                return ""
        from gguf import GGUFReader  # numpy only; maps the file without reading the tensors

        field = GGUFReader(path).get_field("general.architecture")
        return str(field.contents()) if field is not None else ""
    except Exception:  # a damaged file: the loader names the problem when the load runs
        return ""


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """A trainer checkpoint directory's manifest, unchecked against its weights; CheckpointCorrupt when it is
    missing or not a JSON object with a weights_sha256."""
    file = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointCorrupt(f"{file}: no manifest, so this is not a saved checkpoint") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointCorrupt(f"{file}: unreadable manifest: {exc}") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("weights_sha256"), str):
        raise CheckpointCorrupt(f"{file}: not a manifest (no weights_sha256)")
    return manifest
