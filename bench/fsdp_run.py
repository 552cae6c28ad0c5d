"""One rank of ``bench/bench_fsdp.py``: build, plan, shard and train each variant, measuring its peak.

Every variant starts from a fresh model built the way ``sacplan collect``
builds it (``estimators.collect.models``) on the CPU, random weights from a fixed
seed; the plan (if any) is applied before ``fully_shard``, as torchtitan
does; then AdamW (``foreach=False``, as the collector models it) and
``estimators.measure.real_fsdp.measure_fsdp_steps``.
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

BUILD_SEED = 0  # weights and inputs, as bench/fidelity.py
STEP_SEED = 1  # dropout masks: step k draws after manual_seed(STEP_SEED + k) on every rank


@dataclass(frozen=True)
class RunSpec:
    """One real run: a model, a precision, a plan (or none)."""

    label: str  # "base", "p60", "p85"
    hf_config: dict
    batch: int
    seq: int
    mixed_precision: str | None = None  # None (fp32) or "bf16"
    plan: dict | None = None
    stats_path: str | None = None  # the stats the plan was made from (op names for apply_plan)
    steps: int = 3
    reshard_after_forward: bool = True


@dataclass
class RankResult:
    """What one rank measured for one run."""

    label: str
    mixed_precision: str | None
    peaks: list[int] = field(default_factory=list)
    peaks_with_backend: list[int] = field(default_factory=list)  # with gloo's own reduce-scatter copies
    phases: list[str] = field(default_factory=list)
    live_at_peak: list[dict[str, int]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    units: list[str] = field(default_factory=list)
    error: str | None = None
    host_peaks: list[int | None] = field(default_factory=list)  # offloaded activations' host copies, per step


def _one(spec: RunSpec, mesh: Any) -> RankResult:
    from estimators import apply_plan, build_from_hf_config, make_optimizer, measure_fsdp_steps, shard

    torch.manual_seed(BUILD_SEED)
    built = build_from_hf_config(spec.hf_config, batch_size=spec.batch, seq_len=spec.seq, dtype=torch.float32,
                                 device=torch.device("cpu"))
    if spec.plan is not None:
        stats = json.loads(Path(spec.stats_path).read_text()) if spec.stats_path else None
        apply_plan(built.model, spec.plan, stats=stats)
    units = shard(built.model, mesh, world_size=mesh.size(), mixed_precision=spec.mixed_precision,
                  reshard_after_forward=spec.reshard_after_forward)
    opt = make_optimizer("adamw", [p for p in built.model.parameters() if p.requires_grad])
    steps = measure_fsdp_steps(built.model, built.inputs, built.loss_fn, opt, steps=spec.steps, seed=STEP_SEED)
    return RankResult(spec.label, spec.mixed_precision, [m.peak_bytes for m in steps],
                      [m.peak_with_backend_bytes for m in steps], [m.peak_phase for m in steps],
                      [dict(m.peak_live_bytes) for m in steps], [m.loss for m in steps], units,
                      host_peaks=[m.host_peak_bytes for m in steps])


def run_specs(rank: int, world_size: int, specs: list[RunSpec]) -> list[RankResult]:
    """Every run of ``specs`` on this rank, in order (``estimators.measure.real_fsdp.run_ranks`` calls it on each)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world_size,))
    out = []
    for spec in specs:
        try:
            out.append(_one(spec, mesh))
        except Exception as exc:  # noqa: BLE001 (a failed run is a row of the table; the ranks fail alike)
            out.append(RankResult(spec.label, spec.mixed_precision, error=f"{type(exc).__name__}: {exc}"[:200]))
    return out
