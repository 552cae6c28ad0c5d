"""The parts of a plan's chart that say where in the step a moment is: the phase strip and the module names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PHASE_COLORS", "draw_phase_strip", "label_phase_strip", "label_modules", "short_name"]

PHASE_COLORS = {"forward": "#a6cee3", "backward": "#fdbf6f", "optimizer": "#cab2d6"}
_PHASE_NAMES = {"forward": ("forward", "fw", "F"), "backward": ("backward", "bw", "B"),
                "optimizer": ("optimizer step", "optimizer", "opt", "")}
# Rotated tick labels need about a line each, in pixels.
_TICK_LINE_PX = 11
_NAME_CHARS = 34


def short_name(text: str, root: str) -> str:
    """``text`` with the root module's name taken off each module named in it (every module is under the root)."""
    return text.replace(f"{root}.", "")


def _segments(values: Sequence[Any]) -> list[tuple[int, int, Any]]:
    """(start, end, value) of each run of equal values."""
    runs, start = [], 0
    for k in range(1, len(values) + 1):
        if k == len(values) or values[k] != values[start]:
            runs.append((start, k, values[start]))
            start = k
    return runs


def draw_phase_strip(ax: Any, phases: Sequence[str], micro_batches: Sequence[int | None]) -> None:
    """A strip of one colored block per phase (and micro-batch); :func:`label_phase_strip` names them."""
    seen: set[str] = set()
    for start, end, (phase, _) in _segments(list(zip(phases, micro_batches))):
        label = None if phase in seen else ("optimizer step" if phase == "optimizer" else phase)
        seen.add(phase)
        ax.axvspan(start - 0.5, end - 0.5, color=PHASE_COLORS.get(phase, "0.85"), linewidth=0, label=label)
        if start:
            ax.axvline(start - 0.5, color="white", linewidth=1.5)
    ax.set_yticks([])
    ax.tick_params(axis="x", length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)


def label_phase_strip(ax: Any, phases: Sequence[str], micro_batches: Sequence[int | None], renderer: Any) -> None:
    """Each block of the strip named in the longest words that fit inside it (none where nothing fits).

    Call once the figure is laid out: the words are measured as ``renderer`` draws them.
    """
    for start, end, (phase, micro) in _segments(list(zip(phases, micro_batches))):
        room = abs(ax.transData.transform((end - 0.5, 0))[0] - ax.transData.transform((start - 0.5, 0))[0]) - 4
        words = [w for w in _PHASE_NAMES.get(phase, (phase,)) if w]
        if micro is not None:
            words = [f"{words[0]}, micro-batch {micro}", f"{words[0]} {micro}"] + [f"{w} {micro}" for w in words[1:]]
        for w in words:
            text = ax.text((start + end - 1) / 2, 0.5, w, ha="center", va="center", fontsize=8,
                           transform=ax.get_xaxis_transform())
            if text.get_window_extent(renderer).width <= room:
                break
            text.remove()


def label_modules(ax: Any, modules: Sequence[str | None], root: str, width_px: float) -> None:
    """The module running at each moment on the x axis: where the module changes, as many as fit, evenly."""
    changes = [k for k, m in enumerate(modules) if m is not None and (k == 0 or modules[k - 1] != m)]
    most = max(1, int(width_px // _TICK_LINE_PX))
    if len(changes) > most:
        picks = np.unique(np.round(np.linspace(0, len(changes) - 1, most)).astype(int))
        changes = [changes[i] for i in picks]
    ax.set_xticks(changes, [_fit(short_name(modules[k], root) if modules[k] != root else root) for k in changes],
                  rotation=90, fontsize=7)


def _fit(name: str) -> str:
    """A module name short enough for the axis: its end (the part that tells modules apart) when too long."""
    return name if len(name) <= _NAME_CHARS else "…" + name[-(_NAME_CHARS - 1):]
