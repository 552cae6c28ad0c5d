"""``sacplan collect`` is listed, and fails clearly, on a machine without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
NO_TORCH = "import sys; sys.modules['torch'] = None; from planner.cli import main; sys.exit(main(sys.argv[1:]))"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_help_lists_collect_without_torch():
    proc = _run("--help")
    assert proc.returncode == 0 and "collect" in proc.stdout


def test_collect_without_torch_says_what_to_install(tmp_path):
    proc = _run("collect", "--hf-config", str(tmp_path / "c.json"), "--out", str(tmp_path / "s.json"))
    assert proc.returncode == 1
    assert "needs torch" in proc.stderr
    # never the bare 'sacplan[collector]' (which pulls a multi-GB CUDA build): a CPU build, or your own
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in proc.stderr
    assert "on a GPU node bring your own torch" in proc.stderr
