"""``sacplan serve`` and ``sacplan db upgrade`` (registered into the planner's CLI)."""

from __future__ import annotations

import argparse
import logging
import os

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run the HTTP service (Swagger UI at /docs)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
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
    from service.db import upgrade

    settings = _settings(args)
    upgrade(settings.sqlalchemy_url, args.revision)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.db import upgrade

    settings = _settings(args)
    logging.basicConfig(level=(args.log_level or settings.log_level).upper(), format="%(levelname)s %(name)s: %(message)s")
    upgrade(settings.sqlalchemy_url)  # a new or old database is brought to head before serving
    uvicorn.run(
        "service.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=(args.log_level or settings.log_level).lower(),
        access_log=not args.no_access_log,
    )
    return 0
