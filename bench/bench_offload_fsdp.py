"""Offloading plans in a real FSDP2 job: each rank's peak and host bytes against its plan (issue 31).

    python bench/bench_offload_fsdp.py                 # llama, 2 gloo ranks; adds its part to bench/RESULTS.md
    python bench/bench_offload_fsdp.py --no-write --ranks 2 --model gpt2

The small llama of ``../shared/reference/fidelity`` with ``bench/bench_fsdp.py``'s settings (batch 4 per rank,
seq 256, fp32, AdamW, three steps): one rank's stats collected under the fake process group (``sacplan collect
--fsdp-world-size N``), planned with ``offload="on"`` at 40%, 60% and 85% of the per-rank no-checkpointing peak
they predict (``--host-link-gbps``, default 1e6: copies never stall, so the plans offload as much as memory
wants), then each plan and the unplanned baseline trained for real on N gloo ranks of this CPU
(``bench/fsdp_run.py``: the plan applied before ``fully_shard``; ``measure_fsdp_steps`` books the host store's
copies apart from the device). Per plan: the largest steady-state peak over the ranks (steps 2 on) against the
plan's ``peak_bytes`` and the budget, the host peak against the plan's ``host_bytes``, and whether every rank's
losses equal the baseline's bit for bit at every step (the same weights, inputs and updates).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import planner  # noqa: E402
from bench._machine import describe_machine  # noqa: E402
from bench.fsdp_run import RunSpec, run_specs  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

PART = "### Offloading: FSDP2 job (bench_offload_fsdp.py)"
REFERENCE = REPO.parent / "shared" / "reference" / "fidelity"
FRACTIONS = (0.4, 0.6, 0.85)
BATCH, SEQ, STEPS = 4, 256, 3


def _rows(name: str, ranks: int, link: float) -> list[str]:
    cfg = json.loads((REFERENCE / f"{name}.json").read_text())
    req = CollectRequest(hf_config=cfg, batch=BATCH, seq=SEQ, dtype="fp32", device="cpu", optimizer="adamw",
                         name=name, fsdp_world_size=ranks)
    stats = run_collection(req).stats
    baseline = int(planner.plan(stats, 1024.0).baseline_peak_bytes)
    plans = {f: planner.plan(stats, f * baseline / planner.GIB, offload="on", host_link_gbps=link)
             for f in FRACTIONS}
    with tempfile.TemporaryDirectory(prefix="sacplan-offload-fsdp-") as tmp:
        path = Path(tmp, "stats.json")
        path.write_text(stats.model_dump_json())
        specs = [RunSpec("base", cfg, BATCH, SEQ, steps=STEPS)]
        specs += [RunSpec(f"p{round(f * 100)}", cfg, BATCH, SEQ, plan=p.model_dump(), stats_path=str(path),
                          steps=STEPS) for f, p in plans.items() if p.status in ("optimal", "feasible")]
        per_rank = run_ranks(run_specs, ranks, specs)
    base = [rank[0] for rank in per_rank]
    out = []
    for f, p in plans.items():
        label = f"p{round(f * 100)}"
        runs = [r for rank in per_rank for r in rank if r.label == label]
        budget = int(f * baseline)
        if not runs:
            out.append(f"| {name} x{ranks} | {round(f * 100)}% | {budget} | {p.status} | | | | | | |")
            continue
        err = next((r.error for r in runs if r.error), None)
        if err:
            out.append(f"| {name} x{ranks} | {round(f * 100)}% | {budget} | error: {err} | | | | | | |")
            continue
        steady = max(max(r.peaks[1:]) for r in runs)
        host = max(max(h or 0 for h in r.host_peaks) for r in runs)
        same = all(r.losses == b.losses for r, b in zip(runs, base))
        out.append(f"| {name} x{ranks} | {round(f * 100)}% | {budget} | {p.status} | {p.peak_bytes} | {steady} | "
                   f"{(steady - p.peak_bytes) / p.peak_bytes:+.4%} | {p.host_bytes} | {host} | "
                   f"{'yes' if same else '**no**'} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama", help="a model of the fidelity set with an HF config (default llama)")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks (default 2)")
    ap.add_argument("--host-link-gbps", type=float, default=1e6, help="GB/s per direction (default 1e6: free)")
    ap.add_argument("--no-write", action="store_true", help="print only, leave bench/RESULTS.md alone")
    args = ap.parse_args(argv)
    if args.ranks < 2:
        ap.error(f"--ranks must be at least 2, got {args.ranks}")
    torch.set_num_threads(1)
    started = time.time()
    rows = _rows(args.model, args.ranks, args.host_link_gbps)
    command = "python bench/bench_offload_fsdp.py" + " ".join(["", *(argv if argv is not None else sys.argv[1:])])
    text = [PART, "", f"Command: `{command.strip()}` ({(time.time() - started) / 60:.1f} min). Machine: "
            f"{describe_machine('one thread per rank')} Host link {args.host_link_gbps:g} GB/s.", "",
            "| job | budget | budget bytes | status | predicted peak | real peak (max over ranks, steps 2-3) | "
            "real/predicted | plan host bytes | real host peak | losses equal |", "|" + "---|" * 10, *rows, ""]
    print("\n".join(text))
    if not args.no_write:
        _write("\n".join(text))
    return 0


def _write(text: str, path: Path = REPO / "bench" / "RESULTS.md") -> None:
    """Replace this script's part (from its heading to the next heading of its level or above), or append it."""
    lines = path.read_text().splitlines()
    if PART in lines:
        i = lines.index(PART)
        j = next((k for k in range(i + 1, len(lines)) if lines[k].startswith(("# ", "## ", "### "))), len(lines))
        lines[i:j] = text.rstrip("\n").splitlines() + [""]
    else:
        lines += ["", *text.rstrip("\n").splitlines()]
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
