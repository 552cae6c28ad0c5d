"""What the benchmarks say about the machine they ran on."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe_machine(how_run: str) -> str:
    """One line for RESULTS.md: CPUs, load, ``how_run``, OS, the torch / transformers / sacplan versions."""
    import os
    import subprocess

    import torch
    import transformers

    import planner

    repo = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs, {cpu_model()}, shared with other work (1-min load {load:.2f} at start), "
            f"{how_run}; {platform.system()} {platform.release()}; Python {platform.python_version()}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}; sacplan planner "
            f"{planner.PLANNER_VERSION} at {head.stdout.strip() or 'unknown commit'}.")
