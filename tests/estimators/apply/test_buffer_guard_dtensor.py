"""The recompute buffer guard with a DTensor buffer (torchtitan's RoPE cache under tensor parallel is one).

Before the guard keyed a wrapper subclass by its inner tensor, building it on such a module raised "Attempted to
access the data pointer on an invalid python storage", so every plan that checkpointed a block of torchtitan's
Llama 3 at TP x2 failed on its first recomputation (bench/RESULTS.md, "torchtitan's Llama 3").
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from estimators.apply.buffer_guard import RecomputeBufferGuard  # noqa: E402


@pytest.fixture
def one_rank_mesh():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_an_in_place_write_to_a_dtensor_buffer_is_stopped(one_rank_mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    module = torch.nn.Module()
    module.register_buffer("cache", distribute_tensor(torch.zeros(4), one_rank_mesh, [Replicate()]))
    other = torch.zeros(4)
    guard = RecomputeBufferGuard(module)
    with guard:
        module.cache.add_(1.0)  # the buffer: not written again in a recomputation
        other.add_(1.0)  # any other tensor: written
    assert torch.equal(module.cache.to_local(), torch.zeros(4))
    assert torch.equal(other, torch.ones(4))
    assert guard.skipped == 1
