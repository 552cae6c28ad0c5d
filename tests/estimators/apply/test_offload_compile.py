"""apply_plan with offloading under torch.compile (aot_eager; eager), on the CPU stand-in (issue 31 item 3).

The residual MLP and the hand-written plans of test_offload_apply.py (windows end at each block and at the
root). Under AOT tracing the policy tags the offloaded outputs and a joint-graph pass
(estimators/apply/offload_compile.py) makes the compiled forward save their host copies through
``sacplan::to_host``; the backward takes the prefetched device copies through ``sacplan::from_host``. Known
answers are the eager path's (test_offload_apply.py): the step peak falls by exactly the offloaded bytes of
one window (2 x UP_BYTES: up and gelu of block 0, fetched at the backward start of block 1), the host book
holds every offloaded byte at the forward's end, and each offloaded device storage is dead after the drop.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
functorch_config = pytest.importorskip("torch._functorch.config")  # the joint pass apply_plan sets

from estimators import apply_plan, check_plan, remove_plan  # noqa: E402
from estimators.apply import planned_modules  # noqa: E402
from estimators.measure import measure_steps, track_live_storages  # noqa: E402
from test_offload_apply import B, D, N, SAVE, UP_BYTES, Net, _plan  # noqa: E402

OFFLOAD = [0, 1, 1, 0, 0, 0]  # up and gelu of each block to the host; down saved; the add recomputed


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def _unplanned() -> tuple[Net, torch.Tensor, list[torch.Tensor]]:
    """The model (seed 0), its input and the gradients of an unplanned eager step."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(B, D)
    model.zero_grad(set_to_none=True)
    _loss(model(x)).backward()
    return model, x, [p.grad.clone() for p in model.parameters()]


def _compiled(model: Net, x: torch.Tensor, offload: list[int] | None) -> tuple[Net, torch.nn.Module]:
    torch._dynamo.reset()  # layout: allow-private (each model compiles afresh)
    planned = apply_plan(copy.deepcopy(model), _plan(SAVE, offload), example_inputs=x, loss_fn=_loss,
                         compile_backend="aot_eager")
    return planned, torch.compile(planned, backend="aot_eager")


def test_compiled_offload_keeps_the_eager_promise_and_frees_the_device_storages():
    model, x, unplanned = _unplanned()
    before = functorch_config.joint_custom_pass

    def step(m: torch.nn.Module, params: Net) -> object:
        return measure_steps(m, x, _loss, torch.optim.SGD(params.parameters(), lr=0.0), steps=2)[1]

    planned, compiled = _compiled(model, x, OFFLOAD)
    off_step = step(compiled, planned)
    kept_model, kept = _compiled(model, x, None)  # compiled while the pass is set: no tag, nothing rewritten
    kept_step = step(kept, kept_model)
    assert kept_step.host_peak_bytes is None
    assert off_step.host_peak_bytes == N * 2 * UP_BYTES  # every copy on the host at the forward's end
    assert kept_step.peak_bytes - off_step.peak_bytes == 2 * UP_BYTES, (kept_step.peak_bytes, off_step.peak_bytes)

    store = planned_modules(planned)[0].host_store
    with track_live_storages(planned) as tracker:
        loss = _loss(compiled(x))
        handles = [h for window in store.current.windows for h in window]
        assert tracker.host_book.live_bytes() == N * 2 * UP_BYTES == store.offloaded_bytes
        assert len(handles) == N * 2 and all(h.storage() is None for h in handles)  # freed, not relabelled
        assert handles[0].label == "module 'Net.blocks.0.up': compiled node addmm (aten.addmm.default)"
        planned.zero_grad(set_to_none=True)
        loss.backward()
    assert store.by_host == {} and store.host_bytes == 0  # every copy taken by the compiled backward
    assert store.stalled_fetches == 0  # each window fetched by the in-graph prefetch, before the backward took it
    assert all(torch.equal(a, p.grad) for a, p in zip(unplanned, planned.parameters()))

    torch._dynamo.reset()  # layout: allow-private (a recompile: the pass is still set)
    _loss(compiled(x)).backward()
    assert store.offloaded_bytes == N * 2 * UP_BYTES
    remove_plan(planned)
    remove_plan(kept_model)
    assert functorch_config.joint_custom_pass is before


def test_an_offloading_plan_compiles_without_graph_breaks_the_window_moments_in_the_graph():
    # the window hooks used to be torch.compiler.disable-d: a graph break at each of the N + 1 window ends, and
    # per-window graphs that keep more than the whole-model graph the stats count (bench/RESULTS.md)
    model, x, unplanned = _unplanned()
    planned, _ = _compiled(model, x, OFFLOAD)
    graphs = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append([str(n.target) for n in gm.graph.nodes])
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)  # layout: allow-private (as above)

    def step() -> None:
        planned.zero_grad(set_to_none=True)
        _loss(torch.compile(planned, backend=counting)(x)).backward()
        assert all(torch.equal(a, p.grad) for a, p in zip(unplanned, planned.parameters()))

    breaks = torch._dynamo.utils.counters["graph_break"]  # layout: allow-private (dynamo's break counter)
    breaks.clear()
    step()  # torch.compile(module) runs the root's own hooks as frames of their own, around its forward
    assert not breaks and len(graphs) == 3, (dict(breaks), graphs)
    assert graphs[0].count("sacplan.pass_start") == 1 and graphs[2].count("sacplan.window_end") == 1
    assert graphs[1].count("sacplan.window_end") == N  # each block's end, in the forward's one graph
    torch._dynamo.reset()  # layout: allow-private (as above)
    graphs.clear()
    with torch._dynamo.config.patch(wrap_top_frame=True):  # layout: allow-private (hooks and forward: one frame)
        step()
    assert not breaks and len(graphs) == 1
    assert graphs[0].count("sacplan.pass_start") == 1 and graphs[0].count("sacplan.window_end") == N + 1
    assert planned_modules(planned)[0].host_store.offloaded_bytes == N * 2 * UP_BYTES
    remove_plan(planned)
    torch._dynamo.reset()  # layout: allow-private (as above)


def test_compiled_offload_steps_again_and_again():
    # from the second step on AOTAutograd detaches the saved host copies it is handed as views, so a view's
    # finalizer fired in the forward, the store forgot the copy and the backward's from_host failed
    model, x, unplanned = _unplanned()
    planned, compiled = _compiled(model, x, OFFLOAD)
    store = planned_modules(planned)[0].host_store
    for _ in range(3):
        planned.zero_grad(set_to_none=True)
        loss = _loss(compiled(x))
        assert len(store.by_host) == N * 2 and store.host_bytes == N * 2 * UP_BYTES
        loss.backward()
        assert store.by_host == {} and store.host_bytes == 0
        assert all(torch.equal(a, p.grad) for a, p in zip(unplanned, planned.parameters()))
    remove_plan(planned)
    torch._dynamo.reset()  # layout: allow-private (as above)


def test_compile_eager_backend_runs_our_own_pair_and_offloads():
    model, x, unplanned = _unplanned()
    torch._dynamo.reset()  # layout: allow-private (a fresh compile)
    planned = apply_plan(copy.deepcopy(model), _plan(SAVE, OFFLOAD), example_inputs=x, loss_fn=_loss,
                         compile_backend="eager")
    planned.zero_grad(set_to_none=True)
    store = planned_modules(planned)[0].host_store
    with track_live_storages(planned) as tracker:
        loss = _loss(torch.compile(planned, backend="eager")(x))
        handles = [h for window in store.current.windows for h in window]
        assert tracker.host_book.live_bytes() == N * 2 * UP_BYTES == store.offloaded_bytes
        assert len(handles) == N * 2 and all(h.storage() is None for h in handles)
        loss.backward()
    assert store.host_bytes == 0 and store.stalled_fetches == 0  # the window ops prefetch the eager pair's too
    assert all(torch.equal(a, p.grad) for a, p in zip(unplanned, planned.parameters()))
    remove_plan(planned)
    torch._dynamo.reset()  # layout: allow-private (as above)


def test_compiling_an_offloading_plan_applied_for_eager_is_refused_until_check_plan_sets_it_up():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(B, D)
    before = functorch_config.joint_custom_pass
    apply_plan(model, _plan(SAVE, OFFLOAD))  # no compile_backend: no traced decisions, no offload pass
    torch._dynamo.reset()  # layout: allow-private (a fresh compile)
    with pytest.raises(Exception, match=r"module 'Net\.blocks\.0': the plan offloads and the model is compiled, "
                                        r"but apply_plan ran without example_inputs and compile_backend \(no "
                                        r"traced decisions"):
        torch.compile(model, backend="aot_eager")(x)
    check_plan(model, x, loss_fn=_loss, compile_backend="aot_eager")  # the fix the message names
    _loss(torch.compile(model, backend="aot_eager")(x)).backward()
    assert planned_modules(model)[0].host_store.offloaded_bytes == N * 2 * UP_BYTES
    remove_plan(model)
    assert functorch_config.joint_custom_pass is before
    torch._dynamo.reset()  # layout: allow-private (as above)



def _joint(b_tag: object) -> torch.fx.GraphModule:
    """A joint graph by hand: ``a = x * x`` tagged for offload, ``b = sin(a)`` tagged ``b_tag``, the backward
    ``tangents_1 * b`` (it reads b, not a)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.checkpoint import CheckpointPolicy

    g = torch.fx.Graph()
    x, t = g.placeholder("primals_1"), g.placeholder("tangents_1")
    a = g.call_function(torch.ops.aten.mul.Tensor, (x, x))
    b = g.call_function(torch.ops.aten.sin.default, (a,))
    g.output((b, g.call_function(torch.ops.aten.mul.Tensor, (t, b))))
    with FakeTensorMode() as mode:
        for n in (x, t, a, b):
            n.meta["val"] = mode.from_tensor(torch.ones(4)) if n.op == "placeholder" else torch.empty(4)
    a.meta["recompute"] = CheckpointPolicy.MUST_CPU_OFFLOAD
    if b_tag is not None:
        b.meta["recompute"] = b_tag
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_the_joint_pass_copies_no_value_that_no_backward_reads():
    """A node tagged for offload whose value no backward reads (its one taker saved) is not copied: its host copy
    would be let go unread at the window's drop (bench/RESULTS.md: at 65% the fidelity llama's compiled backward
    read 32 of 71 copies). With its taker left to the partitioner (which may recompute it) it is copied."""
    from estimators.apply.offload_compile import offload_joint_pass
    from torch.utils.checkpoint import CheckpointPolicy

    def copies(gm: torch.fx.GraphModule) -> int:
        return sum(n.target is torch.ops.sacplan.to_host.default for n in offload_joint_pass(gm, None).graph.nodes)

    assert copies(_joint(CheckpointPolicy.MUST_SAVE)) == 0
    assert copies(_joint(None)) == 1
    assert copies(_joint(CheckpointPolicy.PREFER_RECOMPUTE)) == 1
