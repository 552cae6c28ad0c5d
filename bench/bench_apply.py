"""A plan applied where training runs: the fidelity set x eager, torch.compile backends, eval, HF defaults.

    python bench/bench_apply.py                 # full matrix, rewrites the "## Apply" section of bench/RESULTS.md
    python bench/bench_apply.py --only llama --modes eager,aot_eager --quick   # prints, writes nothing

For each model of ``../shared/reference/fidelity`` (gemma2, mixtral and
qwen2_moe with their default settings; the ViT and the encoder from
``factories.py``): collect stats as ``sacplan collect`` does (the fidelity
README's settings: batch 4, seq 256, fp32; the ViT batch 8, seq 64), plan at
50% of the predicted peak (``planner.plan``, default options; halfway
between the smallest feasible budget and the peak when 50% is infeasible), then per mode build two fresh models
from the same seed, apply the plan to one (``apply_plan(..., example_inputs=
batch, compile_backend=...)``: the dry check) and compare the loss and every
gradient after one step from the same seed (``torch.testing.assert_close``,
rtol 1e-5, atol 1e-6). Modes: ``eager``; ``compile-eager``, ``aot_eager``,
``inductor`` (``torch.compile(model, backend=...)`` on both); ``eval`` (eval
mode, no_grad: the logits), ``eval+grad`` (eval mode, gradients);
``hf-defaults`` (the model as ``AutoModelForCausalLM.from_config(cfg)``
builds it, called with ``input_ids`` and ``labels``).

Memory under ``aot_eager``: two real AdamW steps of the compiled planned
model after a warm-up step, every live storage counted
(``estimators.measure.real_step.measure_steps``; the compiled graph runs its ATen ops
through the dispatcher, and no recompilation happens under the tracker:
checked). Under ``inductor`` the tracker cannot see the kernels' buffers
(they are allocated outside the dispatcher, and an active dispatch mode
makes dynamo recompile), so the table gives the bytes autograd keeps for
backward after the forward (saved-tensor hooks on the compiled function,
distinct storages, parameters left out), unplanned and planned, next to the
same figures under ``aot_eager``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from bench.bench_fidelity import machine_line  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402
from bench.fidelity import BUILD_SEED, ModelSpec, build_real, describe_error  # noqa: E402
from estimators import apply_plan, call_model, default_loss, make_optimizer, measure_steps, run_collection  # noqa: E402

SECTION = "## Apply"
REFERENCE = Path("../shared/reference/fidelity")
MODES = ("eager", "compile-eager", "aot_eager", "inductor", "eval", "eval+grad", "hf-defaults")
BACKEND = {"compile-eager": "eager", "aot_eager": "aot_eager", "inductor": "inductor"}
MOE_PENDING = "the default experts do not collect under fake tensors yet (issue 17 point 5, branch moe-collect)"
MODELS = [
    *(ModelSpec(n, f"{n}.json") for n in ("llama", "gpt2", "qwen2", "mistral", "phi3", "gemma", "gemma2", "opt",
                                          "mixtral", "qwen2_moe")),
    ModelSpec("vit", "factories.py:make_vit", batch=8, seq=64),
    ModelSpec("encoder", "factories.py:make_encoder"),
]
STEP_SEED = 11
MIB = 2**20


@dataclass
class Row:
    spec: ModelSpec
    error: str | None = None
    plan_cell: str = "-"
    cells: dict[str, str] = field(default_factory=dict)
    memory: dict[str, str] = field(default_factory=dict)


def _user_built(spec: ModelSpec, reference: Path) -> Any:
    """The model as a user builds it: ``AutoModelForCausalLM.from_config(cfg)``, nothing switched off."""
    from transformers import AutoConfig, AutoModelForCausalLM

    doc = json.loads((reference / spec.source).read_text())
    cfg = AutoConfig.for_model(doc.pop("model_type"), **doc)
    torch.manual_seed(BUILD_SEED)
    return AutoModelForCausalLM.from_config(cfg).train()


def _pair(spec: ModelSpec, reference: Path, mode: str) -> tuple[Any, Any, Any, Any]:
    """(plain, to-be-planned, inputs, loss_fn): two identical fresh models."""
    built = build_real(spec, reference)
    if mode == "hf-defaults":
        return _user_built(spec, reference), _user_built(spec, reference), built.inputs, built.loss_fn
    return built.model, copy.deepcopy(built.model), built.inputs, built.loss_fn


def _grads(model: Any, inputs: Any, loss_fn: Any, *, no_grad: bool = False) -> tuple[Any, dict]:
    torch.manual_seed(STEP_SEED)
    if no_grad:
        with torch.no_grad():
            out = call_model(model, inputs)
        return getattr(out, "logits", out), {}
    loss = (loss_fn or default_loss)(call_model(model, inputs))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _compare(want: tuple, got: tuple) -> str:
    worst = 0.0
    for a, b in [(want[0], got[0]), *((want[1][n], got[1].get(n)) for n in want[1])]:
        if b is None:
            return "**differ** (a gradient is missing)"
        worst = max(worst, float((a - b).abs().max()) / max(float(a.abs().max()), 1e-30))
        try:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        except AssertionError:
            return f"**differ** (max rel {worst:.1e})"
    return "equal" if worst == 0 else f"equal ({worst:.0e})"


def run_mode(spec: ModelSpec, reference: Path, stats: Any, plan: Any, mode: str,
             saved: dict[str, str] | None = None) -> str:
    """The verdict of one mode; compiled with AOT: the bytes saved for backward, plain and planned, in ``saved``."""
    if mode == "hf-defaults" and ":" in spec.source:
        return "n/a"
    plain, planned, inputs, loss_fn = _pair(spec, reference, mode)
    backend = BACKEND.get(mode)
    apply_plan(planned, plan, stats=stats, example_inputs=inputs, loss_fn=loss_fn, compile_backend=backend)
    if backend:
        torch._dynamo.reset()  # layout: allow-private (each mode compiles from scratch)
        plain, planned = torch.compile(plain, backend=backend), torch.compile(planned, backend=backend)
    if mode.startswith("eval"):
        plain.eval(), planned.eval()
    no_grad = mode == "eval"
    verdict = _compare(_grads(plain, inputs, loss_fn, no_grad=no_grad),
                       _grads(planned, inputs, loss_fn, no_grad=no_grad))
    if saved is not None and backend in ("aot_eager", "inductor"):
        saved[f"{backend} saved MiB plain / planned"] = " / ".join(
            f"{_saved_bytes(m, inputs, loss_fn) / MIB:.2f}" for m in (plain, planned))
    return verdict


def _saved_bytes(model: Any, inputs: Any, loss_fn: Any) -> int:
    """Bytes of the distinct non-parameter storages autograd saves for backward in one forward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    torch.manual_seed(STEP_SEED)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = (loss_fn or default_loss)(call_model(model, inputs))
    del loss
    return sum(seen.values())


def measure_memory(spec: ModelSpec, reference: Path, stats: Any, plan: Any, row: Row) -> None:
    """aot_eager: the real peaks of two AdamW steps after a warm-up step, against the budget."""
    built = build_real(spec, reference)
    model = apply_plan(built.model, plan, stats=stats, example_inputs=built.inputs, loss_fn=built.loss_fn,
                       compile_backend="aot_eager")
    torch._dynamo.reset()  # layout: allow-private (a fresh compile)
    compiled = torch.compile(model, backend="aot_eager")
    opt = make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad])
    measure_steps(compiled, built.inputs, built.loss_fn, opt, steps=1, track_memory=False, seed=STEP_SEED)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # layout: allow-private (recompiles?)
    steps = measure_steps(compiled, built.inputs, built.loss_fn, opt, steps=2, seed=STEP_SEED)
    again = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # layout: allow-private (as above)
    peaks = " / ".join(f"{m.peak_bytes / MIB:.1f}" for m in steps)
    fits = all(m.peak_bytes <= plan.memory_budget_gib * planner.GIB for m in steps)
    row.memory["aot_eager peak MiB s1 / s2"] = (f"{peaks} ({'fits' if fits else '**over**'}"
                                                f"{'' if again == graphs else ', recompiled'})")


COMPILED_SECTION = "## Memory under compile"
COMPILED_MODELS = ("llama", "gpt2")
COMPILED_BUDGETS = (("p50", 0.5), ("p75", 0.75), ("p90", 0.9), ("min", None))


def compiled_rows(spec: ModelSpec, reference: Path) -> list[str]:
    """Stats collected with ``compile_backend="aot_eager"``; per budget the real peaks of the compiled plan.

    Each plan is applied with the dry check under ``aot_eager`` to a fresh model (the loss computed by the
    model: ``labels`` passed, ``output.loss``), compiled whole, one untracked warm-up step, then two tracked
    AdamW steps. The baseline column of the eager stats is what a plan promised before (issue 27).
    """
    import dataclasses

    req = spec.request(reference)
    eager = planner.baseline_peak_bytes(run_collection(req).stats)
    stats = run_collection(dataclasses.replace(req, compile_backend="aot_eager")).stats
    baseline = planner.baseline_peak_bytes(stats)
    least = planner.plan(stats, 1e-6).min_feasible_budget_gib
    out = [f"| {spec.name} | base | - | - | {baseline / MIB:.1f} (eager stats {eager / MIB:.1f}) | "
           + _compiled_cells(spec, reference, None, stats, None) + " |"]
    for label, fraction in COMPILED_BUDGETS:
        gib = least * (1 + 1e-9) if fraction is None else fraction * baseline / planner.GIB
        plan = planner.plan(stats, gib)
        if plan.status not in ("optimal", "feasible"):
            out.append(f"| {spec.name} | {label} | {plan.status} | {gib * 1024:.1f} | - | - | - | - |")
            continue
        out.append(f"| {spec.name} | {label} | {plan.status}, {len(plan.modules)} | {gib * 1024:.1f} | "
                   f"{plan.peak_bytes / MIB:.1f} | " + _compiled_cells(spec, reference, plan, stats, gib) + " |")
        print(f"  {spec.name} {label}: {out[-1]}", file=sys.stderr, flush=True)
    return out


def _compiled_cells(spec: ModelSpec, reference: Path, plan: Any, stats: Any, gib: float | None) -> str:
    """Real peaks by step, real/predicted, real/budget of the compiled (planned) model; an error in one cell."""
    built = build_real(spec, reference)
    try:
        if plan is not None:
            apply_plan(built.model, plan, stats=stats, example_inputs=built.inputs, loss_fn=built.loss_fn,
                       compile_backend="aot_eager")
        torch._dynamo.reset()  # layout: allow-private (a fresh compile)
        compiled = torch.compile(built.model, backend="aot_eager")
        opt = make_optimizer("adamw", [p for p in built.model.parameters() if p.requires_grad])
        measure_steps(compiled, built.inputs, built.loss_fn, opt, steps=1, track_memory=False, seed=STEP_SEED)
        steps = measure_steps(compiled, built.inputs, built.loss_fn, opt, steps=2, seed=STEP_SEED + 1)
    except Exception as exc:  # noqa: BLE001 (a failure is a cell of the table)
        return f"**error** {describe_error(exc)} | - | -"
    predicted = plan.peak_bytes if plan is not None else planner.baseline_peak_bytes(stats)
    real = [m.peak_bytes for m in steps]
    budget = " / ".join(f"{r / (gib * planner.GIB):.3f}" + (" (over)" if r > gib * planner.GIB else "")
                        for r in real) if gib else "-"
    return (" / ".join(f"{r / MIB:.1f}" for r in real) + " | " + " / ".join(f"{r / predicted:.4f}" for r in real)
            + f" | {budget}")


def compiled_report(rows: list[str], *, command: str, minutes: float) -> str:
    head = ("| model | plan | status, modules | budget MiB | predicted peak MiB | real peak MiB s1 / s2 | "
            "real/predicted | real/budget |")
    return "\n".join([
        COMPILED_SECTION, "", f"Machine: {machine_line()}", "",
        f"Command: `{command}` (from the repo root; {minutes:.1f} min in all). Stats collected with "
        "`compile_backend=\"aot_eager\"` (`sacplan collect --compile-backend aot_eager`; the fidelity settings: "
        "batch 4 x 256, fp32, AdamW, the loss computed by the model from `labels`); plans at 50%, 75% and 90% of "
        "the predicted baseline and at the smallest feasible budget; each applied to a fresh model with the dry "
        "check under `aot_eager`, compiled whole with `torch.compile(model, backend=\"aot_eager\")`, one warm-up "
        "step, then two real AdamW steps measured by `measure_steps` (every live storage, the compiled graph's "
        "ATen ops seen at run time). `base` is the unplanned compiled model; in brackets the baseline the eager "
        "stats predict.", "", head, "|" + "---|" * (head.count("|") - 1), *rows, ""])


def run_model(spec: ModelSpec, reference: Path, modes: list[str], memory: bool) -> Row:
    row = Row(spec)
    try:
        stats = run_collection(spec.request(reference)).stats
    except Exception as exc:  # noqa: BLE001 (a collection failure is a row of the table)
        row.error = f"collect: {describe_error(exc)}" + (f" ({MOE_PENDING})" if "moe" in spec.name
                                                        or spec.name == "mixtral" else "")
        return row
    baseline = planner.plan(stats, 1024.0).baseline_peak_bytes / planner.GIB
    plan = planner.plan(stats, 0.5 * baseline)
    if plan.status == "infeasible" and plan.min_feasible_budget_gib is not None:
        plan = planner.plan(stats, (plan.min_feasible_budget_gib + baseline) / 2)
    row.plan_cell = f"{plan.status}, {len(plan.modules)} modules, {plan.peak_bytes / MIB:.1f} MiB" if (
        plan.status in ("optimal", "feasible")) else plan.status
    if plan.status not in ("optimal", "feasible") or not plan.modules:
        row.error = f"no plan to apply at 50% ({plan.status})"
        return row
    row.memory["budget MiB"] = f"{plan.memory_budget_gib * 1024:.1f}"
    row.memory["plan's peak MiB"] = f"{plan.peak_bytes / MIB:.1f}"
    for mode in modes:
        t = time.process_time()
        try:
            row.cells[mode] = run_mode(spec, reference, stats, plan, mode, row.memory)
        except Exception as exc:  # noqa: BLE001
            row.cells[mode] = f"**error** {describe_error(exc)}"
        print(f"  {spec.name} {mode}: {row.cells[mode]} ({time.process_time() - t:.0f} s)", file=sys.stderr,
              flush=True)
    if memory:
        try:
            measure_memory(spec, reference, stats, plan, row)
        except Exception as exc:  # noqa: BLE001
            row.memory["error"] = describe_error(exc)
    return row


def report(rows: list[Row], modes: list[str], *, command: str, minutes: float) -> str:
    head = "| model | plan (budget 50%, or halfway from the least) | " + " | ".join(modes) + " |"
    out = [SECTION, "", f"Machine: {machine_line()}", "",
           f"Command: `{command}` (from the repo root; {minutes:.1f} min in all). Cells: loss and every "
           "gradient of the planned model against the unplanned one in the same mode after the same seed "
           "(`equal`: `assert_close` rtol 1e-5, atol 1e-6 holds; in brackets the largest difference relative to "
           "the largest value, when not 0). See `bench/bench_apply.py` for the modes.", "",
           head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [r.error, *["-"] * (len(modes) - 1)] if r.error else [r.cells.get(m, "-") for m in modes]
        out.append("| " + " | ".join([r.spec.name, r.plan_cell if not r.error else "-", *cells]) + " |")
    keys = ["budget MiB", "plan's peak MiB", "aot_eager peak MiB s1 / s2", "aot_eager saved MiB plain / planned",
            "inductor saved MiB plain / planned"]
    mem = [r for r in rows if r.memory]
    if mem:
        out += ["", "### Memory under compile", "", "| model | " + " | ".join(keys) + " |",
                "|" + "---|" * (len(keys) + 1)]
        out += ["| " + " | ".join([r.spec.name, *(r.memory.get(k, r.memory.get("error", "-")) for k in keys)])
                + " |" for r in mem]
    return "\n".join(out + [""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this model (repeatable)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory runs under compile")
    ap.add_argument("--quick", action="store_true", help="print only, write nothing")
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--compiled-memory", action="store_true",
                    help=f"only the {COMPILED_SECTION[3:]} section: {', '.join(COMPILED_MODELS)} collected and run "
                    f"under aot_eager at several budgets")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes {bad[0]!r} is not one of {', '.join(MODES)}")
    os.chdir(REPO)
    torch.set_num_threads(1)
    started = time.time()
    command = "python bench/bench_apply.py" + " ".join(["", *(argv if argv is not None else sys.argv[1:])])
    if args.compiled_memory:
        lines = [row for spec in MODELS if spec.name in (args.only or COMPILED_MODELS)
                 for row in compiled_rows(spec, args.reference)]
        text = compiled_report(lines, command=command.strip(), minutes=(time.time() - started) / 60)
        print(text)
        if not args.quick:
            write_results(text, REPO / "bench" / "RESULTS.md", COMPILED_SECTION)
        return 0
    rows = [run_model(s, args.reference, modes, not args.no_memory) for s in MODELS
            if not args.only or s.name in args.only]
    text = report(rows, modes, command=command.strip(), minutes=(time.time() - started) / 60)
    print(text)
    if not args.quick:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
