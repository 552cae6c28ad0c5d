"""Offloading plans applied to real CPU runs of the fidelity models: real peak and host bytes against the plan.

For each model: collect as ``bench/bench_fidelity.py`` does (fp32, CPU, AdamW), plan at each budget fraction of
the predicted no-checkpointing peak with ``offload="on"`` and ``--host-link-gbps`` (the stats of a CPU target
carry no host link: the option gives it), apply the plan (``apply_plan``: our context pair, the host store's
CPU stand-in), run two tracked real steps and one backward for gradients, and print one markdown row per plan:
predicted and real peak (step 2, the steady state), the budget, the plan's host bytes and the measured host
peak, and whether the gradients equal the unplanned run's (``torch.equal``, same dropout masks).

    PYTHONPATH=. python bench/bench_offload_apply.py --models llama gpt2 --fractions 0.4 0.6 0.85

With ``--compile-backend aot_eager`` (or ``eager``) the stats are collected for the compiled step, the plan is
applied with that backend (``example_inputs``: the check records the traced decisions and sets the compiled path
up) and the model is compiled; gradients are compared with the unplanned model compiled the same way.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

import planner  # noqa: E402
from estimators import apply_plan, call_model, make_optimizer, measure_steps, remove_plan, run_collection  # noqa: E402
from fidelity import MODELS, STEP_SEED, build_real, describe_error  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference" / "fidelity"


def _grads(model: torch.nn.Module, built: object, backend: str | None = None) -> list[torch.Tensor]:
    torch.manual_seed(STEP_SEED)
    run = model if backend is None else torch.compile(model, backend=backend)
    loss = built.loss_fn(call_model(run, built.inputs)) if built.loss_fn else call_model(run, built.inputs).loss
    loss.backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


def _applied(built: object, p: object, stats: object, backend: str | None) -> torch.nn.Module:
    """The planned copy of the model; with a backend, checked under it (which sets the compiled path up)."""
    if backend is None:
        return apply_plan(copy.deepcopy(built.model), p, stats=stats)
    torch._dynamo.reset()
    return apply_plan(copy.deepcopy(built.model), p, stats=stats, example_inputs=built.inputs,
                      loss_fn=built.loss_fn, compile_backend=backend)


def run(name: str, fractions: list[float], gbps: float, reference: Path, backend: str | None = None) -> list[str]:
    spec = next(s for s in MODELS if s.name == name)
    t = time.time()
    stats = run_collection(dataclasses.replace(spec.request(reference), compile_backend=backend)).stats
    baseline = planner.plan(stats, 1024.0).baseline_peak_bytes
    rows = []
    built = build_real(spec, reference)
    torch._dynamo.reset()
    plain_grads = _grads(copy.deepcopy(built.model), built, backend)
    for f in fractions:
        try:
            p = planner.plan(stats, f * baseline / planner.GIB, offload="on", host_link_gbps=gbps)
            if p.status not in ("optimal", "feasible"):
                rows.append(f"| {name} | {f:.0%} | {p.status} | | | | | | |")
                continue
            model = _applied(built, p, stats, backend)
            running = model if backend is None else torch.compile(model, backend=backend)
            steps = measure_steps(running, built.inputs, built.loss_fn,
                                  make_optimizer("adamw", list(model.parameters())), steps=2, seed=STEP_SEED)
            remove_plan(model)
            model = _applied(built, p, stats, backend)
            same = all(torch.equal(a, b) for a, b in zip(plain_grads, _grads(model, built, backend)))
            remove_plan(model)
            real, host = steps[1].peak_bytes, steps[1].host_peak_bytes
            budget = int(p.memory_budget_gib * planner.GIB)
            rows.append(f"| {name} | {f:.0%} | {budget} | {p.peak_bytes} | {real} | {real / p.peak_bytes - 1:+.4%} | "
                        f"{p.host_bytes} | {host} | {'yes' if same else 'NO'} |")
        except Exception as exc:  # noqa: BLE001 (a failure is a row of the table)
            rows.append(f"| {name} | {f:.0%} | error: {describe_error(exc)} | | | | | | |")
    print(f"{name}: {time.time() - t:.0f} s", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama"])
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.4, 0.6, 0.85])
    ap.add_argument("--host-link-gbps", type=float, default=1e6, help="GB/s per direction (default: never stalls)")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--compile-backend", choices=["eager", "aot_eager"], default=None,
                    help="collect, apply and run the step compiled with this backend")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("| model | budget | budget bytes | predicted peak | real peak (step 2) | real/predicted | plan host bytes "
          "| real host peak | grads equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        for row in run(name, args.fractions, args.host_link_gbps, args.reference, args.compile_backend):
            print(row)


if __name__ == "__main__":
    main()
