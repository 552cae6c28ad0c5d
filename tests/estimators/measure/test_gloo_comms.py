"""``run_settled`` on a one-rank gloo group in this process: it returns only once gloo has let go of a
collective's tensors, and when something still holds them it fails, naming what.

The race it closes needs two ranks to show (``test_fsdp_real.py``'s
``test_gloo_collectives_release_their_buffers_at_once``: about 1 reduce-scatter in 500 on 2 CPU ranks left its
input to be freed later by gloo's worker thread); here, what that race leaves behind is made to last, so
that the check is seen to catch it: a reference the process group's work keeps (C++) and one kept on the
tensor's Python object (the decref gloo's worker thread owed it, waiting for the GIL).
"""

from __future__ import annotations

import weakref

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from estimators.measure import run_settled  # noqa: E402

N = 8


@pytest.fixture
def group():
    if not dist.is_gloo_available():
        pytest.skip("no gloo backend in this torch build")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def settled_all_reduce(group, value: float) -> tuple[torch.Tensor, weakref.ref]:
    t = torch.full((N,), value)
    run_settled((t,), lambda: dist.all_reduce(t, group=group, async_op=True))
    return t, weakref.ref(t.untyped_storage())


def test_a_settled_all_reduce_frees_its_buffer_when_dropped(group) -> None:
    t, ref = settled_all_reduce(group, 3.0)
    assert torch.equal(t, torch.full((N,), 3.0))  # one rank: the sum is the input
    del t
    assert ref() is None


def test_a_buffer_the_process_group_still_holds_is_named(group) -> None:
    """The work kept alive past the call: gloo's C++ references to the tensor stay, so it never settles."""
    t, kept = torch.ones(N), []

    def issue():
        kept.append(dist.all_reduce(t, group=group, async_op=True))
        return kept[-1]

    with pytest.raises(RuntimeError, match=r"still holds a collective's buffers 0\.05 s after the collective "
                                           r"completed: tensor 0 \(\(8,\), C\+\+ references\): 1 before, [2-9] now"):
        run_settled((t,), issue, timeout_s=0.05)
    kept.clear()
    run_settled((t,), lambda: dist.all_reduce(t, group=group, async_op=True), timeout_s=0.05)  # let go: settles


def test_a_buffer_still_held_from_python_is_named(group) -> None:
    """A reference on the tensor's Python object that the caller does not own: the C++ counts are back, yet
    the caller's ``del`` would not free the buffer (what gloo's pending decref did before it was waited for)."""
    t, kept = torch.ones(N), []

    def issue():
        kept.append(t)
        return dist.all_reduce(t, group=group, async_op=True)

    with pytest.raises(RuntimeError, match=r"completed: tensor 0 \(\(8,\), Python references\): \d+ before, \d+ now$"):
        run_settled((t,), issue, timeout_s=0.05)
