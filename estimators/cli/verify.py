"""``sacplan verify``: a few real steps with and without each plan, predicted against measured, one line each.

Nothing here imports torch at module level (``sacplan --help`` works without
it); the handler imports the measuring (``verify_run``) when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from planner import GIB, Plan, Stats, StatsError, baseline_peak_bytes, load_stats, min_feasible_budget_gib, sweep
from planner.cli_plan import MAX_BUDGET_GIB

__all__ = ["register", "verify_lines"]


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand."""
    p = subparsers.add_parser(
        "verify", help="run real steps with and without plans here: predicted against measured peak and recompute",
        description="Build the model the stats were collected from (the same --hf-config or --model), run a few "
        "real training steps of the step they describe (batch, sequence, dtype, optimizer) on this machine without "
        "checkpointing and under each plan, and print each plan's predicted and measured peak and recompute. "
        "Stats for another device, or for one rank of a sharded job, are refused with the reason.")
    p.add_argument("stats", metavar="STATS.json", help="the stats sacplan collect wrote")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="FILE.py:FACTORY", help="the factory the stats were collected from")
    src.add_argument("--hf-config", metavar="CONFIG.json",
                     help="the Hugging Face config (file or hub id) the stats were collected from")
    p.add_argument("--plan", action="append", metavar="PLAN.json",
                   help="a plan (sacplan plan --json) or a sweep's plans (sacplan sweep --json), repeatable "
                   "(default: the budgets sacplan collect suggests, planned here)")
    p.add_argument("--budget-gib", action="append", type=float, metavar="GIB",
                   help="plan this budget here and verify it, repeatable")
    p.add_argument("--rounds", type=int, default=5, help="timed steps of each run, interleaved (default 5)")
    p.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """Handler of ``sacplan verify``: exit 0, or 1 on a refusal or any error."""
    try:
        if args.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
        stats = load_stats(args.stats)
        plans = _plans(stats, args)
    except (StatsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        print("error: sacplan verify runs real steps: it needs torch (pip install -e '.[collector]')", file=sys.stderr)
        return 1
    from estimators.cli.verify_run import model_refusal, refusal, run_device, verify_plans

    why = refusal(stats)
    if why is None:
        usable = [p for p in plans if p.status in ("optimal", "feasible") and p.modules and p.world_size == 1]
        skipped = [p for p in plans if p not in usable]
        try:
            built = _build(stats, args, run_device(stats))
            why = model_refusal(stats, built)
        except (ValueError, RuntimeError, ImportError) as exc:
            why = str(exc)
    if why is not None:
        print(f"error: not verified: {why}", file=sys.stderr)
        return 1
    m = stats.metadata
    where = run_device(stats) + ("" if m.target_device == run_device(stats) else f" ({m.target_device})")
    print(f"verifying {args.stats} on {where}: batch {m.batch_size}, seq {m.seq_len}, {m.dtype}, optimizer "
          f"{m.optimizer}; {args.rounds} timed rounds", file=sys.stderr)
    try:
        results = verify_plans(stats, usable, built, rounds=args.rounds,
                               progress=lambda text: print(text, file=sys.stderr))
    except (ValueError, RuntimeError) as exc:  # a plan that does not apply (made from other stats), ...
        print(f"error: not verified: {exc}", file=sys.stderr)
        return 1
    print("\n".join(verify_lines(stats, results, skipped)))
    return 0


def _plans(stats: Stats, args: argparse.Namespace) -> list[Plan]:
    plans: list[Plan] = []
    for path in args.plan or []:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--plan {path}: cannot be read as JSON: {exc}") from None
        plans += [Plan.model_validate(d) for d in (doc if isinstance(doc, list) else [doc])]
    budgets = list(args.budget_gib or [])
    for b in budgets:
        if b > MAX_BUDGET_GIB:
            raise ValueError(f"--budget-gib {b:.15g} GiB is over 64 TiB per rank: did you mean bytes? ({b:.15g} bytes "
                             f"is {b / GIB:.4g} GiB; the budget is in GiB)")
    if not plans and not budgets:
        from estimators.cli.guide import suggested_budgets

        budgets = suggested_budgets(min_feasible_budget_gib(stats), baseline_peak_bytes(stats) / GIB, None)
    if budgets:
        plans += sweep(stats, budgets, time_limit_s=30)
    return plans


def _build(stats: Stats, args: argparse.Namespace, device: str) -> Any:
    import torch

    from estimators.collect import DTYPES, build_from_factory, build_from_hf_config, load_factory

    m = stats.metadata
    if m.batch_size is None or m.seq_len is None or m.dtype not in DTYPES:
        raise ValueError("the stats do not record the batch, sequence and dtype of their step (sacplan collect's "
                         "stats do): nothing to rebuild it from")
    kwargs = {"batch_size": m.batch_size, "seq_len": m.seq_len, "dtype": DTYPES[m.dtype],
              "device": torch.device(device)}
    if args.model:
        return build_from_factory(load_factory(args.model), **kwargs)
    return build_from_hf_config(args.hf_config, **kwargs)


def verify_lines(stats: Stats, results: list[Any], skipped: list[Plan]) -> list[str]:
    """One line per run: predicted and measured peak (and recompute for a plan), their ratio."""
    from estimators.cli.summary import size_text

    rows = []
    for r in results:
        n = 0 if r.plan is None else len(r.plan.modules)
        label = "no checkpointing" if r.plan is None else (
            f"{r.plan.memory_budget_gib:g} GiB plan, {n} module{'s' if n != 1 else ''}")
        text = (f"peak {size_text(r.predicted_peak_bytes)} predicted, {size_text(r.measured_peak_bytes)} measured "
                f"({_ratio(r.measured_peak_bytes, r.predicted_peak_bytes)})")
        if r.plan is not None:
            text += (f"; recompute {r.predicted_recompute_ms:.3g} ms predicted, {r.measured_recompute_ms:.3g} ms "
                     f"measured +- {r.noise_ms:.2g} ({_ratio(r.measured_recompute_ms, r.predicted_recompute_ms)})")
            if getattr(r.plan, "host_bytes", None):  # a plan that offloads: its host memory, booked apart
                text += (f"; host {size_text(r.plan.host_bytes)} predicted, {size_text(r.measured_host_bytes or 0)} "
                         f"measured ({_ratio(r.measured_host_bytes, r.plan.host_bytes)})")
        rows.append((label, text))
    for p in skipped:
        why = (f"{p.status}, not applied" if p.status not in ("optimal", "feasible") else
               "checkpoints nothing: the run without checkpointing" if not p.modules else
               f"planned for --world-size {p.world_size}: sharded parameters, not this one process")
        rows.append((f"{p.memory_budget_gib:g} GiB plan", why))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {text}" for label, text in rows]
    if stats.metadata.grad_accumulation and len(results) > 1:
        lines.append(f"{'':<{width}}  (recompute per optimizer step: {stats.metadata.grad_accumulation} "
                     f"micro-batches, each recomputing)")
    if stats.metadata.tags.get("cost_model") == "roofline" and len(results) > 1:
        lines.append(f"{'':<{width}}  (predicted recompute: ops on the {stats.metadata.target_device} roofline plus "
                     f"the estimated host overhead; collect with --benchmark here to time both on this machine)")
    return lines


def _ratio(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return "-"
    return f"measured/predicted {measured / predicted:.2f}"
