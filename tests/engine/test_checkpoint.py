"""What a path is as a checkpoint (inference/engine/contract/checkpoint.py), and that the worker's loader and the
control plane refuse a bad path for the same reason, in the same words."""

import pytest

from inference.engine.contract.checkpoint import NotACheckpoint, inspect_checkpoint
from inference.engine.errors import LoadError
from inference.engine.kv_budget import read_config
from inference.engine.loaders.loading import load_model


def test_a_hugging_face_directory(stories_hf_dir):
    checkpoint = inspect_checkpoint(stories_hf_dir)
    assert (checkpoint.path, checkpoint.format, checkpoint.architecture) == (str(stories_hf_dir), "hf", "llama")
    assert checkpoint.size_bytes == (stories_hf_dir / "model.safetensors").stat().st_size
    assert checkpoint.default_name == "stories260K-hf"


def test_a_gguf_file_reached_through_a_link(stories_gguf_path, tmp_path):
    link = tmp_path / "Stories.GGUF"
    link.symlink_to(stories_gguf_path)
    checkpoint = inspect_checkpoint(link)
    assert (checkpoint.path, checkpoint.format, checkpoint.architecture) == (str(stories_gguf_path), "gguf", "llama")
    assert checkpoint.size_bytes == stories_gguf_path.stat().st_size
    assert checkpoint.default_name == "stories260K"


def test_what_cannot_be_read_here_has_no_architecture(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "notes.gguf").write_text("Once upon a time")
    assert inspect_checkpoint(tmp_path).architecture == ""  # the loader says what is wrong when the load runs
    assert inspect_checkpoint(tmp_path / "notes.gguf").architecture == ""


def not_a_checkpoint(folder, kind: str):
    """A path in `folder` that is not a checkpoint, of one kind."""
    if kind == "nothing":
        return folder / "absent.gguf"
    if kind == "other-file":
        (folder / "weights.bin").write_bytes(b"\0" * 16)
        return folder / "weights.bin"
    (folder / "model.safetensors").write_bytes(b"\0" * 16)  # weights, but no config.json beside them
    return folder


@pytest.mark.parametrize(
    ("kind", "reason", "problem"),
    [
        ("nothing", "not_found", "no such file or directory"),
        ("directory-without-config", "not_a_checkpoint", "a directory without config.json is not a checkpoint"),
        ("other-file", "not_a_checkpoint", "not a Hugging Face checkpoint directory or a .gguf file"),
    ],
)
def test_what_is_not_a_checkpoint_is_refused_with_a_reason(tmp_path, kind, reason, problem):
    path = not_a_checkpoint(tmp_path, kind)
    with pytest.raises(NotACheckpoint) as refused:
        inspect_checkpoint(path)
    assert (refused.value.reason, refused.value.path, str(refused.value)) == (reason, str(path), f"{path}: {problem}")
    # The worker refuses it in the same words, through the same check, before reading anything.
    for read in (read_config, load_model):
        with pytest.raises(LoadError) as caught:
            read(path)
        assert str(caught.value) == f"{path}: {problem}"
