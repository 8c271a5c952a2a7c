"""Fixtures the engine's tests share."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Torch's ops on one thread for the test, as compiled decode graphs are made for (the worker steps a small model
    with one); the previous count restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
