"""The ``sacplan`` command line.

The planner's own subcommands (plan, sweep, schema) live here. ``serve``/``db``
come from ``service.cli`` and ``collect`` from ``estimators.cli``; each such
module exposes ``register(subparsers)`` and is imported only when present, so
the planner never needs the service's or torch's dependencies to run.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Modules adding subcommands: name -> module exposing register(subparsers).
_PROVIDERS = ("planner.cli_plan", "service.cli", "estimators.cli")
_OWN_PACKAGES = {"planner", "service", "estimators", "migrations"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sacplan",
        description="Selective activation checkpointing planner: collect stats, plan, serve.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _PROVIDERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Skip a room that is absent or whose third-party dependencies are
            # not installed; a broken import inside our own code still fails.
            missing = exc.name or ""
            if missing == name or missing.split(".")[0] not in _OWN_PACKAGES:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
