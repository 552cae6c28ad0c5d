"""``sacplan collect`` end to end on the README's Llama-3-8B example, then the command it prints.

    python bench/bench_collect_cli.py            # prints the section
    python bench/bench_collect_cli.py --write    # also writes "## sacplan collect, the README example" to RESULTS.md

Runs the README's exact command (the config file it writes, ``--target-device
H100-SXM``) in a subprocess of this checkout, with stderr to a file as in a
log, and reports each phase's wall time as the progress lines give it, the
subprocess's CPU time (its own, from ``getrusage``: other work on the machine
inflates wall time, not this), whether the step fits the H100 and what the
summary says to run next; then runs that command and reports its exit code,
status and peak.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._machine import cpu_model  # noqa: E402
from bench.bench_planner import write_results  # noqa: E402

SECTION = "## sacplan collect, the README example"
LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
             "bos_token_id": 128000, "eos_token_id": 128001}
COLLECT = ["collect", "--hf-config", "llama3-8b.json", "--batch", "1", "--seq", "8192", "--dtype", "bf16",
           "--target-device", "H100-SXM", "--out", "llama.json"]
CLI = "import sys; from planner.cli import main; sys.exit(main(sys.argv[1:]))"


def _timed(argv: list[str], cwd: Path) -> dict:
    """Run ``sacplan ARGV`` from this checkout; wall and CPU seconds (user + system of the child), output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CLI, *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"code": proc.returncode, "wall_s": wall, "cpu_s": cpu, "stdout": proc.stdout, "stderr": proc.stderr}


def _rows(summary: str) -> dict[str, str]:
    rows, last = {}, None
    for line in summary.splitlines():
        key, _, value = line.partition("  ")
        if key.strip():
            last = key.strip()
            rows[last] = value.strip()
        elif last and value.strip():
            rows[last] += "; " + value.strip()
    return rows


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "llama3-8b.json").write_text(json.dumps(LLAMA3_8B))
        collect = _timed(COLLECT, work)
        if collect["code"] != 0:
            raise SystemExit(f"collect exited {collect['code']}: {collect['stderr'][-2000:]}")
        rows = _rows(collect["stdout"])
        phases = re.findall(r"^  (.+?)(?:: \d+ modules)? \(([\d.]+) s\)$", collect["stderr"], re.M)
        command = rows["next"]
        plan = _timed(shlex.split(command)[1:] + ["--json"], work)
        doc = json.loads(plan["stdout"])
    return {"collect": collect, "rows": rows, "phases": phases, "command": command, "plan": plan, "doc": doc}


def report(r: dict, command: str) -> str:
    import torch

    machine = (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"torch {torch.__version__} (CPU); load average (1 min) {os.getloadavg()[0]:.1f} at the end")
    c, p, rows = r["collect"], r["plan"], r["rows"]
    phase_text = ", ".join(f"{name} {float(s):.1f} s" for name, s in r["phases"])
    return "\n".join([
        SECTION,
        "",
        f"Machine: {machine}. Command: `{command}`.",
        "",
        "The README's `sacplan collect --hf-config llama3-8b.json --batch 1 --seq 8192 --dtype bf16 "
        "--target-device H100-SXM --out llama.json`, as a subprocess, stderr to a pipe (a log: one line per phase):",
        "",
        f"- whole command: {c['wall_s']:.1f} s wall, {c['cpu_s']:.1f} s CPU (its own; wall time includes other "
        f"work on the shared cores); phases (wall): {phase_text}",
        f"- baseline peak: {rows['baseline peak']}",
        f"- H100-SXM holds: {rows['H100-SXM holds']}",
        f"- fits as is: {rows['fits as is']}; with checkpointing: {rows.get('fits with checkpointing', 'n/a')}",
        f"- sharded: {rows.get('sharded', 'n/a')}",
        f"- suggested budgets: {rows['suggested budgets']}",
        f"- next: `{r['command']}` ran in {p['wall_s']:.1f} s wall, {p['cpu_s']:.1f} s CPU: exit {p['code']}, "
        f"{r['doc']['status']}, peak {r['doc']['peak_bytes'] / 2**30:.2f} GiB of a "
        f"{r['doc']['memory_budget_gib']:g} GiB budget, recompute {r['doc']['recompute_ms']:.1f} ms",
        "",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the figures to bench/RESULTS.md ({SECTION})")
    args = ap.parse_args()
    text = report(run(), " ".join(["python", "bench/bench_collect_cli.py"] + sys.argv[1:]))
    print(text)
    if args.write:
        write_results(text, REPO / "bench" / "RESULTS.md", SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
