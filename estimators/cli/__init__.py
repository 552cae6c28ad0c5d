"""``sacplan collect`` and what it prints: the command (``command``), its progress display (``progress``),
the summary (``summary``) and the guidance on what to run next (``guide``).

Torch-free at import: ``sacplan --help`` works without torch; the command
imports ``estimators.collect`` (and the summary, which reads its tags) only when it runs.
"""

from estimators.cli.command import UploadError, register, upload_stats
from estimators.cli.guide import WORLD_SIZES, Guidance, guide
from estimators.cli.progress import CollectProgress

__all__ = ["WORLD_SIZES", "CollectProgress", "Guidance", "UploadError", "guide", "register", "upload_stats"]
