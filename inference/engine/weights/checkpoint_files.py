"""A trainer's checkpoint of the served weights as files: an ordinary Hugging Face directory plus a manifest.

`root/<run_id>/step-<N>/` holds model.safetensors, the source model's config and tokenizer files (so the ordinary
loader serves it), and manifest.json with the lineage and the weights' sha256. A step appears whole or not at all:
it is written in a temporary folder beside it, every file and the folder synced, then renamed into place; a crash
leaves at most a `.step-<N>.tmp-*` folder and never a half-written step. `latest` is a symlink swapped in one
rename, so a reader sees either the previous step or the new one. A disk that fills up during the write is told
apart from other failures (`DiskFull`), so the trainer reads why, not a writer's internal error.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from inference.engine.contract.checkpoint import MANIFEST_FILE, CheckpointCorrupt, read_manifest
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.weights.parameter_views import ParameterViews

WEIGHTS_FILE, LATEST = "model.safetensors", "latest"
# What the loader and the tokenizer read besides the weights; copied when the source has them.
SOURCE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # one path component, never hidden
CHUNK = 1 << 20


class CheckpointExists(FileExistsError):
    """The step was already saved; a checkpoint is never overwritten."""


class DiskFull(OSError):
    """The checkpoint directory's filesystem ran out of room during the save; what was written is removed."""


def save_checkpoint(
    views: ParameterViews,
    *,
    source_dir: Path,
    root: Path,
    run_id: str,
    step: int,
    parent: str | None,
    base_model: str,
) -> dict[str, Any]:
    """Saves the served weights as `root/<run_id>/step-<step>` and points `latest` at it; the manifest, with the
    step's absolute "path". CheckpointExists when that step is already there (it is left as it was)."""
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id {run_id!r} must be letters, digits, '.', '_' or '-', not starting with '.' or '-'")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    source_dir = Path(source_dir)
    if not (source_dir / "config.json").is_file():
        raise FileNotFoundError(f"{source_dir}: no config.json to save beside the weights")
    run = Path(root) / run_id
    final = run / f"step-{step}"
    if final.exists():
        raise CheckpointExists(f"{final} already exists")
    run.mkdir(parents=True, exist_ok=True)
    temporary = run / f".step-{step}.tmp-{secrets.token_hex(4)}"
    temporary.mkdir()
    state = views.state_dict()
    try:
        manifest = _write_step(state, source_dir, temporary, run_id, step, parent, base_model)
        try:
            os.rename(temporary, final)  # refused for a non-empty step folder that appeared meanwhile
        except OSError as exc:
            raise CheckpointExists(f"{final} already exists") from exc
    except BaseException as exc:
        shutil.rmtree(temporary, ignore_errors=True)
        needed = sum(tensor.nbytes for tensor in state.values())
        if isinstance(exc, Exception) and _out_of_space(exc, run, needed):
            free = shutil.disk_usage(run).free
            raise DiskFull(
                errno.ENOSPC,
                f"no space left on the checkpoint directory's disk ({run}): the weights take {needed} bytes and "
                f"{free} are free; nothing was saved",
            ) from exc
        raise
    _fsync(run)
    link = run / f".{LATEST}.tmp-{secrets.token_hex(4)}"
    link.symlink_to(final.name)
    os.replace(link, run / LATEST)
    _fsync(run)
    return {**manifest, "path": str(final.resolve())}


def _out_of_space(exc: Exception, run: Path, needed: int) -> bool:
    """Whether a failed write failed for room: the system said so, or (safetensors' writer reports its own error
    type) the disk, with the partial step removed, has less free than the weights take."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return shutil.disk_usage(run).free < needed


def _write_step(
    state: dict[str, torch.Tensor],
    source: Path,
    folder: Path,
    run_id: str,
    step: int,
    parent: str | None,
    base_model: str,
) -> dict[str, Any]:
    weights = folder / WEIGHTS_FILE
    save_file(state, str(weights), metadata={"format": "pt"})
    _fsync(weights)
    for name in SOURCE_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)
            _fsync(folder / name)
    manifest = {
        "run_id": run_id,
        "step": step,
        "parent": parent,
        "base_model": base_model,
        "weights_sha256": file_sha256(weights),
        "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "name": f"{base_model}:{run_id}:step-{step}",
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    _fsync(folder / MANIFEST_FILE)
    _fsync(folder)
    return manifest


def _fsync(path: Path) -> None:
    """Flushes a file's or a folder's contents (a folder's: the names in it) to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read a chunk at a time so a large one never sits in memory whole."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checkpoint(directory: Path) -> dict[str, Any]:
    """The manifest, once the weights file's sha256 is found to be the one it records; else CheckpointCorrupt."""
    manifest = read_manifest(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointCorrupt(f"{weights}: the weights file is missing")
    actual = file_sha256(weights)
    if actual != manifest["weights_sha256"]:
        raise CheckpointCorrupt(
            f"{weights}: sha256 is {actual}, the manifest records {manifest['weights_sha256']}: the file was changed "
            "or damaged after it was saved"
        )
    return manifest


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The Hugging Face tensors of a checkpoint directory, checked against its config as a load checks them."""
    return read_hf_dir(directory).tensors
