"""The ``sacplan`` command line.

The planner's own subcommands (plan, sweep, schema) live here. ``serve``/``db``
come from ``service.cli`` and ``collect`` from ``estimators.cli``; each such
module exposes ``register(subparsers)`` and is imported only when present, so
the planner never needs the service's or torch's dependencies to run.

A usage error (unknown option, value of the wrong type) exits 1, like any other
bad input, not argparse's 2, which ``plan``/``sweep`` use for "infeasible". An
unknown option is named with the closest valid one, before any other usage
error (a typo'd ``--budgt-gib`` is not reported as a missing ``--budget-gib``),
and options are never matched by prefix. A stdout closed early
(``sacplan plan ... | head``) ends the command quietly with exit 1.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence

from planner.cli_plan import EXIT_BAD_INPUT
from planner.version import PLANNER_VERSION

__all__ = ["main"]

# Modules adding subcommands: name -> module exposing register(subparsers).
_PROVIDERS = ("planner.cli_plan", "service.cli", "estimators.cli")
_OWN_PACKAGES = {"planner", "service", "estimators", "migrations"}


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1 (bad input), unknown options named with the closest valid one, no prefix matching.

    Subparsers inherit the class (``add_parser`` makes them with the parent's class).
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --budget never stands for --budget-gib
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        # before argparse's own checks, which would report a missing required option first
        self._refuse_unknown_options(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def _refuse_unknown_options(self, args: list[str]) -> None:
        known = self._option_string_actions
        for arg in args:
            if arg == "--" or (self._subparsers is not None and not arg.startswith("-")):
                return  # past the options; a subcommand checks its own
            if not arg.startswith("-") or self._negative_number_matcher.match(arg):
                continue
            option = arg.split("=", 1)[0]
            if option not in known:
                close = difflib.get_close_matches(option, [k for k in known if k.startswith("--")], n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else f" (see {self.prog} --help)"
                self.error(f"unknown option {option}{hint}")

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sacplan",
        description="Selective activation checkpointing planner: collect stats, plan, serve.",
    )
    parser.add_argument("--version", action="version", version=f"sacplan {PLANNER_VERSION}")
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
