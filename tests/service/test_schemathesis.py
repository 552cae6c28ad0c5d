"""Schemathesis against a live ``sacplan serve`` on 127.0.0.1: every check, auth off and on, 0 failures.

The document the service publishes must say what the service does: every
answer's status and body as declared, schema-valid requests accepted (or the
refusal declared: ``schemathesis.toml`` next to this file says where and why),
schema-invalid ones refused, ``Allow`` on 405 exact, auth enforced when on.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from live_server import Server

CONFIG = Path(__file__).with_name("schemathesis.toml")
KEY = "schemathesis-key-0123456789abcdef"
# Examples per operation and phase: ~600 requests a run, some 25 s here (2 shared cores).
MAX_EXAMPLES = 10


def _schemathesis() -> list[str]:
    exe = shutil.which("st")
    return [exe] if exe else [sys.executable, "-m", "schemathesis.cli"]


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
def test_the_openapi_document_tells_the_truth(tmp_path, auth):
    # The auth checks send hundreds of wrong or missing keys from this one address, on purpose: with the
    # failed-auth throttle at its default (20 a minute) every later request, the right key's included, would be
    # 429 and the rest of the run untested. The throttle has its own test (test_limits.py); here it is set past
    # what a run sends.
    env = {"SACPLAN_API_KEYS": f'{{"{KEY}": "alpha"}}', "SACPLAN_AUTH_FAILURES_PER_WINDOW": "1000000"}
    server = Server(tmp_path / "data", env=env if auth else None)
    server.data_dir.mkdir()
    server.start()
    try:
        cmd = [*_schemathesis(), "--config-file", str(CONFIG), "run", server.url + "/openapi.json",
               "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--workers", "1", "--seed", "19",
               "--request-timeout", "120", "--no-color", "--report-dir", str(tmp_path / "report")]
        if auth:
            cmd += ["--header", f"Authorization: Bearer {KEY}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout[-15000:] + done.stderr[-3000:]
    assert "16 selected / 16 total" in done.stdout  # every operation was tested
