"""What reading and validating one large stats document costs in one process: CPU seconds and peak memory.

A synthetic PyTorch-format document (``bench/synthetic.py``, the L4 sample's
middle block repeated, as ``bench_limits.py --large-bodies`` sends) is decoded,
validated (``planner.parse_stats``) and written as its canonical text (what the
service stores and hashes), each in a fresh process per checkout, so two
checkouts compare side by side: the CPU seconds of each step (not wall time:
the machine is shared) and the process's peak resident memory.

    python bench/bench_stats_validation.py --mib 28 63 --tree /work/main --tree .
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_limits import L4, _body_of_size  # noqa: E402

MIB = 2**20

_CHILD = r"""
import hashlib, json, sys, time
import planner
clock = time.process_time


def high_water_kib():  # VmHWM: this process's peak RSS (ru_maxrss would keep the parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])


body = open(sys.argv[1], "rb").read()
start_kib = high_water_kib()
t0 = clock(); doc = json.loads(body); del body
t1 = clock(); stats = planner.parse_stats(doc); del doc
t2 = clock()
digest = hashlib.sha256()
parts = stats.canonical_json_parts() if hasattr(stats, "canonical_json_parts") else [stats.canonical_json()]
with open(sys.argv[2], "wb") as out:
    for part in parts:
        data = part.encode(); digest.update(data); out.write(data)
t3 = clock()
peak_kib = high_water_kib()
print(json.dumps({"planner": planner.__file__, "loads_s": t1 - t0, "validate_s": t2 - t1, "text_s": t3 - t2, "start_mib": start_kib / 1024,
                  "peak_mib": peak_kib / 1024, "hash": digest.hexdigest()}))
"""


def measure(tree: str, body_file: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    with tempfile.NamedTemporaryFile(suffix=".json") as text:
        out = subprocess.run([sys.executable, "-c", _CHILD, body_file, text.name], env=env, check=True, cwd=tree,
                             capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[28, 63], help="document sizes, MiB")
    parser.add_argument("--tree", action="append", help="checkouts to compare (PYTHONPATH); default: this one")
    args = parser.parse_args()
    trees = args.tree or [str(Path(__file__).resolve().parents[1])]
    source = json.loads(L4.read_text())
    print("| document | checkout | json.loads CPU s | validate CPU s | canonical text CPU s | peak RSS MiB "
          "(with the body read) | per MiB of document | same hash |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for mib in args.mib:
        body = _body_of_size(source, mib, "upload 0")
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            f.write(body)
            f.flush()
            rows = [(tree, measure(tree, f.name)) for tree in trees]
        for tree, r in rows:
            assert r["planner"].startswith(str(Path(tree).resolve())), (tree, r["planner"])
        same = len({r["hash"] for _, r in rows}) == 1
        for tree, r in rows:
            print(f"| {len(body) / MIB:.0f} MiB | {tree} | {r['loads_s']:.2f} | {r['validate_s']:.2f} | "
                  f"{r['text_s']:.2f} | {r['peak_mib']:.0f} ({r['start_mib']:.0f}) | "
                  f"{(r['peak_mib'] - r['start_mib']) * MIB / len(body):.1f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
