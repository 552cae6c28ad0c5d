"""The ``sacplan`` command line.

The planner's own subcommands (plan, sweep, schema) live here. ``serve``/``db``
come from ``service.cli`` and ``collect`` from ``estimators.cli``; each such
module exposes ``register(subparsers)`` and is imported only when present, so
the planner never needs the service's or torch's dependencies to run.

A usage error (unknown option, value of the wrong type) exits 1, like any other
bad input, not argparse's 2, which ``plan``/``sweep`` use for "infeasible". A
stdout closed early (``sacplan plan ... | head``) ends the command quietly with
exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from planner.cli_plan import EXIT_BAD_INPUT

__all__ = ["main"]

# Modules adding subcommands: name -> module exposing register(subparsers).
_PROVIDERS = ("planner.cli_plan", "service.cli", "estimators.cli")
_OWN_PACKAGES = {"planner", "service", "estimators", "migrations"}


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1 (bad input); subparsers inherit the class."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
        return EXIT_BAD_INPUT
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BAD_INPUT
    return code


def _discard_stdout() -> None:
    """Point fd 1 at os.devnull so Python's final flush cannot fail again (Python docs, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
