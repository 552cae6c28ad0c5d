"""``sacplan plan``, ``sacplan sweep`` and ``sacplan schema``.

Exit codes: 0 optimal or feasible, 2 infeasible (the message names the
smallest budget with a plan), 1 bad input or no plan.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from planner.loader import StatsError, load_stats
from planner.memory_model import GIB
from planner.plan_format import Plan
from planner.planning import sweep
from planner.stats import Stats

__all__ = ["register"]

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan checkpointing for one memory budget",
                       description="Plan selective activation checkpointing for one memory budget.")
    _common(p)
    p.add_argument("--budget-gib", type=float, required=True, help="peak memory allowed per rank, GiB")
    p.set_defaults(handler=_plan)

    s = sub.add_parser("sweep", help="plan for several budgets (the memory/recompute curve)",
                       description="Plan for several budgets: the memory/recompute Pareto curve.")
    _common(s)
    s.add_argument("--budgets-gib", required=True, help="comma-separated budgets in GiB, e.g. 2,4,8")
    s.set_defaults(handler=_sweep)

    sc = sub.add_parser("schema", help="print the JSON Schema of stats v1 (or of the plan)")
    sc.add_argument("--plan", action="store_true", help="print the plan format's schema instead")
    sc.set_defaults(handler=_schema)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("stats", metavar="STATS.json", help="stats file: sacplan v1 or PyTorch's module_info + sac_stats")
    p.add_argument("--world-size", type=int, default=1, help="ranks sharing parameters and gradients (default 1)")
    p.add_argument("--ac-unit", action="append", default=None, metavar="FQN",
                   help="only these modules may be checkpointed (repeatable)")
    p.add_argument("--fsdp-unit", action="append", default=None, metavar="FQN",
                   help="FSDP unit; no checkpointed module may contain one (repeatable)")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S", help="solver time limit per budget (s)")
    p.add_argument("--mip-rel-gap", type=float, default=1e-6, metavar="G",
                   help="relative gap at which a plan counts as optimal (default 1e-6)")
    p.add_argument("--solver", choices=("auto", "milp", "dp"), default="auto", help="planning engine (default auto)")
    p.add_argument("--include-optimizer-state", action="store_true", help="count sharded optimizer state")
    p.add_argument("--reserve-gib", type=float, default=0.0, help="fixed reserve added to every point (GiB)")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of a table")


def _options(args) -> dict:
    return dict(world_size=args.world_size, ac_units=args.ac_unit, fsdp_units=args.fsdp_unit,
                time_limit_s=args.time_limit, mip_rel_gap=args.mip_rel_gap, include_optimizer_state=args.include_optimizer_state,
                reserve_gib=args.reserve_gib, solver=args.solver)


def _load(path: str) -> Stats | None:
    try:
        return load_stats(path)
    except StatsError as exc:
        print(f"sacplan: invalid stats {path}: {exc}", file=sys.stderr)
        return None


def _plan(args) -> int:
    stats = _load(args.stats)
    if stats is None:
        return EXIT_BAD_INPUT
    try:
        with _solver_output_to_stderr():
            plans = sweep(stats, [args.budget_gib], **_options(args))
    except ValueError as exc:
        print(f"sacplan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    plan = plans[0]
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        print(_plan_table(stats, plan))
    return _exit_code([plan])


def _sweep(args) -> int:
    stats = _load(args.stats)
    if stats is None:
        return EXIT_BAD_INPUT
    try:
        budgets = [float(b) for b in args.budgets_gib.split(",") if b.strip()]
    except ValueError:
        print(f"sacplan: --budgets-gib {args.budgets_gib!r} is not a comma-separated list of numbers", file=sys.stderr)
        return EXIT_BAD_INPUT

    def progress(i: int, n: int, p: Plan) -> None:
        print(f"[{i + 1}/{n}] {p.memory_budget_gib:g} GiB: {p.status} ({p.solve_seconds:.2f} s)", file=sys.stderr)

    try:
        with _solver_output_to_stderr():
            plans = sweep(stats, budgets, progress=progress, **_options(args))
    except ValueError as exc:
        print(f"sacplan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in plans], indent=2))
    else:
        print(_sweep_table(plans))
    return _exit_code(plans)


def _schema(args) -> int:
    model = Plan if args.plan else Stats
    print(json.dumps(model.model_json_schema(), indent=2))
    return EXIT_OK


def _exit_code(plans: list[Plan]) -> int:
    if any(p.status == "infeasible" for p in plans):
        for p in plans:
            if p.status == "infeasible":
                print(f"sacplan: {p.message}", file=sys.stderr)
        return EXIT_INFEASIBLE
    if all(p.status in ("optimal", "feasible") for p in plans):
        return EXIT_OK
    for p in plans:
        if p.status not in ("optimal", "feasible"):
            print(f"sacplan: {p.memory_budget_gib:g} GiB: {p.status}: {p.message}", file=sys.stderr)
    return EXIT_BAD_INPUT


@contextlib.contextmanager
def _solver_output_to_stderr():
    """HiGHS can write debug lines straight to fd 1; keep stdout clean for --json."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:.5g}"


def _recompute_text(p: Plan) -> str:
    if p.recompute_ms is None:
        return "-"
    if not p.compute_ms:
        return f"{p.recompute_ms:.3f} ms"
    return f"{p.recompute_ms:.3f} ms  ({p.recompute_ms / p.compute_ms:.1%} of the {p.compute_ms:.2f} ms step)"


def _plan_table(stats: Stats, p: Plan) -> str:
    lines = [
        f"model            {stats.metadata.model_name}",
        f"status           {p.status}" + (f" (gap {p.mip_gap:.2%})" if p.status == "feasible" and p.mip_gap else ""),
        f"budget           {p.memory_budget_gib:g} GiB (world size {p.world_size})",
        f"peak             {_gib(p.peak_bytes)} GiB  (no checkpointing: {_gib(p.baseline_peak_bytes)} GiB)",
        f"recompute        {_recompute_text(p)}",
        f"solve            {p.solve_seconds:.3f} s",
    ]
    if p.min_feasible_budget_gib is not None:
        lines.append(f"min budget       {p.min_feasible_budget_gib:g} GiB")
    if p.message and p.status != "optimal":
        lines.append(f"note             {p.message}")
    if p.modules:
        width = max(len(m.fqn) for m in p.modules)
        lines += ["", f"{'module':<{width}}  discard  freed GiB  recompute ms  ops saved"]
        for m in p.modules:
            lines.append(f"{m.fqn:<{width}}  {m.discard_ratio:7.3f}  {m.discarded_bytes / GIB:9.3f}  "
                         f"{m.recompute_ms:12.4f}  {sum(m.save)}/{len(m.save)}")
    return "\n".join(lines)


def _sweep_table(plans: list[Plan]) -> str:
    lines = [f"{'budget GiB':>10}  {'status':<10}  {'peak GiB':>9}  {'recompute ms':>12}  {'modules':>7}  {'solve s':>7}"]
    for p in plans:
        rc = "-" if p.recompute_ms is None else f"{p.recompute_ms:.3f}"
        lines.append(f"{p.memory_budget_gib:>10g}  {p.status:<10}  {_gib(p.peak_bytes):>9}  {rc:>12}  "
                     f"{len(p.modules):>7}  {p.solve_seconds:>7.3f}")
    mins = {p.min_feasible_budget_gib for p in plans if p.min_feasible_budget_gib is not None}
    if mins:
        lines.append(f"smallest budget with a plan: {min(mins):g} GiB")
    return "\n".join(lines)
