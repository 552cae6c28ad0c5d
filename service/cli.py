"""``sacplan serve`` and ``sacplan db upgrade`` (registered into the planner's CLI)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the service's dependencies load only when a service command runs
    from service.store import Upgraded

__all__ = ["register", "describe_upgrade", "configure_logging", "docs_url"]

TRACE = 5  # uvicorn's "trace" log level


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run the HTTP service (Swagger UI at /docs)",
                                  epilog=_settings_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--workers", type=int, default=1,
                       help="uvicorn worker processes (default 1); identical plan requests are still solved once "
                            "across them (and across replicas on one database), and /metrics adds them all up")
    _data_dir_argument(serve)
    serve.add_argument("--log-level", default=None, help="uvicorn log level (default: SACPLAN_LOG_LEVEL or info)")
    serve.add_argument("--no-access-log", action="store_true", help="do not log each request")
    serve.set_defaults(handler=_serve)

    db = subparsers.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    up = db_sub.add_parser("upgrade", help="create or migrate the database to the latest schema")
    _data_dir_argument(up)
    up.add_argument("--revision", default="head", help="target revision (default head)")
    up.set_defaults(handler=_db_upgrade)


def _settings_help() -> str:
    """Every SACPLAN_* setting with its default and meaning, from the one Settings class."""
    import textwrap

    from service.config import Settings

    lines = ["settings (environment variables; a request's time_limit_s bounds its whole work, a sweep's all "
             "its points together):"]
    for name, field in Settings.model_fields.items():
        default = "" if field.default_factory is not None or field.default is None else f" (default {field.default})"
        text = f"SACPLAN_{name.upper()}{default}: {field.description or ''}".rstrip(": ")
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    return "\n".join(lines)


def _data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=None,
        help="directory of the SQLite database (default: SACPLAN_DATA_DIR or ~/.local/share/sacplan); "
        "SACPLAN_DATABASE_URL overrides it with any SQLAlchemy URL",
    )


def _settings(args: argparse.Namespace):
    if args.data_dir:
        # Through the environment, so every uvicorn worker process sees the same settings.
        os.environ["SACPLAN_DATA_DIR"] = os.path.abspath(args.data_dir)
    from service.config import Settings

    return Settings()


def _db_upgrade(args: argparse.Namespace) -> int:
    from service.store import upgrade

    settings = _settings(args)
    print(describe_upgrade(upgrade(settings.sqlalchemy_url, args.revision)))
    return 0


def describe_upgrade(done: Upgraded) -> str:
    """One line saying what ``service.store.upgrade`` did."""
    at_head = done.to_revision == done.head
    if done.from_revision == done.to_revision:
        state = f"already at head (revision {done.head})" if at_head else f"already at revision {done.to_revision}"
        return f"database {done.url}: {state}, nothing to do"
    before = f"revision {done.from_revision}" if done.from_revision else "an empty database"
    after = f"revision {done.to_revision}" + (" (head)" if at_head else "")
    return f"database {done.url}: upgraded from {before} to {after}"


def configure_logging(level: str) -> None:
    """The console log at ``level``; alembic's INFO lines (library chatter) only at debug (and trace)."""
    logging.addLevelName(TRACE, "TRACE")  # uvicorn's level below DEBUG; named before uvicorn registers it
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    quiet = logging.getLevelName(level.upper()) > logging.DEBUG
    logging.getLogger("alembic").setLevel(logging.WARNING if quiet else logging.NOTSET)


def _metrics_dir() -> None:
    """Where every worker process writes its metrics (prometheus_client's multiprocess mode), set before any
    worker starts: a fresh directory, removed at exit; or PROMETHEUS_MULTIPROC_DIR emptied of an earlier run's."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        for old in Path(given).glob("*.db"):
            old.unlink()
        return
    made = tempfile.mkdtemp(prefix="sacplan-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = made
    atexit.register(shutil.rmtree, made, ignore_errors=True)


def docs_url(host: str, port: int) -> str:
    """Where a browser on this machine finds the docs of a service listening on ``host``:``port``."""
    if host in ("", "0.0.0.0", "::"):  # every address: this machine's own is one of them
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/docs"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.store import upgrade
    from service.transport import install_log_redaction, uvicorn_options

    settings = _settings(args)
    level = args.log_level or settings.log_level
    configure_logging(level)
    install_log_redaction(settings)
    _metrics_dir()
    # a new or old database is brought to head before serving
    logging.getLogger("service").info("%s", describe_upgrade(upgrade(settings.sqlalchemy_url)))
    print(f"docs: {docs_url(args.host, args.port)} (Swagger UI; ReDoc at /redoc)", flush=True)
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=level.lower(),
        access_log=not args.no_access_log,
        **uvicorn_options(settings),
    )
    return 0
