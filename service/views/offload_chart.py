"""The parts of a plan's chart that show offloading: what is on the host when, and per window what is kept,
recomputed and offloaded, with the copy times against the compute that hides them.

A plan made with ``offload='on'`` says per window (``offload_windows``, forward
order) its offloaded bytes and copy times, and per checkpointed module what it
saves, discards (recomputes) and offloads; docs/memory-model.md, "Offloading",
derives when those bytes are off the device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from service.views.chart_axes import short_name

__all__ = ["OFFLOAD_COLORS", "HOST_LABEL", "draw_host_band", "draw_windows", "offload_words", "window_bytes"]

# kept on the device, recomputed in backward, offloaded to host memory (the chart's kinds of a module's outputs)
OFFLOAD_COLORS = {"kept on the device": "#2f6b3a", "discarded, recomputed in backward": "#cccccc",
                  "offloaded to host memory": "#17becf"}
HOST_LABEL = "offloaded: on the host, off the device"
_WORDS_UP_TO = 12  # windows whose bars are wide enough for a few words each


def _amount(nbytes: float, unit: tuple[str, float]) -> str:
    return f"{nbytes / unit[1]:.4g} {unit[0]}"


def draw_host_band(ax: Any, device_total: np.ndarray, host: np.ndarray, unit: tuple[str, float]) -> None:
    """What is on the host at each moment, hatched above the device's memory (not counted in it)."""
    x = np.arange(len(host))
    ax.fill_between(x, device_total / unit[1], (device_total + host) / unit[1], step="mid", facecolor="none",
                    edgecolor=OFFLOAD_COLORS["offloaded to host memory"], hatch="////", linewidth=0,
                    label=f"{HOST_LABEL} (at most {_amount(float(host.max()), unit)})")


def _window_of(post_pos: Mapping[str, int], ends: list[int], fqn: str) -> int | None:
    """The window a module is in: the first whose end module comes at or after it in forward post-order."""
    pos = post_pos.get(fqn)
    return None if pos is None else next((k for k, end in enumerate(ends) if pos <= end), None)


def window_bytes(plan: dict[str, Any], post_pos: Mapping[str, int], root: str) -> dict[str, np.ndarray]:
    """Per window of ``plan``: the bytes its checkpointed modules keep on the device, discard, and offload (the
    last window's end module is '', the root ``root``)."""
    windows = plan["offload_windows"]
    ends = [post_pos[w["end_module"] or root] for w in windows]
    out = {kind: np.zeros(len(windows)) for kind in OFFLOAD_COLORS}
    for m in plan.get("modules", []):
        k = _window_of(post_pos, ends, m["fqn"])
        if k is None:
            continue
        offloaded = m.get("offloaded_bytes") or 0
        out["kept on the device"][k] += m["saved_bytes"] - offloaded
        out["discarded, recomputed in backward"][k] += max(m["discarded_bytes"], 0)
        out["offloaded to host memory"][k] += offloaded
    return out


def draw_windows(ax: Any, plan: dict[str, Any], post_pos: Mapping[str, int], root: str) -> None:
    """One stacked bar per window: its checkpointed modules' outputs kept, recomputed and offloaded; above each
    bar its copies' stall, where the copies outlast the next window's compute."""
    windows = plan["offload_windows"]
    parts = window_bytes(plan, post_pos, root)
    top = max(float(sum(parts.values()).max()), 1.0)
    unit = next(((n, s) for n, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= s), ("KiB", 2**10))
    x = np.arange(len(windows))
    bottom = np.zeros(len(windows))
    for kind, values in parts.items():
        ax.bar(x, values / unit[1], 0.7, bottom=bottom / unit[1], color=OFFLOAD_COLORS[kind], label=kind)
        bottom += values
    few = len(windows) <= _WORDS_UP_TO
    for k, w in enumerate(windows):  # with many windows only the stall, turned: the bars' heights say the bytes
        words = [f"{_amount(w['offloaded_bytes'], unit)} off"] if w["offloaded_bytes"] and few else []
        if w["stall_ms"] > 0:
            words.append(f"stall {w['stall_ms']:.3g} ms")
        if words:
            ax.annotate("\n".join(words), (k, bottom[k] / unit[1]), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=7 if few else 6, rotation=0 if few else 90)
    names = [short_name(w["end_module"], root) if w["end_module"] not in ("", root) else "rest" for w in windows]
    ax.set_xticks(x, [f"{w['index']}: to {n}" for w, n in zip(windows, names)], rotation=0 if few else 90,
                  fontsize=7)
    ax.set_xlim(-0.6, len(windows) - 0.4)
    ax.set_ylim(0, top * (1.3 if few else 1.6) / unit[1])
    ax.set_ylabel(f"per window: checkpointed\nmodules' outputs, {unit[0]}", fontsize=9)
    ax.set_xlabel("offload window, as the plan numbers them: window j's copies overlap window j+1's compute",
                  fontsize=9)
    ax.grid(axis="y", alpha=0.3)


def offload_words(plan: dict[str, Any]) -> str:
    """The plan's offloading in a few words for the title: host memory and predicted stall; '' without it."""
    if plan.get("offload") != "on":
        return ""
    host = plan.get("host_bytes") or 0
    stall = plan.get("offload_stall_ms") or 0.0
    link = plan.get("host_link_gbps") or {}
    speed = f" at {link['d2h']:g}/{link['h2d']:g} GB/s" if "d2h" in link and "h2d" in link else ""
    return f"; offloaded {host / 2**30:.3g} GiB pinned host memory{speed}, stall {stall:.3g} ms"
