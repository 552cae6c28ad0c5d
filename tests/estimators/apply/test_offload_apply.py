"""apply_plan with offloading (issue 31 item 3), on the CPU stand-in: gradients, the memory promise, freed storages.

A residual MLP of three blocks, each ``x + down(gelu(up(x)))``; ``nn.Linear`` on a 2-D input dispatches
``aten.t`` (a view) then ``aten.addmm`` (torch 2.13), so a block runs the six ops of ``OPS``. The plans are
hand-written: windows end at each block and at the root (the protocol of issue 31: window j's offloads leave
the device when window j+1's end module's forward ends). Known answers are byte counts of fp32 tensors:
``up``'s output is B x H x 4 bytes, ``gelu``'s the same.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from estimators import PlanMismatchError, apply_plan  # noqa: E402
from estimators.apply import planned_modules  # noqa: E402
from estimators.measure import measure_steps, track_live_storages  # noqa: E402

D, H, B, N = 16, 64, 256, 3
OPS = ["aten.t", "aten.addmm", "aten.gelu", "aten.t", "aten.addmm", "aten.add"]
SAVE = [0, 1, 1, 0, 1, 0]  # save up, gelu and down; the residual add is recomputed
UP_BYTES = B * H * 4  # the output of up (and of gelu)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self, inplace_after: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(N))
        self.inplace_after = inplace_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
            if self.inplace_after:
                x.mul_(1.0)  # writes the block's output after the block's forward ended
        return x


def _plan(save: list[int], offload: list[int] | None, blocks: range = range(N)) -> dict:
    mods = [{"fqn": f"Net.blocks.{i}", "discard_ratio": 0.0, "discarded_bytes": 0, "saved_bytes": 0,
             "recompute_ms": 0.0, "save": save, "op_names": OPS, **({"offload": offload} if offload else {})}
            for i in blocks]
    doc = {"status": "optimal", "modules": mods}
    if offload is not None:
        doc["offload"] = "on"
        doc["offload_windows"] = [{"end_module": f"Net.blocks.{i}"} for i in range(N)] + [{"end_module": ""}]
    return doc


@pytest.fixture(scope="module")
def net() -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    return Net(), torch.randn(B, D)


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.parametrize("save,offload", [
    (SAVE, [0, 1, 1, 0, 1, 0]),  # offload every saved output
    (SAVE, [0, 1, 0, 0, 0, 0]),  # offload up, save gelu and down
    ([0, 1, 0, 0, 1, 0], [0, 1, 0, 0, 0, 0]),  # offload up, recompute gelu, save down
])
def test_gradients_equal_the_unplanned_run(net, save, offload):
    model, x = net
    planned = apply_plan(copy.deepcopy(model), _plan(save, offload))
    assert all(torch.equal(a, b) for a, b in zip(_grads(copy.deepcopy(model), x), _grads(planned, x)))


def _forward_end(model: nn.Module, x: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    """Device and host bytes live when the forward has ended, and the loss."""
    with track_live_storages(model) as tracker:
        loss = model(x).square().mean()
        return tracker.live_bytes(), tracker.host_book.live_bytes(), loss


def test_forward_end_device_bytes_drop_by_exactly_the_offloaded_bytes_and_the_host_book_holds_them(net):
    model, x = net
    kept = apply_plan(copy.deepcopy(model), _plan(SAVE, [0] * 6))
    offloading = apply_plan(copy.deepcopy(model), _plan(SAVE, [0, 1, 1, 0, 0, 0]))
    kept_device, kept_host, _ = _forward_end(kept, x)
    device, host, loss = _forward_end(offloading, x)
    store = planned_modules(offloading)[0].host_store
    assert kept_host == 0
    assert kept_device - device == N * 2 * UP_BYTES  # up and gelu of every block, all windows dropped
    assert host == N * 2 * UP_BYTES == store.offloaded_bytes
    handles = [h for window in store.current.windows for h in window]
    assert len(handles) == N * 2 and all(h.storage() is None for h in handles)  # freed, not relabelled
    assert all(h.host is not None and h.stashed is None for h in handles)
    loss.backward()
    assert store.host_bytes == 0  # every host copy fetched back and let go


def test_a_relabelling_store_fails_the_freed_check(net):
    model, x = net
    planned = apply_plan(copy.deepcopy(model), _plan(SAVE, [0, 1, 0, 0, 0, 0]))
    store = planned_modules(planned)[0].host_store
    store.to_host = lambda t: (t.cpu(), None)  # on the CPU, .cpu() returns the tensor itself: nothing freed
    with pytest.raises(PlanMismatchError, match=r"module 'Net\.blocks\.0': op 1 \(aten\.addmm\): offloading it "
                                                r"frees nothing"):
        planned(x)


def test_measured_step_reports_host_bytes_apart_and_nothing_when_nothing_is_offloaded(net):
    model, x = net

    def step(plan: dict) -> object:
        m = apply_plan(copy.deepcopy(model), plan)
        return measure_steps(m, x, lambda out: out.square().mean(), torch.optim.SGD(m.parameters(), lr=0.0),
                             steps=1)[0]

    plain, ours = step(_plan(SAVE, None)), step(_plan(SAVE, [0] * 6))  # torch's pair; ours, offloading nothing
    assert (ours.peak_bytes, ours.peak_live_bytes) == (plain.peak_bytes, plain.peak_live_bytes)
    assert plain.host_peak_bytes is None and ours.host_peak_bytes is None and ours.host_live_bytes is None
    off = step(_plan(SAVE, [0, 1, 1, 0, 0, 0]))
    assert off.host_peak_bytes == N * 2 * UP_BYTES  # all host copies live at the forward's end
    # the backward peak (in the last block's backward) holds one window fewer of the offloaded outputs: the
    # first block's (window 0, fetched at the backward start of block 1)
    assert plain.peak_bytes - off.peak_bytes == 2 * UP_BYTES, (plain.peak_bytes, off.peak_bytes)
    assert off.host_live_bytes == 2 * UP_BYTES


def test_refusals_name_the_module_and_the_op(net):
    model, x = net
    with pytest.raises(PlanMismatchError, match=r"module 'Net\.blocks\.0': op 5 \(aten\.add\) has offload=1 but "
                                                r"save=0"):
        apply_plan(copy.deepcopy(model), _plan(SAVE, [0, 0, 0, 0, 0, 1]))
    with pytest.raises(PlanMismatchError, match=r"op 0 \(aten\.t\) is a view and has offload=1"):
        apply_plan(copy.deepcopy(model), _plan([1, 1, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"compile_backend='inductor': a plan that offloads runs eagerly or under "
                                         r"torch.compile with backend 'eager' or 'aot_eager' only \(Inductor's "
                                         r"generated forward writes in place into the buffer sacplan::from_host "
                                         r"returns"):
        apply_plan(copy.deepcopy(model), _plan(SAVE, [0, 1, 0, 0, 0, 0]), compile_backend="inductor")
    no_windows = _plan(SAVE, [0, 1, 0, 0, 0, 0])
    del no_windows["offload_windows"]
    with pytest.raises(ValueError, match="has no offload_windows"):
        apply_plan(copy.deepcopy(model), no_windows)
    output = apply_plan(copy.deepcopy(model), _plan([0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1]))
    with pytest.raises(PlanMismatchError, match=r"op 5 \(aten\.add\): offloading it frees nothing"):
        output(x)  # the block's output: the next block holds it


def test_a_write_after_the_copy_is_refused(net):
    model, x = net
    written = Net(inplace_after=True)
    written.load_state_dict(model.state_dict())
    apply_plan(written, _plan([0, 1, 1, 0, 1, 1], [0, 0, 0, 0, 0, 1]))
    with pytest.raises(PlanMismatchError, match=r"op 5 \(aten\.add\) is written in place after its copy"):
        written(x)


class Counting(nn.Module):
    """Counts its calls in a buffer, in place: an op whose output is the buffer's storage."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.lin = nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x)


def test_offloading_a_buffer_alias_is_refused():
    model = nn.Sequential(Counting(), nn.Linear(D, D))
    ops = ["aten.add_", "aten.t", "aten.addmm"]
    plan = {"status": "optimal", "offload": "on",
            "offload_windows": [{"end_module": "Sequential.0"}, {"end_module": ""}],
            "modules": [{"fqn": "Sequential.0", "discard_ratio": 0.0, "discarded_bytes": 0, "saved_bytes": 0,
                         "recompute_ms": 0.0, "save": [1, 0, 1], "offload": [1, 0, 0], "op_names": ops}]}
    apply_plan(model, plan)
    with pytest.raises(PlanMismatchError, match=r"module 'Sequential\.0': op 0 \(aten\.add_\) cannot be offloaded: "
                                                r"it shares its storage with a parameter or buffer"):
        model(torch.randn(4, D, requires_grad=True))


def test_gradient_accumulation_gets_windows_per_forward_and_remove_plan_takes_the_hooks_off(net):
    from estimators import TrainingLoop, remove_plan

    model, x = net

    def step(m: nn.Module) -> object:
        return measure_steps(m, x, lambda out: out.square().mean(), torch.optim.SGD(m.parameters(), lr=0.0),
                             steps=1, loop=TrainingLoop(grad_accumulation=2))[0]

    kept = step(apply_plan(copy.deepcopy(model), _plan(SAVE, [0] * 6)))
    planned = apply_plan(copy.deepcopy(model), _plan(SAVE, [0, 1, 1, 0, 0, 0]))
    off = step(planned)
    # each micro-batch's forward starts its own windows: the same drop at the same moment as one micro-batch
    assert kept.peak_bytes - off.peak_bytes == 2 * UP_BYTES and off.host_peak_bytes == N * 2 * UP_BYTES
    remove_plan(planned)
    assert not planned._forward_hooks and not planned.blocks[0]._forward_hooks
    with track_live_storages(planned) as tracker:
        planned(x)
        assert tracker.host_figures() == (None, None)
