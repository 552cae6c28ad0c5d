"""Collected Llama-3 stats for the planner's benchmarks: 8B, 70B and 405B shapes, sharded two ways.

Each input is collected once by ``sacplan collect`` in a subprocess, as a
user would (batch 1, seq 8192, H100-SXM costs, AdamW; configs built here
from the published shapes, random weights on meta, nothing downloaded), and
kept as JSON in a folder that later runs reuse:

* ``--world-size N``: collected unsharded in bf16 and planned with parameters,
  gradients and optimizer state divided over N ranks (``plan(world_size=N)``);
* ``--fsdp-world-size N``: one rank of an FSDP2 job collected under the fake
  process group (fp32 sharded parameters, ``--mixed-precision bf16``), planned
  as is.

The rank counts: the smallest that fits an H100 (80 GB) with checkpointing
(8B: 2 and 4 ranks, 70B: 16 and 32; no FSDP2 count fits the 405B shape, whose
smallest per-rank budget stays above 74.5 GiB up to 512 ranks, and 128 is its
smallest divisor), then 64 and 128.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.bench_fsdp_scale import MODELS

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Input:
    """One planner input: a model shape and how it is sharded."""

    model: str  # a key of bench_fsdp_scale.MODELS
    ranks: int
    fsdp: bool  # True: FSDP2 per-rank stats; False: unsharded stats planned with world_size=ranks

    @property
    def label(self) -> str:
        how = f"FSDP2 x{self.ranks}" if self.fsdp else f"--world-size {self.ranks}"
        return f"Llama-3 {self.model.upper()} {how}"

    @property
    def world_size(self) -> int:
        return 1 if self.fsdp else self.ranks

    @property
    def file(self) -> str:
        return f"{self.model}-fsdp{self.ranks}.json" if self.fsdp else f"{self.model}-ws.json"

    def collect_args(self) -> list[str]:
        if self.fsdp:
            return ["--dtype", "fp32", "--mixed-precision", "bf16", "--fsdp-world-size", str(self.ranks)]
        return ["--dtype", "bf16"]


INPUTS = [Input("8b", n, False) for n in (2, 64, 128)] + [Input("70b", n, False) for n in (16, 64, 128)] \
    + [Input("405b", n, False) for n in (64, 128)] + [Input("8b", n, True) for n in (4, 64, 128)] \
    + [Input("70b", n, True) for n in (32, 64, 128)] + [Input("405b", n, True) for n in (64, 128)]


def collected(inp: Input, folder: Path, log) -> tuple[dict, float | None]:
    """The input's stats document, collected into ``folder`` unless already there; (document, seconds or None)."""
    out = folder / inp.file
    seconds = None
    if not out.exists():
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / f"llama-{inp.model}.json"
            cfg.write_text(json.dumps(MODELS[inp.model]))
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "planner.cli", "collect", "--hf-config", str(cfg), "--batch", "1",
                            "--seq", "8192", "--optimizer", "adamw", "--target-device", "H100-SXM",
                            *inp.collect_args(), "--out", str(out), "--quiet"], check=True, cwd=REPO,
                           stdout=subprocess.DEVNULL)
            seconds = time.perf_counter() - t0
        log(f"collected {inp.file} in {seconds:.1f} s")
    return json.loads(out.read_text()), seconds
