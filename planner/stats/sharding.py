"""The sharding a stats document was collected under (stats v1 ``metadata.sharding``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from planner.stats.text import Text

__all__ = ["Sharding", "sharded_world_size", "sharding_scope"]


class Sharding(BaseModel):
    """How the collected step was sharded: its figures are one rank's."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fsdp2", "tp"] = Field(description="The sharding: 'fsdp2' (torch.distributed.fsdp.fully_shard, "
                                         "with tensor parallel inside it when tp_size is set), or 'tp' (tensor "
                                         "parallel alone: world_size 1, units the root).")
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
    tp_size: int | None = Field(None, ge=2, le=2**16, exclude_if=lambda v: v is None, description="Ranks of one "
                                "tensor-parallel group (torch.distributed.tensor.parallel): parameters, activations "
                                "and collectives are one TP rank's; world_size stays the FSDP degree. Null: none.")
    tp_plan: Text | None = Field(None, max_length=1024, exclude_if=lambda v: v is None, description="The "
                                 "tensor-parallel plan applied: 'hf:tp_plan' (the model's Hugging Face plan) or the "
                                 "user's function, path/to/file.py:fn.")
    sequence_parallel: StrictBool | None = Field(None, exclude_if=lambda v: v is None, description="True: norms "
                                                 "and dropout ran on sequence shards (sequence parallel).")


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


def sharding_scope(sharding: Sharding | None) -> str:
    """What a stats document's figures are, in words: ``world size 1``, ``per rank, fsdp2 x8``, ``per rank, tp x8``
    or ``per rank, fsdp2 x64 x tp x8``."""
    if sharding is None:
        return "world size 1"
    parts = [f"fsdp2 x{sharding.world_size}"] if sharding.kind == "fsdp2" else []
    if sharding.tp_size is not None:
        parts.append(f"tp x{sharding.tp_size}" + (" (sequence parallel)" if sharding.sequence_parallel else ""))
    return "per rank, " + " x ".join(parts)
