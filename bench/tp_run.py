"""One rank of a real tensor-parallel job (``bench/bench_tensor_parallel.py``, ``tests/estimators/measure``).

Every run starts from a fresh model built as ``sacplan collect`` builds it,
random weights from one seed (every rank the same), then, in torchtitan's
order: tensor parallel (:func:`estimators.parallelize_tp`: the user's
function or the model's HF plan) over the TP dimension of the job's mesh
(:class:`estimators.ParallelDims`), the plan (``apply_plan``), then
``fully_shard`` when the job has FSDP2. The gradients of one seeded step,
then AdamW (``foreach=False``, as the collector models a CPU target) and
``measure_steps``: each step's peak of every distinct live storage, DTensors
by their local shard.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

BUILD_SEED = 0  # weights and inputs: every rank builds the same model
STEP_SEED = 1  # dropout masks: step k draws after manual_seed(STEP_SEED + k) on every rank


@dataclass(frozen=True)
class TpRun:
    """One real run: a model, its parallelism, a plan (or none)."""

    label: str  # "base", "p60", "p85", "min"
    hf_config: dict
    batch: int
    seq: int
    tp_size: int = 2
    fsdp_size: int = 1
    parallelize: str | None = None
    sequence_parallel: bool = False
    plan: dict | None = None
    stats_path: str | None = None  # the stats the plan was made from (op names for apply_plan)
    steps: int = 3
    compile_backend: str | None = None  # the model compiled whole after the plan: torch.compile(model, backend=...)


@dataclass
class TpRankResult:
    """What one rank measured for one run."""

    label: str
    peaks: list[int] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    live_at_peak: list[dict[str, int]] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)  # this rank's local gradient shards, one seeded step
    error: str | None = None


def _dims(run: TpRun) -> Any:
    from estimators import FsdpSetup, ParallelDims

    return ParallelDims(fsdp=FsdpSetup(run.fsdp_size) if run.fsdp_size > 1 else None, tp_size=run.tp_size,
                        parallelize=run.parallelize, sequence_parallel=run.sequence_parallel)


def build_parallel(run: TpRun, mesh: Any) -> Any:
    """The run's model built (seed ``BUILD_SEED``), TP applied, the plan applied, then ``fully_shard`` if any."""
    from estimators import apply_plan, build_from_hf_config, parallelize_tp, shard

    dims = _dims(run)
    torch.manual_seed(BUILD_SEED)
    built = build_from_hf_config(run.hf_config, batch_size=run.batch, seq_len=run.seq, dtype=torch.float32,
                                 device=torch.device("cpu"))
    parallelize_tp(built.model, mesh["tp"], parallelize=dims.parallelize, sequence_parallel=dims.sequence_parallel)
    if run.plan is not None:
        stats = json.loads(Path(run.stats_path).read_text()) if run.stats_path else None
        # under compile, the dry step records what the trace runs (check_plan), before the model is compiled
        apply_plan(built.model, run.plan, stats=stats, compile_backend=run.compile_backend,
                   example_inputs=built.inputs if run.compile_backend else None)
    if dims.fsdp is not None:
        shard(built.model, mesh["dp_shard"], world_size=dims.fsdp_size)
    if run.compile_backend is not None:
        torch._dynamo.reset()  # layout: allow-private (each run compiles its own model afresh)
        built.model = torch.compile(built.model, backend=run.compile_backend)
    return built


def _one(run: TpRun, mesh: Any) -> TpRankResult:
    from estimators import SettledFunctionalCollectives

    built = build_parallel(run, mesh)
    with SettledFunctionalCollectives():  # gloo lets go of TP's collective buffers in program order
        return measure_run(run, built)


def measure_run(run: TpRun, built: Any) -> TpRankResult:
    """The gradients of one seeded step (before any optimizer state), then ``run.steps`` measured AdamW steps."""
    from torch.distributed.tensor import DTensor

    from estimators import call_model, make_optimizer, measure_steps

    torch.manual_seed(STEP_SEED)
    loss_fn = built.loss_fn or (lambda out: out.loss)
    loss_fn(call_model(built.model, built.inputs)).backward()
    grads = [(p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
             for p in built.model.parameters()]
    built.model.zero_grad(set_to_none=True)
    opt = make_optimizer("adamw", [p for p in built.model.parameters() if p.requires_grad], foreach=False)
    steps = measure_steps(built.model, built.inputs, built.loss_fn, opt, steps=run.steps, seed=STEP_SEED)
    return TpRankResult(run.label, [m.peak_bytes for m in steps], [m.peak_phase for m in steps],
                        [m.loss for m in steps], [dict(m.peak_live_bytes) for m in steps], grads)


def run_tp(rank: int, world_size: int, runs: list[TpRun]) -> list[TpRankResult]:
    """Every run on this rank, in order (``estimators.run_ranks`` calls it on each rank)."""
    dims = _dims(runs[0])
    if dims.world_size != world_size:
        raise ValueError(f"the runs want {dims.world_size} ranks, got {world_size}")
    mesh = dims.make_mesh("cpu")
    out = []
    for run in runs:
        try:
            out.append(_one(run, mesh))
        except Exception as exc:  # noqa: BLE001 (a failed run is a row of the table; the ranks fail alike)
            out.append(TpRankResult(run.label, error=f"{type(exc).__name__}: {exc}"[:300]))
    return out
