import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The sampler tests run many tiny forwards; on a shared 2-core machine a second intra-op
    thread only adds contention (measured ~40x slower per tiny matmul under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
