"""The collected timeline against a real training step of the same model on the CPU.

The known answers come from the real run: :class:`est_helpers.StepMemory`
counts the unique live storages of a real forward, backward and optimizer
step (real tensors), independently of the collector's StorageBook.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from estimators import RooflineCostModel, collect_stats, device_spec  # noqa: E402
from est_helpers import StepMemory  # noqa: E402
from conftest import tiny_llama  # noqa: E402

# The fake step sees the same ops on the same shapes as the real one, and on
# these models the peaks agree to the byte. The allowance covers a storage one
# side may make and the other not (a scalar step counter, a 0-d constant):
# 1 KiB, far below any activation of these models (the smallest is 8 KiB).
SLACK_BYTES = 1024


def real_step(model, inputs, loss_fn, *, foreach: bool) -> tuple[StepMemory, torch.optim.Optimizer]:
    """One real training step as a training loop writes it; the live bytes measured per phase.

    Forward phases are ``("forward", k)``, k the number of modules whose
    (first) forward has finished, counted by a global forward hook.
    """
    from torch.nn.modules.module import register_module_forward_hook

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, foreach=foreach)
    memory = StepMemory()
    memory.register((list(model.parameters()), list(model.buffers()), inputs))
    finished: set = set()

    def forward_done(module, args, output) -> None:
        if memory.phase[0] == "forward" and module not in finished:
            finished.add(module)
            memory.phase = ("forward", len(finished))

    torch.manual_seed(1)
    handle = register_module_forward_hook(forward_done)
    try:
        with memory:
            memory.phase = ("forward", 0)
            out = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
            loss = loss_fn(out)
            del out
            memory.phase = ("backward",)
            loss.backward()
            del loss
            memory.phase = ("optimizer",)
            opt.step()
    finally:
        handle.remove()
    return memory, opt


def peaks_by_phase(peaks: dict[tuple, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for (phase, *_), n in peaks.items():
        out[phase] = max(out.get(phase, 0), n)
    return out


def moment_totals(stats) -> dict[tuple, int]:
    """Each moment's total: everything live, parameters included."""
    return {(t.phase, t.key): stats.root.param_bytes + t.activation_bytes + t.grad_bytes + t.optimizer_bytes
            for t in stats.timeline}


def assert_timeline_matches(stats, memory: StepMemory, opt: torch.optim.Optimizer) -> None:
    totals = moment_totals(stats)
    predicted, measured = peaks_by_phase(totals), peaks_by_phase(memory.peak_bytes)
    for phase in ("forward", "backward", "optimizer"):
        assert abs(predicted[phase] - measured[phase]) <= SLACK_BYTES, (phase, predicted, measured)
    # the forward+backward peak, what the planner's budget is held to before the optimizer step
    step_peak = max(measured["forward"], measured["backward"])
    assert abs(max(predicted["forward"], predicted["backward"]) - step_peak) <= SLACK_BYTES
    # forward, key by key (no module of these models is left out, so keys count every module)
    real_forward = {k: n for k, n in memory.peak_bytes.items() if k[0] == "forward"}
    assert real_forward.keys() == {k for k in totals if k[0] == "forward"}
    for k, n in real_forward.items():
        assert abs(totals[k] - n) <= SLACK_BYTES, (k, totals[k], n)
    # at the optimizer's peak: every gradient, and at least the state it leaves behind
    (moment,) = [t for t in stats.timeline if t.phase == "optimizer"]
    grads = sum(p.grad.untyped_storage().nbytes() for p in opt.param_groups[0]["params"])
    state = sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values())
    assert moment.grad_bytes == grads
    assert moment.optimizer_bytes >= state == stats.root.optimizer_state_bytes


def test_timeline_peaks_match_a_real_step(case):
    memory, opt = real_step(case.fresh_copy(), case.inputs, case.loss, foreach=False)  # the collector's CPU default
    assert_timeline_matches(case.stats, memory, opt)


def test_foreach_optimizer_temporaries_are_in_the_optimizer_moment():
    """The foreach step holds a temporary the size of every parameter at once: its moment shows it."""
    model, inputs = tiny_llama()
    stats = collect_stats(model, inputs, optimizer="adamw", optimizer_foreach=True, device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    memory, opt = real_step(model, inputs, lambda out: out.loss, foreach=True)
    assert_timeline_matches(stats, memory, opt)
    (moment,) = [t for t in stats.timeline if t.phase == "optimizer"]
    assert moment.optimizer_bytes >= stats.root.optimizer_state_bytes + stats.root.grad_bytes


def test_moments_follow_the_step(case):
    """One moment per (phase, key); forward keys rise, backward keys fall, in step order."""
    stats, n = case.stats, len(case.stats.modules)
    at = [(t.phase, t.key) for t in stats.timeline]
    assert len(at) == len(set(at))
    phases = [p for p, _ in at]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    forward = [k for p, k in at if p == "forward"]
    backward = [k for p, k in at if p == "backward"]
    assert forward == sorted(forward) and forward[-1] >= n - 1
    assert backward == sorted(backward, reverse=True) and backward[0] == n and backward[-1] == 0
    assert at[-1] == ("optimizer", 0) and stats.timeline[-1].module is None
    # forward: the module running is the one whose forward comes next, or one around it
    for t in stats.timeline:
        if t.phase == "forward" and t.key < n:
            nxt = stats.fw_post_order[t.key]
            assert t.module is not None and (nxt == t.module or nxt.startswith(t.module + ".")), (t.key, t.module)


@pytest.mark.parametrize("factory", ["out_of_parent", "tied", "sibling_call", "two_calls"])
def test_timeline_of_models_with_modules_left_out(factory):
    """Keys count only the modules the stats keep; the peaks are the real step's all the same."""
    import out_of_place_models as shapes

    torch.manual_seed(0)
    model, inputs = getattr(shapes, factory)(batch_size=2, seq_len=16, device="cpu")
    stats = collect_stats(model, inputs, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")))
    kept = set(stats.fw_post_order)
    assert all(t.module is None or t.module in kept for t in stats.timeline)
    memory, _ = real_step(model, inputs, lambda out: out.sum(), foreach=False)
    predicted, measured = peaks_by_phase(moment_totals(stats)), peaks_by_phase(memory.peak_bytes)
    for phase in ("forward", "backward", "optimizer"):
        assert abs(predicted[phase] - measured[phase]) <= SLACK_BYTES, (phase, predicted, measured)


def test_recorder_keys_skip_modules_left_out():
    """Hand-worked: forward a, x, b, root finish in that order and x is left out of the stats."""
    from estimators.collect import BACKWARD, OPTIMIZER, TimelineRecorder

    running: list[str] = []
    rec = TimelineRecorder(lambda: running)
    live = dict.fromkeys(("param", "buffer", "input", "act", "temp", "grad", "opt"), 0)

    def alloc(category: str, nbytes: int) -> None:
        live[category] += nbytes
        rec.on_alloc(category, live)

    running[:] = ["root", "a"]
    alloc("act", 10)  # count 0 -> key 0
    for fqn, nbytes in (("a", 5), ("x", 7), ("b", 1), ("root", 0)):
        rec.forward_finished(fqn)
        running[:] = ["root", "x"] if fqn == "a" else ["root"]
        alloc("act", nbytes)  # counts 1 and 2 share key 1 (x is not kept): the larger instant, count 2's
    rec.enter(BACKWARD)
    for fqn in ("root", "b", "x", "a"):
        rec.backward_started(fqn)
        running[:] = [fqn]
        alloc("temp", 2)
        live["act"] -= 4
    rec.enter(OPTIMIZER)
    running[:] = []
    alloc("grad", 3)
    got = [(m["phase"], m["key"], m["module"], m["activation_bytes"]) for m in rec.moments(["a", "b", "root"])]
    assert got == [
        ("forward", 0, "a", 10), ("forward", 1, "root", 22), ("forward", 2, "root", 23), ("forward", 3, "root", 23),
        # root at position 2, then b at 1; x (not kept) leaves the key at 1, and then a opens 0
        ("backward", 2, "root", 25), ("backward", 1, "b", 23), ("backward", 0, "a", 19),
        ("optimizer", 0, None, 15),
    ]


def test_recorder_counts_later_calls_over_their_own_spans():
    """Hand-worked: module s is called twice inside root (calls 1 and 2), then the backward runs call 2's backward
    before call 1's; a later call discards from its forward's end to its backward's start, and is in its own
    backward until that ends."""
    from estimators.collect import BACKWARD, OPTIMIZER, TimelineRecorder

    rec = TimelineRecorder(lambda: [])
    live = dict.fromkeys(("param", "buffer", "input", "act", "temp", "grad", "opt"), 0)

    def alloc(nbytes: int) -> None:
        live["act"] += nbytes
        rec.on_alloc("act", live)

    alloc(1)
    rec.forward_finished("s")          # call 1 ends: key 1
    alloc(1)
    rec.repeat_forward_finished("s")   # call 2 ends: one later call discarding
    alloc(1)
    rec.forward_finished("root")
    alloc(1)
    rec.enter(BACKWARD)
    rec.backward_started("root")
    alloc(1)
    rec.repeat_backward_started("s")   # call 2's backward: no longer discarding, in its backward
    alloc(1)
    rec.repeat_backward_ended("s")
    rec.backward_started("s")          # call 1's backward: the key passes s
    alloc(1)
    rec.enter(OPTIMIZER)
    alloc(1)
    got = [(m["phase"], m["key"], m["repeat_calls_discarding"], m["repeat_calls_in_backward"])
           for m in rec.moments(["s", "root"], per_call={"s"})]
    assert got == [
        ("forward", 0, {}, {}), ("forward", 1, {}, {}), ("forward", 1, {"s": 1}, {}), ("forward", 2, {"s": 1}, {}),
        ("backward", 1, {"s": 1}, {}), ("backward", 1, {}, {"s": 1}), ("backward", 0, {}, {}),
        ("optimizer", 0, {}, {}),
    ]
    # a module whose later calls are not described per call (other shapes) keeps its first call's keys alone
    assert all(not m["repeat_calls_discarding"] for m in rec.moments(["s", "root"], per_call=()))


def test_collected_timeline_counts_every_call_of_a_shared_layer():
    """The shared layer of bench/fidelity_factories.py runs 4 times: after the last forward 3 later calls of it
    discard, and each later call's backward comes before the first call's."""
    from bench.fidelity_factories import make_shared_encoder

    model, inputs, loss_fn = make_shared_encoder(1, 16, "cpu")
    stats = collect_stats(model, inputs, loss_fn=loss_fn, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")))
    layer = "SharedLayerEncoder.layer"
    assert stats.module(layer).calls == 4
    counts = [t.repeat_calls_discarding.get(layer, 0) for t in stats.timeline]
    in_bw = [t.repeat_calls_in_backward.get(layer, 0) for t in stats.timeline]
    assert max(counts) == 3 and max(in_bw) == 1
    last_forward = max(k for k, t in enumerate(stats.timeline) if t.phase == "forward")
    assert counts[last_forward] == 3
    first_call_bw = next(k for k, t in enumerate(stats.timeline)
                         if t.phase == "backward" and t.key <= stats.fw_post_order.index(layer))
    assert all(c == 0 and b == 0 for c, b in zip(counts[first_call_bw:], in_bw[first_call_bw:]))


def test_only_a_layer_applied_in_a_chain_is_marked_chained():
    """shared_encoder's layer runs on its own previous output (x = layer(x)): chained, through its last op, a norm
    whose output is one [batch, seq, 128] fp32 tensor (batch 2: with batch 1 the attention's input projection
    saves the layer input itself, so checkpointing holds nothing extra). twice_mlp's MLP runs twice on two
    different norms' outputs: not chained."""
    from bench.fidelity_factories import make_shared_encoder, make_twice_mlp

    cost = RooflineCostModel(device_spec("cpu"))
    model, inputs, loss_fn = make_shared_encoder(2, 16, "cpu")
    layer = collect_stats(model, inputs, loss_fn=loss_fn, device="cpu", cost_model=cost).module(
        "SharedLayerEncoder.layer")
    op, nbytes = layer.chained_calls
    assert (op, layer.ops[op].name, nbytes) == (len(layer.ops) - 1, "aten.native_layer_norm", 2 * 16 * 128 * 4)
    model, inputs, loss_fn = make_twice_mlp(1, 16, "cpu")
    stats = collect_stats(model, inputs, loss_fn=loss_fn, device="cpu", cost_model=cost)
    mlp = stats.module("TwiceMLPEncoder.blocks.0.mlp")
    assert mlp.calls == 2 and mlp.chained_calls is None
