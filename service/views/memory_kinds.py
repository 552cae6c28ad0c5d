"""What a plan's memory is made of at each moment of the step, without and with the plan, for its chart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from planner import Stats, memory_model

__all__ = ["KINDS", "StepMemory", "step_memory", "offloaded_by_moment"]

# Bottom to top as charts stack them: what stays through the step first, what checkpointing changes last.
KINDS = ("parameters", "optimizer state", "gradients", "reserve", "activations", "held inputs")


@dataclass(frozen=True)
class StepMemory:
    """Per moment of the step (in step order): what runs, and its memory by kind without and with the plan."""

    phases: tuple[str, ...]  # forward, backward, optimizer; or module (PyTorch's per-module model)
    modules: tuple[str | None, ...]
    micro_batches: tuple[int | None, ...]  # with gradient accumulation; else every entry None
    baseline: dict[str, np.ndarray]  # kind -> bytes per moment, no checkpointing
    planned: dict[str, np.ndarray] | None  # the same with the plan; None when the plan has no modules to apply
    peak_at: str  # where the peak of what is drawn is, in words
    peak_index: int
    host: np.ndarray | None = None  # bytes the plan has offloaded to host memory per moment; None: no offloading

    def total(self, by_kind: dict[str, np.ndarray]) -> np.ndarray:
        return sum(by_kind.values(), np.zeros(len(self.phases)))


def step_memory(stats: Stats, plan: dict[str, Any]) -> StepMemory:
    """``plan``'s moments (the memory model it was made with) and their memory by kind.

    With the plan, activations are the step's less what the checkpointed
    modules discard and what is offloaded to host memory at that moment, and
    "held inputs" the inputs those modules keep alive until their backward
    ends (which the discard no longer offsets there).
    """
    timeline = plan.get("timeline") or []
    model = memory_model(stats, world_size=plan.get("world_size", 1),
                         first_step_only=plan.get("first_step_only", False))
    baseline = {kind: model.base_by_kind[kind].copy() for kind in KINDS if kind in model.base_by_kind}
    if len(timeline) == len(model.keys):  # the reserve the plan asked for is what its timeline has on top
        reserve = np.array([t["baseline_bytes"] for t in timeline], dtype=np.float64) - model.base_bytes
        if reserve.max() >= 1.0:
            baseline["reserve"] = np.maximum(reserve, 0.0)
    planned = host = None
    if plan.get("status") in ("optimal", "feasible"):
        host = offloaded_by_moment(model, plan, stats.root.fqn)
        planned = _planned(model, plan, baseline, host)
    shown = sum((planned or baseline).values())
    peak = int(np.argmax(shown))
    return StepMemory(model.phases, model.modules, model.micro_batches or (None,) * len(model.keys),
                      baseline, planned, plan.get("peak_at") or model.describe(peak), peak, host)


def offloaded_by_moment(model: Any, plan: dict[str, Any], root: str) -> np.ndarray | None:
    """Bytes ``plan`` holds on the host at each moment of ``model``, or None for a plan without offloading.

    Window j's offloaded bytes are off the device at the moments whose key is at least ``B_{j+1}``, one past
    the forward post-order position of window j+1's end module, in forward and backward alike
    (docs/memory-model.md, "Offloading"); the last window's are never credited; a module offloading per call
    (``offload_calls``) holds its bytes on the host wherever a call's discard is. ``plan['offload_windows']``
    lists every window, the last one's end module '' (the root, ``root``).
    """
    windows = plan.get("offload_windows")
    if not windows:
        return None
    host = np.zeros(len(model.keys))
    for window, after in zip(windows, windows[1:]):
        credited_from = model.post_pos[after["end_module"] or root] + 1
        host += float(window["offloaded_bytes"]) * (model.keys >= credited_from)
    for m in plan.get("modules", []):  # a module called more than once offloads per call: where its discard is
        if (m.get("offload_calls") or 1) > 1 and m.get("offloaded_bytes") and m["fqn"] in model.post_pos:
            calls = (model.keys > model.post_pos[m["fqn"]]) + model.repeats.get(m["fqn"], 0.0)
            host += float(m["offloaded_bytes"]) * calls
    return host


def _planned(model: Any, plan: dict[str, Any], baseline: dict[str, np.ndarray],
             host: np.ndarray | None) -> dict[str, np.ndarray]:
    modules = plan.get("modules", [])
    discarded = {m["fqn"]: float(m["discarded_bytes"]) for m in modules}
    saves = {m["fqn"]: m["save"] for m in modules if m.get("save")}
    freed = model.base_bytes - model.profile_bytes(discarded, held=False)
    held = model.profile_bytes(discarded, saves=saves) - model.profile_bytes(discarded, held=False)
    planned = dict(baseline)
    planned["activations"] = baseline["activations"] - freed - (0.0 if host is None else host)
    planned["held inputs"] = np.maximum(held, 0.0)
    return planned
