"""Plans held to real steps on this machine: what ``sacplan verify`` measures, as data.

The step is the one the stats describe: the same model (built again from the
same ``--hf-config`` or ``--model`` factory, now with real tensors), batch,
sequence, dtype, optimizer (and its arguments) and training loop (micro-batches,
autocast, gradient scaler, clipping), on the device the stats were made for. Each
plan is applied (``estimators.apply_plan``, its dry check included) to a copy
of the model made before any step, so every run starts from the same
weights; ``estimators.measure_steps`` gives the peak of every live storage
(the stats' own measure) and the time of each step. Stats this machine
cannot run as described are refused with the reason (:func:`refusal`).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from estimators.apply import apply_plan
from estimators.collect import BuiltModel, cuda_device_entry
from estimators.common import TrainingLoop, make_optimizer, module_fqns
from estimators.measure import measure_steps
from planner import Plan, Stats, baseline_peak_bytes

__all__ = ["Verified", "refusal", "model_refusal", "run_device", "training_loop", "verify_plans", "KNOWN_METADATA"]

# The metadata fields this command knows how to reproduce (or knows change nothing in a real step); a stats
# document recording any other setting is refused rather than run as a different step.
KNOWN_METADATA = frozenset({"model_name", "batch_size", "seq_len", "input_shape", "dtype", "device", "target_device",
                            "optimizer", "optimizer_kwargs", "grad_accumulation", "max_grad_norm", "grad_scaler",
                            "torch_version", "collector_version", "tags", "model_settings", "sharding",
                            "pipeline", "host_link_gbps"})  # the host link: a planning figure, no step setting


@dataclass(frozen=True)
class Verified:
    """One run: no checkpointing (``plan`` None) or one plan, predicted against measured."""

    plan: Plan | None
    predicted_peak_bytes: int
    measured_peak_bytes: int
    predicted_recompute_ms: float | None  # None for the run without a plan
    measured_recompute_ms: float | None  # the median step with the plan less the median step without
    noise_ms: float  # the median distance of a step without a plan from their median: how far to trust a difference
    measured_host_bytes: int | None = None  # a plan that offloads: the most host bytes live at once (None: none)


def run_device(stats: Stats) -> str:
    """Where the stats' step runs: ``cpu`` for the cpu target, else ``cuda``."""
    return "cpu" if (stats.metadata.target_device or "cpu").lower() == "cpu" else "cuda"


def refusal(stats: Stats) -> str | None:
    """Why this machine cannot run the step the stats describe, or None."""
    sharding = stats.metadata.sharding
    if sharding is not None:
        kind = {"fsdp2": "an FSDP2 (fully_shard) job", "tp": "a tensor-parallel job"}.get(sharding.kind,
                                                                                       f"a {sharding.kind} job")
        return (f"these stats are one rank of {kind} over {sharding.world_size} ranks (sharded parameters, gathered "
                f"units, collective buffers): sacplan verify runs one unsharded process; measure the real job per "
                f"rank with estimators.measure_fsdp_steps (docs/fsdp.md)")
    stage = stats.metadata.pipeline
    if stage is not None:
        return (f"these stats are stage {stage.stage} of a {stage.stages}-stage {stage.schedule} pipeline with "
                f"{stage.microbatches} microbatches in flight (P2P buffers, several microbatches held): sacplan "
                f"verify runs one process; measure the real pipeline per stage with "
                f"estimators.measure_pipeline_stage (docs/pipeline.md, bench/bench_pipeline.py)")
    unknown = sorted(k for k, v in stats.metadata.model_dump().items() if k not in KNOWN_METADATA and v)
    if unknown:
        return (f"the stats record settings sacplan verify does not reproduce yet ({', '.join(unknown)}): it would "
                f"measure another step than the one planned")
    target = stats.metadata.target_device or "cpu"
    if run_device(stats) == "cpu":
        return None
    if not torch.cuda.is_available():
        return (f"these stats are for {target}, and this machine has no CUDA device: verify on a {target}, or "
                f"collect for this machine (--target-device cpu) to verify here")
    here = torch.cuda.get_device_name()
    try:
        same = cuda_device_entry(here) == target
    except ValueError:
        same = False
    if not same:
        return (f"these stats are for {target}, and this machine's GPU is {here}: its memory and kernels are "
                f"another device's; collect with --device cuda here to verify on it")
    return None


def model_refusal(stats: Stats, built: BuiltModel) -> str | None:
    """Why ``built`` is not the model the stats were collected from, or None."""
    meta = stats.metadata
    if meta.input_shape is not None and built.input_shape is not None and meta.input_shape != built.input_shape:
        return (f"the model's inputs have shape {built.input_shape}, the stats' step {meta.input_shape}: build "
                f"it as collected (the same --batch and --seq come from the stats)")
    names = set(module_fqns(built.model).values())
    missing = [fqn for fqn in stats.fw_pre_order if fqn not in names]
    if missing:
        return (f"the model is not the one the stats describe: {len(missing)} of their modules are not in it "
                f"(first: {missing[0]}); give the --hf-config or --model the stats were collected from")
    return None


def verify_plans(stats: Stats, plans: list[Plan], built: BuiltModel, *, rounds: int = 5,
                 progress: Callable[[str], None] | None = None) -> list[Verified]:
    """Run the step without checkpointing and under each plan; predicted against measured, in that order.

    Memory: two steps each (the second holds the optimizer state, as the
    planned steady state does; a ``first_step_only`` plan is held to the
    first). Time: ``rounds`` interleaved steps of every run, memory not
    tracked; process CPU time of one thread on the CPU, wall time between
    synchronizations on CUDA; the medians' difference is the measured
    recompute.
    """
    device = next((p.device for p in built.model.parameters()), torch.device("cpu"))
    runs: list[tuple[Plan | None, Any]] = [(None, built.model)]
    for plan in plans:  # copies made before any step: every run starts from the same weights
        model = copy.deepcopy(built.model)
        apply_plan(model, plan, stats=stats, example_inputs=built.inputs, loss_fn=built.loss_fn)
        runs.append((plan, model))
    optimizers = [_optimizer(stats, model) for _, model in runs]
    loop = training_loop(stats)
    peaks, hosts = [], []
    for (plan, model), opt in zip(runs, optimizers):
        if progress:
            progress(f"  memory: {'no checkpointing' if plan is None else f'{plan.memory_budget_gib:g} GiB plan'}")
        steps = measure_steps(model, built.inputs, built.loss_fn, opt, steps=2, track_memory=True, loop=loop)
        held = steps[0 if plan is not None and plan.first_step_only else -1]
        peaks.append(held.peak_bytes)
        hosts.append(held.host_peak_bytes)
    seconds = _timed_rounds(runs, optimizers, built, device, rounds, progress, loop)
    base_s = statistics.median(seconds[0])
    noise_ms = statistics.median(abs(s - base_s) for s in seconds[0]) * 1e3
    out = [Verified(None, baseline_peak_bytes(stats), peaks[0], None, None, noise_ms)]
    for (plan, _), peak, secs, host in zip(runs[1:], peaks[1:], seconds[1:], hosts[1:]):
        predicted = plan.recompute_ms_per_optimizer_step or plan.recompute_ms  # every micro-batch recomputes
        out.append(Verified(plan, plan.peak_bytes, peak, predicted, (statistics.median(secs) - base_s) * 1e3,
                            noise_ms, host))
    return out


def _timed_rounds(runs: list[tuple[Plan | None, Any]], optimizers: list[torch.optim.Optimizer], built: BuiltModel,
                  device: torch.device, rounds: int, progress: Callable[[str], None] | None,
                  loop: TrainingLoop) -> list[list[float]]:
    """Each run's step seconds, ``rounds`` interleaved rounds after one untimed; one CPU thread on the CPU, as
    ``sacplan collect --benchmark`` times (several threads' CPU time counts their waiting too)."""
    threads = torch.get_num_threads()
    if device.type != "cuda":
        torch.set_num_threads(1)
    seconds: list[list[float]] = [[] for _ in runs]
    try:
        for k in range(rounds + 1):
            if progress and k:
                progress(f"  time: round {k} of {rounds}")
            for i, ((_, model), opt) in enumerate(zip(runs, optimizers)):
                took = _step_seconds(model, built, opt, device, seed=k, loop=loop)
                if k:  # round 0 warms up
                    seconds[i].append(took)
    finally:
        torch.set_num_threads(threads)
    return seconds


def training_loop(stats: Stats) -> TrainingLoop:
    """The loop the stats' step ran: micro-batches, autocast, gradient scaler, clipping."""
    m = stats.metadata
    return TrainingLoop(grad_accumulation=m.grad_accumulation or 1, autocast=m.model_settings.get("autocast"),
                        grad_scaler=bool(m.grad_scaler), max_grad_norm=m.max_grad_norm)


def _optimizer(stats: Stats, model: Any) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    m = stats.metadata
    foreach = m.tags.get("optimizer_step") == "foreach"
    opt = make_optimizer(m.optimizer or "adamw", params, foreach=foreach, kwargs=m.optimizer_kwargs)
    return opt if opt is not None else torch.optim.SGD(params, lr=0.0)  # "none": a step that keeps no state


def _step_seconds(model: Any, built: BuiltModel, opt: torch.optim.Optimizer, device: torch.device, seed: int,
                  loop: TrainingLoop) -> float:
    if device.type != "cuda":
        return measure_steps(model, built.inputs, built.loss_fn, opt, steps=1, track_memory=False, seed=seed,
                             loop=loop)[0].cpu_seconds
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    measure_steps(model, built.inputs, built.loss_fn, opt, steps=1, track_memory=False, seed=seed, loop=loop)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0
