"""Checkpoint overhead per op on this machine's CPU: the figure the device table's ``cpu`` entry carries.

Checkpointing a module costs more than recomputing its ops: ``torch.utils.checkpoint``
re-runs the module's Python forward and calls the selective policy for every op,
saved or not. ``estimators.collect.overhead.measure_checkpoint_overhead`` measures it
(``every_saved_ms``) as the module's forward+backward under a policy saving every
op but views (nothing is recomputed) minus the plain forward+backward, on real
tensors; since planner 0.6 that policy does ``apply_plan``'s per-op work and the
figures are medians of CPU time (the earlier figures in ``bench/RESULTS.md``
were taken with a constant policy, fastest of 7 wall-clock runs). This script
collects small models with ``measure_checkpoint_overhead=True`` (what
``sacplan collect --benchmark`` does) and divides each distinct module's
overhead by its op count.

Models (random weights, nothing downloaded), fp32, train mode:

* HF Llama, 2 layers, hidden 64 and 256 (seq 32 and 128): decoder layers,
  attention, MLP, the base model, the causal LM;
* the torch-test Transformer (dim 64 and 256, dropout 0.1).

The small shapes keep the kernels short, so what is left is the per-op cost;
the larger ones show whether it depends on the tensors' size.

Each model is collected ``--rounds`` times (default 3) and each module's
median taken: on a shared machine one round can be thrown off entirely. Torch
runs on ``--threads`` threads (default 1): the overhead is host-side Python,
the same whatever the kernels' thread count, and with two threads on two
shared cores a busy neighbour stalls OpenMP's barriers, so tiny kernels took
up to a hundred times longer and the figures swung by several times.

Usage: python bench/bench_checkpoint_overhead.py [--rounds N] [--threads N] [--write]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_model  # noqa: E402

from estimators import RooflineCostModel, build_from_hf_config, collect_stats, device_spec  # noqa: E402

SECTION = "## Checkpoint overhead per op"


def _llama(hidden: int, seq: int):
    config = {"model_type": "llama", "vocab_size": 256, "hidden_size": hidden, "intermediate_size": 2 * hidden,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": seq, "attention_dropout": 0.1}
    built = build_from_hf_config(config, batch_size=2, seq_len=seq, dtype=torch.float32, device=torch.device("cpu"))
    return f"Llama hidden {hidden}, seq {seq}", built.model, built.inputs


def _transformer(dim: int, seq: int):
    from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

    args = ModelArgs(n_layers=2, vocab_size=128, max_seq_len=seq, dim=dim, n_heads=4, dropout_p=0.1)
    return f"torch-test Transformer dim {dim}, seq {seq}", Transformer(args), (torch.randint(0, 128, (2, seq)),)


def measure_once() -> list[tuple[str, str, int, float]]:
    """(model, module, op count, overhead ms) of each distinct non-leaf module."""
    rows = []
    for make, a, b in ((_llama, 64, 32), (_llama, 256, 128), (_transformer, 64, 32), (_transformer, 256, 128)):
        torch.manual_seed(0)
        label, model, inputs = make(a, b)
        stats = collect_stats(model, inputs, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")),
                              measure_checkpoint_overhead=True)
        seen = set()
        for m in stats.modules:
            kind = m.fqn.replace(".1", ".0")  # the second layer repeats the first: measured once
            if m.ops and m.checkpoint_overhead_ms is not None and kind not in seen:  # the root: not measured
                seen.add(kind)
                rows.append((label, m.fqn, len(m.ops), m.checkpoint_overhead_ms))
    return rows


def measure(rounds: int) -> list[tuple[str, str, int, float]]:
    """Each module's median over ``rounds`` collections: one round can be thrown by other work on the cores."""
    runs = [measure_once() for _ in range(rounds)]
    return [(label, fqn, n, statistics.median(run[i][3] for run in runs)) for i, (label, fqn, n, _) in
            enumerate(runs[0])]


def report(rows: list[tuple[str, str, int, float]], rounds: int) -> str:
    per_op = [1e3 * ms / n for _, _, n, ms in rows]
    load = os.getloadavg()[0]
    lines = [
        SECTION,
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores (1-min load {load:.2f} at the end, shared with other "
        f"work); Python {platform.python_version()}, torch {torch.__version__}, intra-op threads: {torch.get_num_threads()}. "
        "Command: `python bench/bench_checkpoint_overhead.py --write`.",
        "",
        "Each distinct non-leaf module but the root of the models in the script's docstring: forward+backward "
        "under `torch.utils.checkpoint` (non-reentrant, a selective policy saving every op but views and doing "
        "`apply_plan`'s per-op work) minus plain, the median of 7 interleaved runs each after one warm-up, in "
        f"process CPU time on real CPU tensors (`measure_checkpoint_overhead`); the median of {rounds} such "
        "collections.",
        "",
        "| model | module | ops | overhead ms | us per op |",
        "|---|---|---:|---:|---:|",
    ]
    for (label, fqn, n, ms), us in zip(rows, per_op):
        lines.append(f"| {label} | {fqn} | {n} | {ms:.3f} | {us:.1f} |")
    q = statistics.quantiles(per_op, n=4)
    lines += ["", f"Per op: median {statistics.median(per_op):.1f} us, quartiles {q[0]:.1f} - {q[2]:.1f} us "
              f"over {len(per_op)} modules. The device table's `cpu` entry carries the median, rounded to 5 us."]
    return "\n".join(lines) + "\n"


def write(text: str) -> None:
    path = ROOT / "bench" / "RESULTS.md"
    doc = path.read_text()
    start = doc.find(SECTION)
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        end = doc.find("\n## ", start + len(SECTION))
        doc = doc[:start] + text + (doc[end + 1:] if end >= 0 else "")
    path.write_text(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the figures to bench/RESULTS.md ({SECTION})")
    ap.add_argument("--rounds", type=int, default=3, help="collections per model, the median taken (default 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    text = report(measure(args.rounds), args.rounds)
    print(text)
    if args.write:
        write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
