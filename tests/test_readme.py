"""The README runs as written (issue 18): every shell and Python block, in order, in a scratch copy.

Each fenced ``bash`` or ``python`` block of README.md is preceded by a
comment saying how this test treats it:

* ``<!-- readme-test: run -->``: run as is from the repository root
  (bash with ``-euo pipefail``; python as a script), exit status 0;
* ``<!-- readme-test: serve (...) -->``: a server, started in the background
  and waited for until ``/healthz`` answers, stopped at the end;
* ``<!-- readme-test: skip (reason) -->``: not run, for the reason given;
* ``<!-- readme-test: output (...) -->`` before a ``text`` block: a sample of
  what the last block run printed, checked against it (issue 32), so it
  cannot go stale: its lines appear in that output in order, one after the
  other; a line ending in ``...`` stands for any line starting with the text
  before it.

The one change made to the text: the README's service port (8100, apart from
the quick start's 8000, so a reader who left that server running meets no
clash) becomes a free port, so the test never meets another server on this
machine. ``sacplan`` is the scratch copy's
own CLI (a shim on PATH), and the scratch copy comes first on PYTHONPATH, so
the code under test is this checkout's whatever the environment installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKED = re.compile(r"<!-- readme-test: (run|serve|skip|output)\b(.*?)-->\n```(bash|python|text)\n(.*?)\n```", re.S)
FENCE = re.compile(r"^```(bash|python)\s*$", re.M)
SAME_AS_PRINTED = "checks this is the command the collect above printed"
QUICK_START_PORT, README_PORT = "8000", "8100"


@dataclass
class Block:
    how: str
    note: str
    lang: str
    code: str
    line: int


def readme_blocks(text: str) -> list[Block]:
    return [Block(m.group(1), m.group(2).strip(), m.group(3), m.group(4), text.count("\n", 0, m.start()) + 1)
            for m in MARKED.finditer(text)]


def test_every_block_says_how_the_test_treats_it():
    text = README.read_text()
    marked = {b.line + 1 for b in readme_blocks(text)}  # the fence is the line after the comment
    fences = [text.count("\n", 0, m.start()) + 1 for m in FENCE.finditer(text)]
    unmarked = [n for n in fences if n not in marked]
    assert not unmarked, f"README.md blocks at lines {unmarked} have no <!-- readme-test: run|serve|skip --> comment"
    skips = [b for b in readme_blocks(text) if b.how == "skip"]
    assert all(re.fullmatch(r"\(.+\)", b.note) for b in skips), "every skip gives its reason in parentheses"
    assert all((b.how == "output") == (b.lang == "text") for b in readme_blocks(text)), "output blocks are text"


def test_blocks_run_in_order_meet_no_server_already_there():
    # the quick start's `sacplan serve` (port 8000) may still run: the server the blocks start takes another port
    blocks = readme_blocks(README.read_text())
    served = [b for b in blocks if b.how == "serve"]
    assert served and all(f"--port {README_PORT}" in b.code for b in served)
    runs = [b for b in blocks if b.how == "run"]
    assert not any(f"127.0.0.1:{QUICK_START_PORT}" in b.code or f"--port {QUICK_START_PORT}" in b.code for b in runs)


def _assert_printed(sample: Block, printed: str) -> None:
    """The sample's lines appear in ``printed`` in order, one after the other (``...`` ends a prefix)."""
    want = sample.code.splitlines()
    got = [line.rstrip() for line in printed.splitlines()]

    def same(have: str, line: str) -> bool:
        return have.startswith(line[:-3]) if line.endswith("...") else have == line.rstrip()

    starts = [k for k, have in enumerate(got) if same(have, want[0])]
    for k in starts:
        if len(got) - k >= len(want) and all(same(got[k + i], line) for i, line in enumerate(want)):
            return
    raise AssertionError(f"README.md's sample output at line {sample.line} is not what the block before it printed:"
                         f"\n--- README\n{sample.code}\n--- printed\n{printed[-4000:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scratch_copy(dest: Path) -> Path:
    repo = dest / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache",
                                                              "data", "*.db"))
    shutil.copytree(ROOT / "tests" / "data", repo / "tests" / "data")  # "data" above is a server's data dir
    return repo


def _environment(repo: Path, bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir()
    shim = bin_dir / "sacplan"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -c '
                    '"import sys; from planner.cli import main; sys.exit(main(sys.argv[1:]))" "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(repo)
    env.pop("SACPLAN_API_KEYS", None)
    env.pop("SACPLAN_DATABASE_URL", None)
    return env


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the README's server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"the README's server did not answer {url} within {timeout_s:.0f} s")


def _run(block: Block, repo: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = ["bash", "-euo", "pipefail", "-c", block.code] if block.lang == "bash" else [sys.executable, "-c", block.code]
    proc = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (f"README.md block at line {block.line} exited {proc.returncode}:\n{block.code}\n"
                                  f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
    return proc


def _printed_next_command(stdout: str) -> str | None:
    lines = [line.split(None, 1)[1] for line in stdout.splitlines() if line.startswith("next ")]
    return lines[-1].strip() if lines else None


def test_readme_blocks_run_as_written(tmp_path):
    repo = _scratch_copy(tmp_path)
    env = _environment(repo, tmp_path / "bin")
    port = str(_free_port())
    servers: list[subprocess.Popen] = []
    printed_next = printed = None
    ran = checked = 0
    try:
        for block in readme_blocks(README.read_text()):
            if block.how == "skip":
                continue
            if block.how == "output":
                assert printed is not None, f"README.md line {block.line}: a sample output before any block ran"
                _assert_printed(block, printed)
                checked += 1
                continue
            block.code = block.code.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}").replace(
                f"--port {README_PORT}", f"--port {port}")
            if block.how == "serve":
                servers.append(subprocess.Popen(["bash", "-c", block.code], cwd=repo, env=env, start_new_session=True,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                _wait_healthy(f"http://127.0.0.1:{port}/healthz", servers[-1])
                continue
            if SAME_AS_PRINTED in block.note:
                command = next(line for line in block.code.splitlines() if line.strip() and not line.startswith("#"))
                assert printed_next is not None, f"no collect before line {block.line} printed a next command"
                assert command.split("#")[0].strip() == printed_next, (
                    f"README.md line {block.line} runs {command!r}; the collect before it printed {printed_next!r}")
            proc = _run(block, repo, env)
            printed = proc.stdout
            printed_next = _printed_next_command(proc.stdout) or printed_next
            ran += 1
    finally:
        for server in servers:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    assert ran >= 8  # the README's runnable blocks: if this drops, blocks were skipped or lost their comment
    assert checked >= 1  # the sample outputs
    assert (repo / "plan.png").stat().st_size > 0 and (repo / "llama.json").exists()
