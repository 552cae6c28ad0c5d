"""``sacplan db upgrade`` says what it did; ``sacplan serve`` starts without library chatter."""

from __future__ import annotations

import os
import subprocess
import sys

from live_server import REPO

from service.cli import describe_upgrade
from service.store import Upgraded, head_revision, redacted_url, upgrade


def _db_upgrade(data_dir, *extra: str, env: dict[str, str] | None = None) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SACPLAN_")}
    base["PYTHONPATH"] = str(REPO) + os.pathsep + base.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "planner.cli", "db", "upgrade", "--data-dir", str(data_dir), *extra]
    done = subprocess.run(cmd, cwd=REPO, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "alembic" not in done.stdout + done.stderr  # no library lines
    return done.stdout


def test_db_upgrade_says_from_which_revision_to_which(tmp_path):
    db = (tmp_path / "sacplan.db").resolve()
    head = head_revision()
    assert _db_upgrade(tmp_path) == f"database sqlite:///{db}: upgraded from an empty database to revision {head} (head)\n"
    assert _db_upgrade(tmp_path) == f"database sqlite:///{db}: already at head (revision {head}), nothing to do\n"
    other = tmp_path / "other.db"
    said = _db_upgrade(tmp_path, env={"SACPLAN_DATABASE_URL": f"sqlite:///{other}"})
    assert said.startswith(f"database sqlite:///{other}: upgraded from an empty database")


def test_upgrade_returns_what_it_did(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    head = head_revision()
    assert upgrade(url, "0001") == Upgraded(url, None, "0001", head)
    assert upgrade(url) == Upgraded(url, "0001", head, head)
    assert upgrade(url) == Upgraded(url, head, head, head)


def test_passwords_never_shown():
    url = "postgresql+psycopg://team:s3cret@db.example:5432/sacplan"
    assert redacted_url(url) == "postgresql+psycopg://team:***@db.example:5432/sacplan"
    line = describe_upgrade(Upgraded(redacted_url(url), "0001", "0002", "0003"))
    assert line == "database postgresql+psycopg://team:***@db.example:5432/sacplan: upgraded from revision 0001 to revision 0002"
    assert "s3cret" not in line
