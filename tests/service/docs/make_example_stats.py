"""The stats example of the API docs (``service/example_stats.json``), made by today's collector.

Run ``python tests/service/docs/make_example_stats.py`` after a change to what
the collector writes; ``test_example_stats.py`` fails until then. The model is
a two-layer MLP (each layer: a linear up, GELU, a linear down, a residual add)
on an A100-80GB, small enough for Swagger UI and ReDoc to show whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "service" / "example_stats.json"
COMMAND = ["--model", f"{Path(__file__).resolve()}:make", "--batch", "8", "--seq", "1024",
           "--optimizer", "adamw", "--target-device", "A100-80GB"]
HIDDEN = 1024


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer() for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def make(batch_size: int, seq_len: int, device: torch.device):
    """The collector's factory (README, "Factory contract")."""
    with torch.device(device):
        return Net(), (torch.randn(batch_size, seq_len, HIDDEN),)


def collect() -> dict:
    """The example as ``sacplan collect`` writes it now."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stats.json"
        subprocess.run([sys.executable, "-m", "planner.cli", "collect", *COMMAND, "--out", str(out)], check=True,
                       capture_output=True, cwd=ROOT)
        return json.loads(out.read_text())


if __name__ == "__main__":
    EXAMPLE.write_text(json.dumps(collect(), indent=1) + "\n")
    print(f"wrote {EXAMPLE.relative_to(ROOT)}")
