"""Fixtures shared by the whole suite: where the real test models live."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("PANTHEON_TEST_MODELS", REPO_ROOT.parent / "shared" / "models")).resolve()


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """The folder with stories260K (HF directory and GGUF); set PANTHEON_TEST_MODELS to move it."""
    if not (MODELS_DIR / "stories260K-hf" / "config.json").is_file():
        pytest.fail(f"test models not found in {MODELS_DIR}; set PANTHEON_TEST_MODELS")
    return MODELS_DIR


@pytest.fixture(scope="session")
def stories_hf_dir(models_dir: Path) -> Path:
    return models_dir / "stories260K-hf"


@pytest.fixture(scope="session")
def stories_gguf_path(models_dir: Path) -> Path:
    return models_dir / "stories260K.gguf"
