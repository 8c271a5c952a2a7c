"""A load counts what it reads: every tensor and its stored bytes, against totals known before the first read."""

from pathlib import Path

from inference.engine.loaders.gguf import read_gguf
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.progress import ReadProgress


class Recording(ReadProgress):
    """A ReadProgress that also keeps the counts after each tensor, to see them advance."""

    def __init__(self):
        super().__init__()
        self.history: list[tuple[int, int, int, int]] = []

    def read(self, nbytes: int) -> None:
        super().read(nbytes)
        self.history.append(self.counts())


def _check(progress: Recording, tensors: int, stored_in: Path) -> None:
    assert progress.tensors_total == tensors and progress.tensors_read == tensors
    assert 0 < progress.bytes_total <= stored_in.stat().st_size
    assert progress.bytes_read == progress.bytes_total
    reads = [counts[2] for counts in progress.history]
    assert reads == sorted(reads) and len(set(reads)) == tensors  # each tensor adds its bytes, one at a time
    assert all(counts[1] == tensors and counts[3] == progress.bytes_total for counts in progress.history)


def test_a_gguf_load_counts_each_tensor_and_its_bytes(stories_gguf_path):
    progress = Recording()
    checkpoint = read_gguf(stories_gguf_path, progress)
    _check(progress, len(checkpoint.tensors), stories_gguf_path)


def test_a_hugging_face_load_counts_each_tensor_and_its_bytes(stories_hf_dir):
    progress = Recording()
    checkpoint = read_hf_dir(stories_hf_dir, progress)
    _check(progress, len(checkpoint.tensors), stories_hf_dir / "model.safetensors")
    # float32 on disk: the stored bytes are the tensors' own
    assert progress.bytes_total == sum(t.nbytes for t in checkpoint.tensors.values())
