"""``sacplan collect`` and ``sacplan verify`` and what they print: the collect command (``command``), its
progress display (``progress``), the summary (``summary``) and the guidance on what to run next (``guide``);
the verify command (``verify``: real steps with and without plans, ``verify_run`` measures them).

Torch-free at import: ``sacplan --help`` works without torch; each command
imports what needs torch (``estimators.collect``, the summary, which reads its
tags, and for verify ``estimators.apply`` and ``estimators.measure``) only when it runs.
"""

from estimators.cli import command, verify
from estimators.cli.command import UploadError, upload_stats
from estimators.cli.guide import WORLD_SIZES, Guidance, guide
from estimators.cli.progress import CollectProgress

__all__ = ["WORLD_SIZES", "CollectProgress", "Guidance", "UploadError", "guide", "register", "upload_stats"]


def register(subparsers) -> None:
    """Add ``collect`` and ``verify`` to ``sacplan``."""
    command.register(subparsers)
    verify.register(subparsers)
