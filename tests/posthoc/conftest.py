"""Fixtures of the post-hoc calibrators' tests."""

import pytest
import torch
from threadpoolctl import threadpool_limits


@pytest.fixture(scope="module")
def one_thread():
    """These fits are small: one torch and one BLAS thread are faster and avoid oversubscribing a shared machine
    (a second OpenBLAS thread spinning on a busy core makes numpy's small products tens of times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        yield
    torch.set_num_threads(threads)
