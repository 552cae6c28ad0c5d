"""``tests/data/mlp6_a100.json``: the API docs' example MLP with six layers instead of two, as ``sacplan collect``
writes it for an A100-80GB (its host link: the device table's PCIe Gen4 x16, 24 GB/s per direction).

Two layers are too few to offload anything: the first layer's offload would be credited only from the end of
the last layer's forward (docs/memory-model.md, "Offloading"), past the peak. With six, plans offload at most
budgets, so the charts of plans that offload are drawn from real plans. Run
``python tests/service/views/make_mlp6_stats.py`` to remake it (needs torch; the tests reading it do not).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "data" / "mlp6_a100.json"
sys.path.insert(0, str(ROOT / "tests" / "service" / "docs"))
from make_example_stats import HIDDEN, Net  # noqa: E402


def make(batch_size: int, seq_len: int, device: torch.device):
    """The collector's factory (README, "Factory contract")."""
    with torch.device(device):
        return Net(layers=6), (torch.randn(batch_size, seq_len, HIDDEN),)


if __name__ == "__main__":
    subprocess.run([sys.executable, "-m", "planner.cli", "collect", "--model", f"{Path(__file__).resolve()}:make",
                    "--batch", "8", "--seq", "1024", "--optimizer", "adamw", "--target-device", "A100-80GB",
                    "--out", str(OUT), "--quiet"], check=True, cwd=ROOT)
    print(f"wrote {OUT.relative_to(ROOT)}")
