"""One model of the fidelity set: collect, plan, apply, run real CPU steps, time them.

The measuring half of ``bench/bench_fidelity.py`` (which formats and writes
the figures). Every model is built the way ``sacplan collect`` builds it
(``estimators.collect.models``), but on the CPU with real tensors and random weights
from a fixed seed, so the baseline and each planned run start from identical
weights and inputs and draw identical dropout masks step by step.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from estimators import BuiltModel, apply_plan, build_from_factory, build_from_hf_config, make_optimizer  # noqa: E402
from estimators.collect import DTYPES, load_factory  # noqa: E402
from estimators.measure import BACKWARD, FORWARD  # noqa: E402
from estimators import CollectRequest, StepMeasure, measure_steps, run_collection  # noqa: E402

BUILD_SEED = 0  # weights and inputs
STEP_SEED = 1  # dropout masks: step k of every run draws after manual_seed(STEP_SEED + k)
TIMING_SEED = 1000
# The planner's defaults: what `sacplan plan` gives, and what the fidelity README's figures were taken with.
# (`--plan-option include_optimizer_state=true` counts AdamW's state, which the real steps from step 2 on hold.)
DEFAULT_PLAN_OPTIONS: dict[str, Any] = {}


@dataclass(frozen=True)
class ModelSpec:
    """A model of the fidelity set with the README's collection settings."""

    name: str
    source: str  # an HF config file name, or factories.py:FUNCTION
    batch: int = 4
    seq: int = 256
    routing: str | None = None  # MoE: what routing the stats and the real run have
    moe_routing: str = "balanced"  # what `sacplan collect --moe-routing` assumes
    config_overrides: tuple[tuple[str, Any], ...] = ()  # HF config keys set on top of the file's

    def request(self, reference: Path) -> CollectRequest:
        """What ``sacplan collect --hf-config X --batch B --seq S --dtype fp32 --device cpu --optimizer adamw`` asks."""
        src = str(reference / self.source)
        kind: dict[str, Any] = {"model": src} if ":" in self.source else {"hf_config": src}
        if self.config_overrides:
            kind["hf_config"] = {**json.loads(Path(src).read_text()), **dict(self.config_overrides)}
        return CollectRequest(**kind, batch=self.batch, seq=self.seq, dtype="fp32", device="cpu",
                              optimizer="adamw", moe_routing=self.moe_routing, name=self.name)


BMM_ROUTING = ("stats: fake router outputs, every token gathers its top-k experts' weights (batched_mm: shapes "
               "depend only on tokens x top-k); real run: the router of the random-weight model routes, and "
               "with batched_mm memory does not depend on where it sends tokens")
GROUPED_ROUTING = ("stats: balanced routing assumed (--moe-routing balanced); with Hugging Face's default experts "
                   "(grouped_mm) every shape depends only on tokens x top-k, so memory does not depend on it; real "
                   "run: the router of the random-weight model routes, unbalanced (see the MoE routing section)")
MODELS = [
    *(ModelSpec(n, f"{n}.json") for n in ("llama", "gpt2", "qwen2", "mistral", "phi3", "gemma", "gemma2_eager",
                                          "opt")),
    ModelSpec("mixtral_bmm", "mixtral_bmm.json", routing=BMM_ROUTING),
    ModelSpec("qwen2_moe_bmm", "qwen2_moe_bmm.json", routing=BMM_ROUTING),
    ModelSpec("mixtral", "mixtral.json", routing=GROUPED_ROUTING),
    ModelSpec("qwen2_moe", "qwen2_moe.json", routing=GROUPED_ROUTING),
    ModelSpec("vit", "factories.py:make_vit", batch=8, seq=64),
    ModelSpec("encoder", "factories.py:make_encoder"),
    ModelSpec("llama_wide", "llama_wide.json", batch=1),
    # not in the reference set: a layer applied several times (modules called more than once)
    ModelSpec("shared_encoder", f"{REPO / 'bench' / 'fidelity_factories.py'}:make_shared_encoder"),
    # and a block applying its one MLP twice (a submodule its parent calls twice)
    ModelSpec("twice_mlp", f"{REPO / 'bench' / 'fidelity_factories.py'}:make_twice_mlp"),
]


@dataclass
class Variant:
    """The baseline (no plan) or one plan, and what its real runs measured."""

    label: str  # "base" or "p50", "p75", ...; "f75": planned for the first step only
    fraction: float | None = None
    first_step_only: bool = False
    plan: Any = None
    budget_bytes: int | None = None
    predicted_bytes: int | None = None  # the plan's peak_bytes; the baseline's: the predicted no-checkpointing peak
    steps: list[StepMeasure] = field(default_factory=list)
    fwbw_seconds: float | None = None  # median CPU seconds of forward + backward
    fwbw_runs: list[float] = field(default_factory=list)  # CPU seconds of forward + backward, round by round
    step_seconds: float | None = None  # median CPU seconds of the whole step
    error: str | None = None

    @property
    def applicable(self) -> bool:
        return self.fraction is None or (self.plan is not None and getattr(self.plan, "status", None)
                                         in ("optimal", "feasible"))


@dataclass
class ModelResult:
    spec: ModelSpec
    baseline_bytes: int | None = None
    compute_ms: float | None = None
    memory_model: str | None = None
    variants: list[Variant] = field(default_factory=list)
    collect_seconds: float | None = None
    error: str | None = None  # collection or planning failed: no real runs


def describe_error(exc: BaseException) -> str:
    """The exception in one table-safe line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return (text[:160] + "...") if len(text) > 160 else text.replace("|", "/")


def build_real(spec: ModelSpec, reference: Path) -> BuiltModel:
    """The model and inputs on the CPU, random weights from ``BUILD_SEED``."""
    req = spec.request(reference)
    torch.manual_seed(BUILD_SEED)
    kw = dict(batch_size=req.batch, seq_len=req.seq, dtype=DTYPES[req.dtype], device=torch.device("cpu"))
    if req.model:
        return build_from_factory(load_factory(req.model), **kw)
    return build_from_hf_config(req.hf_config, **kw)


def _fresh(spec: ModelSpec, reference: Path, variant: Variant, stats: Any) -> tuple[BuiltModel, torch.optim.Optimizer]:
    built = build_real(spec, reference)
    if variant.plan is not None:
        apply_plan(built.model, variant.plan, stats=stats)
    return built, make_optimizer("adamw", [p for p in built.model.parameters() if p.requires_grad])


def plan_variants(stats: Any, fractions: list[float], options: dict[str, Any],
                  first_step_fractions: list[float] = ()) -> tuple[int, float, list[Variant]]:
    """The baseline the plans predict, the step's compute ms and one planned variant per budget fraction
    (of the steady state's baseline), then one first-step-only plan per ``first_step_fractions`` (of the
    first step's)."""
    empty = planner.plan(stats, 1024.0, **options)  # far above these models' peaks: the empty plan
    baseline = int(empty.baseline_peak_bytes)
    out = [Variant("base", predicted_bytes=baseline)]
    first = {**options, "first_step_only": True}
    first_baseline = int(planner.plan(stats, 1024.0, **first).baseline_peak_bytes) if first_step_fractions else 0
    wanted = [(f"p{round(f * 100)}", f, baseline, options) for f in fractions]
    wanted += [(f"f{round(f * 100)}", f, first_baseline, first) for f in first_step_fractions]
    for label, f, base_bytes, opts in wanted:
        v = Variant(label, f, first_step_only=opts is first, budget_bytes=int(f * base_bytes))
        try:
            v.plan = planner.plan(stats, f * base_bytes / planner.GIB, **opts)
            v.predicted_bytes = getattr(v.plan, "peak_bytes", None)
        except Exception as exc:  # noqa: BLE001 (a planner failure is a row of the table)
            v.error = describe_error(exc)
        out.append(v)
    return baseline, float(getattr(empty, "compute_ms", float("nan"))), out


def measure_memory(spec: ModelSpec, reference: Path, stats: Any, variants: list[Variant], steps: int) -> None:
    """Each variant on a fresh model: ``steps`` tracked real steps."""
    for v in variants:
        if not v.applicable or v.error:
            continue
        try:
            built, opt = _fresh(spec, reference, v, stats)
            v.steps = measure_steps(built.model, built.inputs, built.loss_fn, opt, steps=steps, seed=STEP_SEED)
        except Exception as exc:  # noqa: BLE001
            v.error = describe_error(exc)


def measure_time(spec: ModelSpec, reference: Path, stats: Any, variants: list[Variant], reps: int) -> None:
    """Untracked steps, interleaved across variants (one warm-up step each): median CPU seconds."""
    runs = []
    for v in variants:
        if v.applicable and not v.error and not v.first_step_only:
            built, opt = _fresh(spec, reference, v, stats)
            measure_steps(built.model, built.inputs, built.loss_fn, opt, steps=1, track_memory=False,
                          seed=TIMING_SEED)
            runs.append((v, built, opt, [], []))
    for r in range(reps):
        for v, built, opt, fwbw, whole in runs:
            (m,) = measure_steps(built.model, built.inputs, built.loss_fn, opt, steps=1, track_memory=False,
                                 seed=TIMING_SEED + 1 + r)
            fwbw.append(m.phase_cpu_seconds[FORWARD] + m.phase_cpu_seconds[BACKWARD])
            whole.append(m.cpu_seconds)
    for v, _, _, fwbw, whole in runs:
        v.fwbw_seconds, v.step_seconds, v.fwbw_runs = statistics.median(fwbw), statistics.median(whole), fwbw


def measured_recompute_ms(v: Variant, base: Variant) -> float | None:
    """What the plan adds to forward + backward: the median over rounds of (planned - base) in the same round.

    Paired by round, so a drift of the shared machine's load between rounds
    cancels, which a difference of two medians does not.
    """
    if not v.fwbw_runs or len(v.fwbw_runs) != len(base.fwbw_runs):
        return None
    return statistics.median(1e3 * (a - b) for a, b in zip(v.fwbw_runs, base.fwbw_runs))


def run_model(spec: ModelSpec, reference: Path, *, fractions: list[float], steps: int, reps: int,
              options: dict[str, Any], benchmark: bool = False, first_step_fractions: list[float] = ()
              ) -> ModelResult:
    """Collect, plan at each fraction of the predicted baseline, run and time every variant."""
    result = ModelResult(spec)
    try:
        collected = run_collection(dataclasses.replace(spec.request(reference), benchmark=benchmark))
        result.collect_seconds = collected.seconds
        stats = collected.stats
    except Exception as exc:  # noqa: BLE001
        result.error = f"collect: {describe_error(exc)}"
        return result
    try:
        result.baseline_bytes, result.compute_ms, result.variants = plan_variants(stats, fractions, options,
                                                                                  first_step_fractions)
    except Exception as exc:  # noqa: BLE001
        result.error = f"plan: {describe_error(exc)}"
        return result
    result.memory_model = next((str(getattr(v.plan, "memory_model")) for v in result.variants
                                if getattr(v.plan, "memory_model", None) is not None), None)
    measure_memory(spec, reference, stats, result.variants, steps)
    if reps > 0:
        try:
            measure_time(spec, reference, stats, result.variants, reps)
        except Exception as exc:  # noqa: BLE001 (the memory figures stand)
            for v in result.variants:
                v.error = v.error or f"timing: {describe_error(exc)}"
    return result
