"""Fixtures of the post-hoc calibrators' tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """These fits are small: one torch thread is faster and avoids oversubscribing a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
