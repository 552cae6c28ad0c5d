"""The collector's records of the step as it runs: each op, each module."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ModuleRecord", "OpRecord"]


@dataclass
class OpRecord:
    """One op the fake step ran in forward, as the stats will describe it."""

    name: str
    runtime_ms: float
    output_bytes: int
    out_serials: frozenset[int]
    view_like: bool
    random: bool
    inplace: bool
    mutated_serial: int | None
    fresh: bool = True  # every output storage is new (False: an alias op such as _unsafe_view, or in-place)
    cached_cast: bool = False  # autocast's cast of a parameter, which its cache holds until autocast exits
    new_storages: tuple[tuple[int, int], ...] = ()  # (serial, bytes) of the storages it made
    must_save: bool = False  # a collective inside a module (tensor parallel's): never recomputed
    fw_count: int | None = None  # the first micro-batch's forward: module finishes before it (its moment)
    fw_live: int | None = None  # most live bytes but parameters, gradients and optimizer state since the op before


@dataclass
class ModuleRecord:
    """What the collector learns of one module while the step runs."""

    fqn: str
    parent: str | None
    is_leaf: bool
    ops: list[int] = field(default_factory=list)  # indices into the global op list
    act_before: int = 0
    act_after: int = 0
    input_bytes: int = 0
    activation_inputs: tuple[tuple[int, int], ...] = ()  # (serial, bytes) of its inputs made in the forward
    keyword_inputs_seen: bool = False
    output_bytes: int = 0
    fw_ms: float = 0.0
    bw_ms: float = 0.0
    temp_start: int = 0
    temp_peak: int = 0
    act_at_peak: int | None = None  # live activations when the backward peak was reached
    grad_total: int | None = None
    bw_state: str = "none"  # none -> open -> closed
    done_fw: bool = False
    ran_inside: tuple[str, ...] = ()  # fqns of the modules running when its first call began
    call: tuple | None = None  # its first call's arguments (tensors as TensorSpecs), when asked for
    recompute_stop: int = 0  # its ops recorded when autograd last saved a tensor in its forward
    calls: int = 0  # forward calls in the step (a shared layer is called once per use)
    out_serials: frozenset[int] = frozenset()  # its first call's output storages
    # per later call: its inputs made in the forward ({serial: bytes}) and its output storages
    later_calls: list[tuple[dict[int, int], frozenset[int]]] = field(default_factory=list)

