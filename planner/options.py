"""The plan options: one model for the Python API, the command line and the service.

Every option besides the budget that changes a plan is a field here, with
its description, default and validation. ``sacplan plan``/``sweep`` derive
their flags from the fields (``world_size`` -> ``--world-size``, a list
``ac_units`` -> a repeatable ``--ac-unit``, a trailing unit ``_s`` dropped:
``time_limit_s`` -> ``--time-limit``), and the service's request bodies
subclass the model with its own size limits. Adding an option means adding a
field here and reading it where the plan is made.

Errors are ``ValueError`` naming the field and the value as given
(``world_size must be a positive integer, got 0``); they start with the
field's name, so the CLI and the service can tell them in their own terms.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from planner.memory_model import GIB
from planner.stats.format import MAX_BYTES
from planner.stats.metadata import MIN_HOST_LINK_GBPS

__all__ = ["MIN_REL_GAP", "Offload", "PlanOptions", "Solver", "plan_options"]

Solver = Literal["auto", "milp", "dp"]
Offload = Literal["off", "on"]
# The smallest gap a plan claims: the DP treats costs within 1e-9 (relative, plus 1e-9 ms) as equal.
MIN_REL_GAP = 1e-8


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float))


class PlanOptions(BaseModel):
    """Everything besides the budget that changes a plan."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world_size: int = Field(
        1, ge=1, description="Ranks that parameters and gradients (and, if included, optimizer state) are sharded "
                             "over (FSDP). Stats collected per rank (metadata.sharding) are used as they are: "
                             "1 or their own world size, no other.")
    ac_units: list[str] | None = Field(
        None, description="Only these modules (fqns) may be checkpointed; by default every non-leaf module with op "
                          "stats.")
    fsdp_units: list[str] | None = Field(
        None, description="FSDP-wrapped modules (fqns): no checkpointed module may contain one; by default the "
                          "stats' metadata.sharding.units, else none.")
    time_limit_s: float = Field(
        60.0, gt=0.0, allow_inf_nan=False,
        description="Time limit of the whole request, seconds: one budget for all the points of a sweep, "
                    "reading the stats included; on expiry the best plan comes back as 'feasible' with its proven "
                    "gap, and budgets not reached as 'time_limit'.")
    mip_rel_gap: float = Field(
        1e-6, ge=0.0, lt=1.0, description="Relative gap at which a plan counts as optimal (its mip_gap is then at "
                                          "most this); below 1e-8 counts as 1e-8.")
    solver: Solver = Field(
        "auto", description="Planning engine: 'dp' (exact bounded DP), 'milp' (HiGHS), or 'auto' (the DP, with the "
                            "MILP where the DP does not apply).")
    first_step_only: bool = Field(
        False, description="Plan the first step only: no optimizer state before the first optimizer step. By "
                           "default a plan holds for every step (the optimizer state the stats record is live "
                           "throughout).")
    reserve_gib: float = Field(
        0.0, ge=0.0, le=MAX_BYTES / GIB, description="Fixed reserve added at every point of the step, GiB.")
    offload: Offload = Field(
        "off", description="Offload activations to host memory as a third decision beside keep and recompute, inside "
                           "checkpointed modules ('on'), or not ('off': plans exactly as without this option).")
    host_link_gbps: float | None = Field(
        None, ge=MIN_HOST_LINK_GBPS, allow_inf_nan=False,
        description="Host link bandwidth with offload='on', GB/s (1e9 bytes/s) per direction, both directions alike; "
                    "overrides the stats' figure (metadata.host_link_gbps), needed when the stats carry none.")
    host_budget_gib: float | None = Field(
        None, gt=0.0, le=MAX_BYTES / GIB, allow_inf_nan=False,
        description="With offload='on': the most pinned host memory a plan may offload to, GiB per rank (its "
                    "host_bytes, the sum of its windows' offloaded bytes); none: no cap.")

    @field_validator("world_size", mode="before")
    @classmethod
    def _world_size(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"world_size must be a positive integer, got {v!r}")
        return v

    @field_validator("ac_units", "fsdp_units", mode="before")
    @classmethod
    def _units(cls, v: Any, info) -> Any:
        if isinstance(v, (str, bytes)):
            raise ValueError(f"{info.field_name} must be a list of module fqns, got the string {v!r} (write [{v!r}])")
        if v is not None and not isinstance(v, (list, tuple)):
            raise ValueError(f"{info.field_name} must be a list of module fqns, got {type(v).__name__}")
        for k, f in enumerate(v or ()):
            if not isinstance(f, str):
                raise ValueError(f"{info.field_name}[{k}] must be a module fqn (a string), got {f!r}")
        return None if v is None else list(v)

    @field_validator("time_limit_s", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> Any:
        if not _number(v) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"time_limit_s must be a positive number of seconds, got {v!r}")
        return v

    @field_validator("mip_rel_gap", mode="before")
    @classmethod
    def _gap(cls, v: Any) -> Any:
        if not _number(v) or not 0 <= v < 1:
            raise ValueError(f"mip_rel_gap must be in [0, 1), got {v!r}")
        return v

    @field_validator("solver", mode="before")
    @classmethod
    def _solver(cls, v: Any) -> Any:
        if v not in ("auto", "milp", "dp"):
            raise ValueError(f"solver must be 'auto', 'milp' or 'dp', got {v!r}")
        return v

    @field_validator("first_step_only", mode="before")
    @classmethod
    def _flag(cls, v: Any, info) -> Any:
        if not isinstance(v, bool):
            raise ValueError(f"{info.field_name} must be true or false, got {v!r}")
        return v

    @field_validator("reserve_gib", mode="before")
    @classmethod
    def _reserve(cls, v: Any) -> Any:
        if not _number(v) or not math.isfinite(v) or not 0 <= v <= MAX_BYTES / GIB:
            raise ValueError(f"reserve_gib must be a number of GiB from 0 to {MAX_BYTES // GIB}, got {v!r}")
        return v

    @field_validator("offload", mode="before")
    @classmethod
    def _offload(cls, v: Any) -> Any:
        if v not in ("off", "on"):
            raise ValueError(f"offload must be 'off' or 'on', got {v!r}")
        return v

    @field_validator("host_link_gbps", mode="before")
    @classmethod
    def _host_link(cls, v: Any) -> Any:
        if v is not None and (not _number(v) or not math.isfinite(v) or v < MIN_HOST_LINK_GBPS):
            raise ValueError(f"host_link_gbps must be a positive number of GB/s (at least {MIN_HOST_LINK_GBPS:g}), "
                             f"got {v!r}")
        return v

    @field_validator("host_budget_gib", mode="before")
    @classmethod
    def _host_budget(cls, v: Any) -> Any:
        if v is not None and (not _number(v) or not math.isfinite(v) or not 0 < v <= MAX_BYTES / GIB):
            raise ValueError(f"host_budget_gib must be a positive number of GiB (at most {MAX_BYTES // GIB}), "
                             f"got {v!r}")
        return v

    @property
    def host_budget_bytes(self) -> float | None:
        """``host_budget_gib`` in bytes (None: no cap)."""
        return None if self.host_budget_gib is None else self.host_budget_gib * GIB

    @property
    def effective_rel_gap(self) -> float:
        """The gap the engines work to: ``mip_rel_gap``, at least ``MIN_REL_GAP``."""
        return max(self.mip_rel_gap, MIN_REL_GAP)

    def cache_fields(self) -> dict[str, Any]:
        """The options as a plan cache keys them: unit lists as sorted sets, numbers as floats where they are.

        With offload off, neither offload nor host_link_gbps nor host_budget_gib is in the key: they cannot change
        such a plan, and keys made before the options existed stay valid; host_budget_gib is in it only when set.
        """
        out = {name: getattr(self, name) for name in PlanOptions.model_fields}  # not a request body's other fields
        if self.offload == "off":
            del out["offload"], out["host_link_gbps"]
        elif self.host_link_gbps is not None:
            out["host_link_gbps"] = float(self.host_link_gbps)
        if self.offload == "off" or self.host_budget_gib is None:
            del out["host_budget_gib"]
        else:
            out["host_budget_gib"] = float(self.host_budget_gib)
        for name in ("ac_units", "fsdp_units"):
            if out[name] is not None:
                out[name] = sorted(set(out[name]))
        for name in ("time_limit_s", "mip_rel_gap", "reserve_gib"):
            out[name] = float(out[name])
        return out


def plan_options(options: PlanOptions | None = None, **values: Any) -> PlanOptions:
    """``options`` as given, or a new one from keyword values; ValueError naming the first bad field."""
    if options is not None:
        if values:
            raise TypeError(f"give options= or keyword options, not both (got {sorted(values)})")
        if not isinstance(options, PlanOptions):
            raise TypeError(f"options must be a planner.PlanOptions, got {type(options).__name__}")
        return options
    try:
        return PlanOptions(**values)
    except ValidationError as exc:
        raise ValueError(_first_message(exc)) from None


def _first_message(exc: ValidationError) -> str:
    e = exc.errors(include_url=False)[0]
    if e["type"] == "extra_forbidden":
        return f"{e['loc'][0]} is not a plan option (options: {', '.join(PlanOptions.model_fields)})"
    msg = e["msg"].removeprefix("Value error, ")
    name = str(e["loc"][0]) if e["loc"] else ""
    return msg if msg.startswith(name) else f"{name}: {msg} (got {e.get('input')!r})"
