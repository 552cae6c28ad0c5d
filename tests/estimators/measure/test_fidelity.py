"""Plans that hold in real runs (issue 16): a plan's budget against real CPU training steps.

The reduced version of ``bench/bench_fidelity.py``: small models, memory only.
Each model is collected, planned at 70% of the predicted no-checkpointing
peak, applied to a copy of the model and trained for two real steps with
AdamW (``estimators.measure.real_step.measure_steps``); its real peak must stay
within the budget at step 1 (no optimizer state yet) and step 2 (the steady
state), and the steady-state peak must be the predicted one within 1%, with
and without the plan. Run with ``-s`` to see real/predicted.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import planner  # noqa: E402
from estimators import RooflineCostModel, apply_plan, collect_stats, device_spec, make_optimizer  # noqa: E402
from estimators import CollectRequest, build_from_hf_config, measure_steps, run_collection  # noqa: E402
from estimators.collect import TopKRecorder  # noqa: E402
from est_helpers import TINY_GEMMA2_EAGER, TINY_LLAMA, TINY_MIXTRAL  # noqa: E402
from bench.fidelity_factories import make_shared_encoder, make_twice_mlp  # noqa: E402

BUDGET_FRACTION = 0.7  # the encoder has no plan at 60% once its optimizer state counts
# The planner's defaults, as bench/bench_fidelity.py plans.
PLAN_OPTIONS: dict[str, Any] = {}


class ViT(nn.Module):
    """``make_vit`` of ../shared/reference/fidelity/factories.py (64x64 images, 8-pixel patches)."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 128, depth: int = 4, heads: int = 4):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, dim))
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True,
                                           activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(self.drop(x))[:, 0]))


class EncoderClassifier(nn.Module):
    """``make_encoder`` of ../shared/reference/fidelity/factories.py, at the same width and depth."""

    def __init__(self, vocab: int = 2048, dim: int = 128, depth: int = 4, heads: int = 4, mlp: int = 512):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, mlp, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)).mean(1))


def llama() -> tuple[nn.Module, dict, None]:
    """The tiny Llama, on enough tokens that activations outweigh parameters and AdamW state."""
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=4, seq_len=64, dtype=torch.float32,
                                 device=torch.device("cpu"))
    return built.model, built.inputs, None


def _cross_entropy(out: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, torch.arange(out.shape[0]) % out.shape[1])


def encoder() -> tuple[nn.Module, tuple, Any]:
    torch.manual_seed(0)
    return EncoderClassifier().train(), (torch.randint(0, 2048, (2, 128)),), _cross_entropy


def vit() -> tuple[nn.Module, tuple, Any]:
    """The fidelity set's ViT at its settings (batch 8, 64 patches)."""
    torch.manual_seed(0)
    return ViT().train(), (torch.randn(8, 3, 64, 64),), _cross_entropy


def mixtral() -> tuple[nn.Module, dict, None]:
    """The tiny Mixtral with Hugging Face's default experts: stats assume balanced routing, the real router is not."""
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_MIXTRAL, batch_size=8, seq_len=64, dtype=torch.float32,
                                 device=torch.device("cpu"))
    return built.model, built.inputs, None


def gemma2_eager() -> tuple[nn.Module, dict, None]:
    """A small Gemma2 with eager attention: a full-attention and a sliding-window mask, each taken by every other
    layer and saved by no op, so checkpointing a layer holds its mask (seq 256: each mask 512 KiB)."""
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_GEMMA2_EAGER, batch_size=2, seq_len=256, dtype=torch.float32,
                                 device=torch.device("cpu"))
    return built.model, built.inputs, None




def shared_encoder() -> tuple[nn.Module, tuple, Any]:
    """One encoder layer applied 4 times (bench/fidelity_factories.py): its modules are called 4 times a step."""
    torch.manual_seed(0)
    return make_shared_encoder(2, 64, "cpu")


def twice_mlp() -> tuple[nn.Module, tuple, Any]:
    """Blocks whose one MLP is applied twice (bench/fidelity_factories.py)."""
    torch.manual_seed(0)
    return make_twice_mlp(2, 256, "cpu")


MODELS = {"llama": llama, "encoder": encoder, "vit": vit, "gemma2_eager": gemma2_eager}
# Modules called more than once: at these fractions the plans checkpoint such a module (the shared layer,
# a twice-applied MLP), so every call's discard and held inputs must be counted where they are in effect.
MULTI_CALL_MODELS = {"shared_encoder": (shared_encoder, 0.75), "twice_mlp": (twice_mlp, 0.9)}
MOE_MODELS = {"mixtral": mixtral}


@dataclass
class Run:
    name: str
    budget_bytes: int
    predicted_bytes: int
    baseline_predicted_bytes: int
    peaks: list[int]
    baseline_peaks: list[int]
    most_calls: int  # the most forward calls of a planned module
    held_by: dict[int, list[str]]  # tensor number -> the plan's modules holding it (their stats' held_inputs)


def _run(name: str, fraction: float = BUDGET_FRACTION) -> Run:
    factories = {**MODELS, **MOE_MODELS, **{k: f for k, (f, _) in MULTI_CALL_MODELS.items()}}
    model, inputs, loss_fn = factories[name]()
    stats = collect_stats(model, inputs, loss_fn=loss_fn, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    baseline = planner.baseline_peak_bytes(stats, **PLAN_OPTIONS)
    plan = planner.plan(stats, fraction * baseline / planner.GIB, **PLAN_OPTIONS)
    assert plan.status in ("optimal", "feasible") and plan.modules, (plan.status, plan.message)
    peaks = {}
    for label, p in (("base", None), ("plan", plan)):
        m = copy.deepcopy(model)
        if p is not None:
            apply_plan(m, p, stats=stats)
        opt = make_optimizer("adamw", list(m.parameters()))
        peaks[label] = [s.peak_bytes for s in measure_steps(m, inputs, loss_fn, opt, steps=2)]
    held_by: dict[int, list[str]] = {}
    for pm in plan.modules:
        for number, _ in stats.module(pm.fqn).held_inputs or ():
            held_by.setdefault(number, []).append(pm.fqn)
    run = Run(name, int(plan.memory_budget_gib * planner.GIB), plan.peak_bytes, baseline, peaks["plan"],
              peaks["base"], max(stats.module(pm.fqn).calls for pm in plan.modules), held_by)
    print(f"\n{name}: budget {run.budget_bytes}, plan peak {run.predicted_bytes}, real {run.peaks} "
          f"(real/predicted {[round(x / run.predicted_bytes, 3) for x in run.peaks]}, "
          f"real/budget {[round(x / run.budget_bytes, 3) for x in run.peaks]}); baseline predicted "
          f"{baseline}, real {run.baseline_peaks} "
          f"(real/predicted {[round(x / baseline, 3) for x in run.baseline_peaks]})")
    return run


@pytest.fixture(scope="module")
def runs() -> Any:
    """Each model's run, made once on first use; on one thread (a second one mostly spins on a shared machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {}
    torch.set_num_threads(threads)


def _get(runs: dict[str, Run], name: str) -> Run:
    if name not in runs:
        runs[name] = _run(name)
    return runs[name]


# planner 0.4.1 (PyTorch's model, no optimizer state) missed these: real peak / budget was 1.07 for llama
# at step 2, 1.10 and 1.42 for the encoder at steps 1 and 2, 1.08 for the ViT at step 2. Planner 0.6.0
# without the held inputs at a module's own backward: 1.003 for the encoder at step 2 (its plan checkpointed
# the last layer's attention, whose input the step without checkpointing frees during the forward).
WITHIN_BUDGET = [(name, step) for name in ("llama", "encoder", "vit", "gemma2_eager") for step in (1, 2)]


@pytest.mark.parametrize("name, step", WITHIN_BUDGET)
def test_real_peak_within_budget(runs: dict[str, Run], name: str, step: int):
    run = _get(runs, name)
    assert run.peaks[step - 1] <= run.budget_bytes, (name, step, run.peaks[step - 1] / run.budget_bytes)


@pytest.mark.parametrize("name", list(MODELS))
def test_plan_lowers_the_real_peak(runs: dict[str, Run], name: str):
    run = _get(runs, name)
    assert all(p < b for p, b in zip(run.peaks, run.baseline_peaks)), (run.peaks, run.baseline_peaks)


@pytest.mark.parametrize("name", list(MODELS))
def test_steady_state_peak_is_predicted_within_one_percent(runs: dict[str, Run], name: str):
    # The plan's peak_bytes and baseline_peak_bytes hold for every step (steady state by default):
    # step 2, with AdamW's state live throughout, is where they are exact.
    run = _get(runs, name)
    assert abs(run.peaks[1] / run.predicted_bytes - 1) <= 0.01, (run.peaks, run.predicted_bytes)
    assert abs(run.baseline_peaks[1] / run.baseline_predicted_bytes - 1) <= 0.01, (run.baseline_peaks,
                                                                          run.baseline_predicted_bytes)


# At 70% the plan recomputes layer 1's experts (grouped_mm). Before recompute_op_count the plan could save the
# module's last two ops (index, sum: 393216 bytes), which autograd does not need: selective checkpointing keeps them
# cached through the module's backward because its early-stopped recompute never reaches them, and the real
# steady-state peak was 4.4% over the budget (9333452 vs 8937014 bytes). Ops past the stop point now cost nothing to
# recompute, so no plan saves them. Routing is not the cause: every shape of the grouped_mm experts is tokens x
# top-k whatever the router does.
MOE_FRACTIONS = [0.7, 0.9]


@pytest.mark.parametrize("fraction", MOE_FRACTIONS)
def test_moe_budget_holds_under_the_real_routing_not_the_assumed_one(runs: dict[str, Run], fraction: float):
    """The tiny Mixtral's real router sends more than a balanced share to some expert; the budget holds anyway."""
    model, inputs, _ = mixtral()
    routers = TopKRecorder()
    with torch.no_grad(), routers:
        model(**inputs)
    assert len(routers.indices) == TINY_MIXTRAL["num_hidden_layers"] and max(routers.busiest_over_share()) > 1
    if ("mixtral", fraction) not in runs:
        runs[("mixtral", fraction)] = _run("mixtral", fraction)
    run = runs[("mixtral", fraction)]
    assert all(peak <= run.budget_bytes for peak in run.peaks), (run.peaks, run.budget_bytes)


@pytest.mark.parametrize("name", ["llama", "encoder"])
def test_first_step_only_plan_holds_its_first_step(runs: dict[str, Run], name: str):
    """Planned with first_step_only=True: step 1, before any optimizer state, within budget and within 1%."""
    model, inputs, loss_fn = MODELS[name]()
    stats = collect_stats(model, inputs, loss_fn=loss_fn, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    baseline = planner.baseline_peak_bytes(stats, first_step_only=True)
    assert baseline < planner.baseline_peak_bytes(stats)  # the steady state holds AdamW's state on top
    plan = planner.plan(stats, 0.8 * baseline / planner.GIB, first_step_only=True)  # the encoder: none at 70%
    assert plan.status in ("optimal", "feasible") and plan.modules and plan.first_step_only, plan.message
    apply_plan(model, plan, stats=stats)
    (step1,) = measure_steps(model, inputs, loss_fn, make_optimizer("adamw", list(model.parameters())), steps=1)
    assert step1.peak_bytes <= plan.memory_budget_gib * planner.GIB, (step1.peak_bytes, plan.memory_budget_gib)
    assert abs(step1.peak_bytes / plan.peak_bytes - 1) <= 0.01, (step1.peak_bytes, plan.peak_bytes)


@pytest.mark.parametrize("name", list(MULTI_CALL_MODELS))
def test_modules_called_more_than_once_are_planned_per_call(runs: dict[str, Run], name: str):
    """Planner 0.6 credited only a shared module's first call: shared_encoder's real/predicted was 0.76 at 90%
    (bench/RESULTS.md, Fidelity) and it had no plan at 75%. Every call's span counted, the plan holds its budget
    at both steps and its steady-state peak is the predicted one within 1%, with and without the plan."""
    if name not in runs:
        runs[name] = _run(name, MULTI_CALL_MODELS[name][1])
    run = runs[name]
    assert run.most_calls > 1, "the plan checkpoints no module called more than once: the case is not tested"
    assert all(peak <= run.budget_bytes for peak in run.peaks), (run.peaks, run.budget_bytes)
    assert abs(run.peaks[1] / run.predicted_bytes - 1) <= 0.01, (run.peaks, run.predicted_bytes)
    assert abs(run.baseline_peaks[1] / run.baseline_predicted_bytes - 1) <= 0.01, (run.baseline_peaks,
                                                                          run.baseline_predicted_bytes)


def test_a_mask_several_checkpointed_layers_hold_counts_once(runs: dict[str, Run]):
    """At 50% the plan checkpoints layers that take the same mask; the real step holds it once.

    Planner 0.6.0 counted it once per layer (bench/RESULTS.md "Fidelity": gemma2_eager p50 real/predicted
    0.97); here that over-states the peak by 512 KiB per extra holder, about 6% of this plan's peak.
    """
    if ("gemma2_eager", 0.5) not in runs:
        runs[("gemma2_eager", 0.5)] = _run("gemma2_eager", 0.5)
    run = runs[("gemma2_eager", 0.5)]
    shared = [(n, fqns) for n, fqns in run.held_by.items() if len(fqns) > 1]
    assert shared, run.held_by  # else this run does not test what it is for
    assert all(peak <= run.budget_bytes for peak in run.peaks), (run.peaks, run.budget_bytes)
    assert abs(run.peaks[1] / run.predicted_bytes - 1) <= 0.01, (run.peaks, run.predicted_bytes)


def _two_steps_on_one_thread(model: nn.Module, inputs: Any, loss_fn: Any) -> list[int]:
    """The real peaks of two AdamW steps, run on one thread as bench/bench_fidelity.py runs them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [s.peak_bytes for s in measure_steps(model, inputs, loss_fn,
                                                    make_optimizer("adamw", list(model.parameters())), steps=2)]
    finally:
        torch.set_num_threads(threads)


def test_an_alias_op_saved_with_its_source_counts_once():
    """twice_mlp as bench/bench_fidelity.py collects it (``sacplan collect --model``, 4 x 256 tokens) and plans it
    at 75%: the plan checkpoints block 0's attention and saves its in-projection's ``clone`` of the transposed
    input together with the ``_unsafe_view`` that returns the clone's storage: one allocation in the real step.

    Planner 0.7.1 counted both ops' bytes (bench/RESULTS.md "Fidelity", twice_mlp p75: real/predicted 0.9896,
    the predicted peak 524288 bytes over the real one at step 2). The op that only hands back a storage now
    costs nothing and shares its source's decision, as an in-place op does.
    """
    request = CollectRequest(model=f"{inspect.getfile(make_twice_mlp)}:make_twice_mlp", batch=4,
                             seq=256, dtype="fp32", device="cpu", optimizer="adamw")
    stats = run_collection(request).stats
    plan = planner.plan(stats, 0.75 * planner.baseline_peak_bytes(stats) / planner.GIB)
    attn = next(pm for pm in plan.modules if pm.fqn.endswith("blocks.0.attn"))
    ops = stats.module(attn.fqn).ops
    # the in-projection of a transposed (batch_first) input: clone (made contiguous), _unsafe_view of the clone
    pairs = [k for k in range(1, len(ops)) if (ops[k - 1].name, ops[k].name) == ("aten.clone", "aten._unsafe_view")
             and attn.save[k - 1] and attn.save[k]]
    assert pairs, attn.save  # else this plan does not test what it is for
    torch.manual_seed(0)
    model, inputs, loss_fn = make_twice_mlp(4, 256, "cpu")
    apply_plan(model, plan, stats=stats)
    peaks = _two_steps_on_one_thread(model, inputs, loss_fn)
    assert all(peak <= plan.memory_budget_gib * planner.GIB for peak in peaks), (peaks, plan.memory_budget_gib)
    assert peaks[1] == plan.peak_bytes, (peaks, plan.peak_bytes)
    assert all(ops[k].output_bytes == 0 and ops[k].inplace_parent == k - 1 for k in pairs)


def test_a_chained_layer_saving_its_output_counts_it_once():
    """shared_encoder as bench/bench_fidelity.py collects it (4 x 256 tokens): its layer runs 4 times, each call on
    the output of the call before. Checkpointed with its last op (the final norm) saved, call k's saved output and
    call k+1's held input are one tensor in the real step.

    Planner 0.7.3 counted it twice (bench/RESULTS.md "Fidelity", shared_encoder p50 with --benchmark timings:
    predicted 51.6 MiB, real 50.1 MiB, real/predicted 0.97: three [4, 256, 128] fp32 tensors). The save list
    here is the plan's with that op saved too, priced by the memory model and run for real.
    """
    from planner.memory_model import discardable_bytes

    request = CollectRequest(model=f"{inspect.getfile(make_shared_encoder)}:make_shared_encoder", batch=4,
                             seq=256, dtype="fp32", device="cpu", optimizer="adamw")
    stats = run_collection(request).stats
    layer = stats.module("SharedLayerEncoder.layer")
    assert layer.calls == 4 and layer.chained_calls is not None
    op, nbytes = layer.chained_calls
    # the layer's output (its final norm's), one [batch, seq, dim] fp32 tensor, taken by the next call
    assert (layer.ops[op].name, nbytes) == ("aten.native_layer_norm", 4 * 256 * 128 * 4)
    plan = planner.plan(stats, 0.5 * planner.baseline_peak_bytes(stats) / planner.GIB)
    (pm,) = [m for m in plan.modules if m.fqn == layer.fqn]
    save = list(pm.save)
    save[op] = 1
    saved = sum(o.output_bytes for o, s in zip(layer.ops, save) if s)
    discarded = discardable_bytes(layer) - saved
    model = planner.memory_model(stats)
    predicted = model.peak_bytes({layer.fqn: discarded}, saves={layer.fqn: save})
    twice = model.peak_bytes({layer.fqn: discarded})  # without the save list: the tensor counted twice
    assert twice - predicted >= 3 * nbytes * 0.99, (twice, predicted)
    forced = plan.model_copy(update={"modules": [pm.model_copy(update={"save": save, "saved_bytes": saved,
                                                                        "discarded_bytes": discarded})]})
    torch.manual_seed(0)
    real_model, inputs, loss_fn = make_shared_encoder(4, 256, "cpu")
    apply_plan(real_model, forced, stats=stats)
    peaks = _two_steps_on_one_thread(real_model, inputs, loss_fn)
    assert abs(peaks[1] / predicted - 1) <= 0.001, (peaks, predicted, twice)


def test_a_saved_layer_output_the_next_checkpointed_layer_holds_counts_once():
    """The encoder's layers 0 and 1 both checkpointed, layer 0 saving its final norm: that output is layer 1's input,
    which checkpointing layer 1 holds (no op of layer 1 saves it). One tensor in the real step; counted once by a
    plan's peak (op ``held_tensors``), twice without the save lists."""
    from planner.memory_model import discardable_bytes
    from planner.ops.frontier import module_frontier
    from planner.plan_format import PlannedModule

    model, inputs, loss_fn = encoder()
    stats = collect_stats(model, inputs, loss_fn=loss_fn, optimizer="adamw", device="cpu",
                          cost_model=RooflineCostModel(device_spec("cpu")))
    first, second = (stats.module(f"EncoderClassifier.encoder.layers.{i}") for i in (0, 1))
    (number, nbytes), = second.held_inputs
    last = len(first.ops) - 1
    assert first.ops[last].name == "aten.native_layer_norm" and first.ops[last].held_tensors == [number]
    assert nbytes == 2 * 128 * 128 * 4  # one [batch, seq, dim] fp32 tensor
    decided = {}
    for m in (first, second):
        save = module_frontier(m.ops, m.force_store_random).save_list(0)  # the most each can discard
        if m is first:
            save[last] = 1
        saved = sum(o.output_bytes for o, s in zip(m.ops, save) if s)
        decided[m.fqn] = (save, saved, discardable_bytes(m) - saved)
    memory = planner.memory_model(stats)
    discards = {f: d for f, (_, _, d) in decided.items()}
    predicted = memory.peak_bytes(discards, saves={f: s for f, (s, _, _) in decided.items()})
    twice = memory.peak_bytes(discards)
    assert twice - predicted == nbytes, (twice, predicted)
    base_plan = planner.plan(stats, 1024.0)
    forced = base_plan.model_copy(update={"modules": [
        PlannedModule(fqn=f, discard_ratio=0.0, discarded_bytes=d, saved_bytes=saved, recompute_ms=0.0, save=save,
                      op_names=[o.name for o in stats.module(f).ops]) for f, (save, saved, d) in decided.items()]})
    apply_plan(model, forced, stats=stats)
    peaks = [s.peak_bytes for s in measure_steps(model, inputs, loss_fn,
                                                 make_optimizer("adamw", list(model.parameters())), steps=2)]
    assert peaks[1] == predicted, (peaks, predicted, twice)
