"""``sacplan plan``, ``sacplan sweep`` and ``sacplan schema``.

Exit codes (``EXIT_CODES`` below, also in ``--help``): 0 optimal or feasible;
1 bad input; 2 infeasible (the message names the smallest budget with a plan);
3 no plan found (time limit reached before any plan, or solver error). A sweep
exits 3 if any budget had no plan for a reason other than infeasibility (more
time might find one), else 2 if any budget is infeasible, else 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from typing import Any, get_args, get_origin

from planner.figures import HOST_OVERHEAD_NOTE, recompute_split, step_basis
from planner.cli_pipeline import run_pipeline_plan
from planner.memory_model import GIB
from planner.options import PlanOptions
from planner.plan_format import Plan
from planner.planning import sweep
from planner.stats.format import Stats
from planner.stats.loader import StatsError, load_stats

__all__ = ["EXIT_BAD_INPUT", "EXIT_INFEASIBLE", "EXIT_NO_PLAN", "EXIT_OK", "MAX_BUDGET_GIB", "exit_code", "plan_table",
           "register", "sweep_table"]

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_NO_PLAN = 0, 1, 2, 3  # 1 is also every usage error (planner.cli)

EXIT_CODES = """exit codes:
  0  optimal or feasible plan(s)
  1  bad input (the message names the option or field and its value)
  2  infeasible: no plan fits (stderr names the smallest budget with a plan)
  3  no plan found: time limit reached before any plan, or solver error"""

_SWEEP_EXIT_RULE = ("\nA sweep exits 3 if any budget had no plan for a reason other than infeasibility,\n"
                    "else 2 if any budget is infeasible, else 0.")



def _is_list(name: str) -> bool:
    return any(get_origin(t) is list for t in get_args(PlanOptions.model_fields[name].annotation))


def _flag(name: str) -> str:
    """The CLI flag of a PlanOptions field: time_limit_s -> --time-limit, ac_units -> --ac-unit (repeatable)."""
    flag = name.removesuffix("_s")
    if _is_list(name):
        flag = flag.removesuffix("s")
    return "--" + flag.replace("_", "-")


# planner parameter -> the CLI option a user typed, for the planner's ValueError messages
_OPTION_OF = {"memory_budget_gib": "--budget-gib", **{name: _flag(name) for name in PlanOptions.model_fields}}
_PARAMETER = re.compile(r"^(\w+)(?:\[(\d+)\])?")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan checkpointing for one memory budget",
                       description="Plan selective activation checkpointing for one memory budget.",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--budget-gib", type=float, required=True, help="peak memory allowed per rank, GiB")
    p.set_defaults(handler=_plan)

    s = sub.add_parser("sweep", help="plan for several budgets (the memory/recompute curve)",
                       description="Plan for several budgets: the memory/recompute Pareto curve.",
                       epilog=EXIT_CODES + _SWEEP_EXIT_RULE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(s)
    s.add_argument("--budgets-gib", required=True, help="comma-separated budgets in GiB, e.g. 2,4,8")
    s.set_defaults(handler=_sweep)

    sc = sub.add_parser("schema", help="print the JSON Schema of stats v1 (or of the plan)")
    sc.add_argument("--plan", action="store_true", help="print the plan format's schema instead")
    sc.set_defaults(handler=_schema)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("stats", metavar="STATS.json", nargs="+", help="stats file: sacplan v1 or PyTorch's module_info + "
                   "sac_stats; for plan, a pipeline's stage files (s.stage0.json s.stage1.json ...) plan every stage")
    for name in PlanOptions.model_fields:
        p.add_argument(_flag(name), dest=name, **_argument(name))
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of a table")


def _argument(name: str) -> dict[str, Any]:
    """argparse settings for one PlanOptions field: its type, default and description."""
    field = PlanOptions.model_fields[name]
    help_text = (field.description or "").rstrip(".")
    if field.annotation is bool:
        return {"action": "store_true", "help": help_text}
    choices = get_args(field.annotation)
    if choices and all(isinstance(c, str) for c in choices):
        return {"choices": choices, "default": field.default, "help": f"{help_text} (default {field.default})"}
    if _is_list(name):
        return {"action": "append", "default": None, "metavar": "FQN", "help": f"{help_text} (repeatable)"}
    if field.annotation is int:
        return {"type": int, "default": field.default, "metavar": "N", "help": f"{help_text} (default {field.default})"}
    unit = name.rsplit("_", 1)[-1].upper()  # time_limit_s -> S, reserve_gib -> GIB
    if field.default is None:  # an optional number: absent means the stats' figure (host_link_gbps) or no cap
        absent = "the stats' figure" if name == "host_link_gbps" else "none"
        return {"type": float, "default": None, "metavar": unit,
                "help": f"{help_text} (default: {absent})"}
    return {"type": float, "default": field.default, "metavar": unit, "help": f"{help_text} (default {field.default:g})"}


def _options(args) -> dict:
    return {name: getattr(args, name) for name in PlanOptions.model_fields}


def _load(path: str) -> Stats | None:
    try:
        return load_stats(path)
    except StatsError as exc:
        print(f"sacplan: invalid stats {path}: {exc}", file=sys.stderr)
        return None


_NAMES = re.compile(r"(?<![-\w])(" + "|".join(_OPTION_OF) + r")\b")


def _cli_words(message: str) -> str:
    """A planner message with its parameter names as the options the user types."""
    return _NAMES.sub(lambda m: _OPTION_OF[m.group(1)], message.replace("solver='dp'", "--solver dp"))


def _option_message(exc: ValueError, is_sweep: bool) -> str:
    """The planner's message with its parameter name replaced by the option the user typed."""
    def option(m: re.Match) -> str:
        name, index = m.group(1), m.group(2)
        if name in ("budgets_gib", "memory_budget_gib"):  # both commands plan through sweep()
            return f"--budgets-gib entry {int(index or 0) + 1}" if is_sweep else "--budget-gib"
        return _OPTION_OF.get(name, m.group(0))
    return _PARAMETER.sub(option, str(exc), count=1)


def _run_sweep(stats: Stats, budgets: list[float], args, progress=None) -> list[Plan] | None:
    """The planner's sweep; None (after printing why) on an invalid option."""
    if args.first_step_only and not stats.root.optimizer_state_bytes:
        print("sacplan: note: --first-step-only changes nothing: the stats record no optimizer state "
              "(PyTorch-format stats never do)", file=sys.stderr)
    try:
        return sweep(stats, budgets, progress=progress, **_options(args))  # HiGHS's noise: planner.highs
    except ValueError as exc:
        print(f"sacplan: {_option_message(exc, is_sweep=hasattr(args, 'budgets_gib'))}", file=sys.stderr)
        return None


# No device holds this much; a budget past it is most likely typed in bytes (4294967296 for 4 GiB).
MAX_BUDGET_GIB = 64 * 1024


def _too_large(budget_gib: float, option: str) -> bool:
    """Say so (and return True) when a budget is past MAX_BUDGET_GIB: the user probably typed bytes."""
    if budget_gib <= MAX_BUDGET_GIB:
        return False
    print(f"sacplan: {option} {budget_gib:.15g} GiB is over 64 TiB per rank: did you mean bytes? "
          f"({budget_gib:.15g} bytes is {budget_gib / GIB:.4g} GiB; the budget is in GiB)", file=sys.stderr)
    return True


def _plan(args) -> int:
    if _too_large(args.budget_gib, "--budget-gib"):
        return EXIT_BAD_INPUT
    docs = [_load(path) for path in args.stats]
    if any(d is None for d in docs):
        return EXIT_BAD_INPUT
    if len(docs) > 1:  # a pipeline: every stage under the one budget
        return run_pipeline_plan(docs, args.budget_gib, _options(args), args.json)
    stats = docs[0]
    plans = _run_sweep(stats, [args.budget_gib], args)
    if plans is None:
        return EXIT_BAD_INPUT
    plan = plans[0]
    if args.json:
        print(plan.model_dump_json(indent=2))
    else:
        print(plan_table(stats, plan))
    return exit_code([plan])


def _sweep(args) -> int:
    budgets = _parse_budgets(args.budgets_gib)
    if budgets is None:
        return EXIT_BAD_INPUT
    if len(args.stats) > 1:
        print(f"sacplan: sweep takes one stats file, got {len(args.stats)}: plan a pipeline's stages with sacplan "
              f"plan STAGE0.json STAGE1.json ... --budget-gib B", file=sys.stderr)
        return EXIT_BAD_INPUT
    stats = _load(args.stats[0])
    if stats is None:
        return EXIT_BAD_INPUT

    def progress(i: int, n: int, p: Plan) -> None:
        print(f"[{i + 1}/{n}] {p.memory_budget_gib:g} GiB: {p.status} ({p.solve_seconds:.2f} s)", file=sys.stderr)

    plans = _run_sweep(stats, budgets, args, progress)
    if plans is None:
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in plans], indent=2))
    else:
        print(sweep_table(plans))
    return exit_code(plans)


def _parse_budgets(text: str) -> list[float] | None:
    """Every comma-separated entry must be a number; None (after printing which is not) otherwise."""
    budgets = []
    for k, entry in enumerate(text.split(","), start=1):
        try:
            budgets.append(float(entry))
        except ValueError:
            print(f"sacplan: --budgets-gib entry {k} {entry!r} is not a number", file=sys.stderr)
            return None
        if _too_large(budgets[-1], f"--budgets-gib entry {k}"):
            return None
    return budgets


def _schema(args) -> int:
    model = Plan if args.plan else Stats
    print(json.dumps(model.model_json_schema(), indent=2))
    return EXIT_OK


def exit_code(plans: list[Plan]) -> int:
    """Print why each budget has no plan; 3 if any lacks one for a reason other than infeasibility, else 2, else 0."""
    for p in plans:
        if p.status == "infeasible":
            print(f"sacplan: {p.message}", file=sys.stderr)
        elif p.status not in ("optimal", "feasible"):
            print(f"sacplan: {p.memory_budget_gib:g} GiB: {p.status}: {_cli_words(p.message)}", file=sys.stderr)
    statuses = {p.status for p in plans}
    if statuses - {"optimal", "feasible", "infeasible"}:
        return EXIT_NO_PLAN
    return EXIT_INFEASIBLE if "infeasible" in statuses else EXIT_OK


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:.5g}"


def _gib_text(b: float | None) -> str:
    """With its unit; an absent figure is a bare '-'."""
    return "-" if b is None else f"{_gib(b)} GiB"


def _status_text(p: Plan) -> str:
    return p.status + (f" (gap {p.mip_gap:.2%})" if p.status == "feasible" and p.mip_gap else "")


def _recompute_text(stats: Stats, p: Plan) -> str:
    split = recompute_split(stats, p)
    return "-" if split is None else split.text()


def plan_table(stats: Stats, p: Plan) -> str:
    lines = [
        f"model            {stats.metadata.model_name}",
        f"status           {_status_text(p)}",
        f"budget           {p.memory_budget_gib:g} GiB (world size {p.world_size})",
        f"peak             {_gib_text(p.peak_bytes)}  (no checkpointing: {_gib_text(p.baseline_peak_bytes)})",
        f"peak at          {p.peak_at or '-'}",
        f"memory model     {p.memory_model}: {p.memory_model_note}",
        f"recompute        {_recompute_text(stats, p)}",
        f"step             {p.compute_ms:.3f} ms forward + backward: {step_basis(stats)}",
        f"solve            {p.solve_seconds:.3f} s",
    ]
    split = recompute_split(stats, p)
    if split is not None and split.overhead_dominates:
        lines.insert(-1, f"host overhead    {HOST_OVERHEAD_NOTE}")
    if p.offload == "on":
        lines[-1:-1] = _offload_lines(p)
    if p.min_feasible_budget_gib is not None:
        lines.append(f"min budget       {p.min_feasible_budget_gib:g} GiB")
    if p.message and p.status != "optimal":
        lines.append(f"note             {_cli_words(p.message)}")
    if p.modules:
        width = max(len(m.fqn) for m in p.modules)
        off = p.offload == "on"
        lines += ["", f"{'module':<{width}}  discard  freed GiB  recompute ms  ops saved"
                  + ("  offloaded GiB" if off else "")]
        for m in p.modules:
            lines.append(f"{m.fqn:<{width}}  {m.discard_ratio:7.3f}  {m.discarded_bytes / GIB:9.3f}  "
                         f"{m.recompute_ms:12.4f}  {sum(m.save)}/{len(m.save)}"
                         + (f"  {(m.offloaded_bytes or 0) / GIB:13.3f}" if off else ""))
    return "\n".join(lines)


def _offload_columns(p: Plan) -> str:
    stall = "-" if p.offload_stall_ms is None else f"{p.offload_stall_ms:.3f}"
    over = "-" if p.step_overhead_ms is None else f"{p.step_overhead_ms:.3f}"
    return f"  {stall:>8}  {over:>11}  {_gib(p.host_bytes):>8}"


def _offload_lines(p: Plan) -> list[str]:
    """With offload on: the link, host memory, the copies' stall and the step overhead the plan minimises."""
    link = p.host_link_gbps or {}
    out = [f"offload          on: host link {link.get('d2h', 0):g} GB/s to host, {link.get('h2d', 0):g} GB/s back"]
    if p.host_bytes is not None:
        busy = sum(1 for w in p.offload_windows or () if w.offloaded_bytes)
        out.append(f"host memory      {_gib_text(p.host_bytes)} offloaded, in {busy} of "
                   f"{len(p.offload_windows or ())} windows (prefetch {p.prefetch_distance} window ahead)")
        out.append(f"offload stall    {p.offload_stall_ms:.3f} ms: the copies past the compute they overlap")
        out.append(f"step overhead    {p.step_overhead_ms:.3f} ms = recompute + offload stall (what the plan "
                   f"minimises)")
    return out


def sweep_table(plans: list[Plan]) -> str:
    width = max([10] + [len(_status_text(p)) for p in plans])
    off = any(p.offload == "on" for p in plans)  # offloading: the stall, the overhead minimised, host memory
    lines = [f"{'budget GiB':>10}  {'status':<{width}}  {'peak GiB':>9}  {'recompute ms':>12}  {'modules':>7}  {'solve s':>7}"
             + (f"  {'stall ms':>8}  {'overhead ms':>11}  {'host GiB':>8}" if off else "")]
    for p in plans:
        rc = "-" if p.recompute_ms is None else f"{p.recompute_ms:.3f}"
        lines.append(f"{p.memory_budget_gib:>10g}  {_status_text(p):<{width}}  {_gib(p.peak_bytes):>9}  {rc:>12}  "
                     f"{len(p.modules):>7}  {p.solve_seconds:>7.3f}" + (_offload_columns(p) if off else ""))
    mins = {p.min_feasible_budget_gib for p in plans if p.min_feasible_budget_gib is not None}
    if mins:
        lines.append(f"smallest budget with a plan: {min(mins):g} GiB")
    return "\n".join(lines)
