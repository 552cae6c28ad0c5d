"""The sharding a stats document was collected under (stats v1 ``metadata.sharding``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.stats.text import Text

__all__ = ["Sharding", "sharded_world_size"]


class Sharding(BaseModel):
    """How the collected step was sharded: its figures are one rank's."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fsdp2"] = Field(description="The sharding: 'fsdp2' (torch.distributed.fsdp.fully_shard).")
    world_size: int = Field(ge=1, le=2**20, description="Ranks the parameters, gradients and optimizer state are "
                            "sharded over; every figure of the stats is one rank's, so the planner divides by nothing.")
    units: list[Annotated[Text, Field(min_length=1, max_length=1024)]] = Field(
        min_length=1, max_length=2**16, description="fqns of the modules fully_shard was applied to, in the order "
        "it was applied (the root last); the plan's fsdp_units.")
    mixed_precision: Literal["bf16"] | None = Field(
        None, description="'bf16': fp32 sharded parameters, bf16 all-gathered compute parameters, fp32 gradient "
        "reduction (MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)); null: none.")
    reshard_after_forward: bool = Field(True, description="Whether each unit (but the root) frees its all-gathered "
                                        "parameters after its forward and gathers them again in backward.")
    sync_every_micro_batch: bool | None = Field(
        None, exclude_if=lambda v: v is None, description="With gradient accumulation: false when FSDP2 reduces "
        "the gradients after the last micro-batch only (set_requires_gradient_sync(False) before the others: each "
        "unit keeps its unsharded gradients until then); null: after every micro-batch (FSDP2's default).")


def sharded_world_size(sharding: Sharding | None, world_size: int) -> int:
    """The divisor of the sharded terms for stats collected under ``sharding`` and a requested ``world_size``.

    Per-rank stats are used as they are (1); asking for another world size than
    the one collected is refused: the all-gathered units, collective buffers
    and shards the stats hold are those of ``sharding.world_size`` ranks.
    """
    if sharding is None:
        return world_size
    if world_size not in (1, sharding.world_size):
        raise ValueError(f"world_size {world_size} does not match the stats: they were collected per rank under "
                         f"{sharding.kind} at world size {sharding.world_size} (their figures are one rank's "
                         f"already); plan with world_size 1 or {sharding.world_size}, or collect again with "
                         f"--fsdp-world-size {world_size}")
    return 1
