"""Stats v1's metadata: where a document came from, the model's settings and the training loop it was collected for."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from planner.stats.pipeline import PipelineStageInfo
from planner.stats.sharding import Sharding
from planner.stats.text import Text

__all__ = ["MIN_HOST_LINK_GBPS", "HostLink", "StatsMetadata"]

# The slowest host link a plan takes, GB/s (1 kB/s): slower ones make the offload MILP's stall coefficients (ms per
# memory unit) so large that HiGHS calls feasible problems infeasible (seen at 1e-12 GB/s on 8 Llama-3-8B layers).
MIN_HOST_LINK_GBPS = 1e-6

SettingValue = Annotated[str, Field(max_length=256)] | bool | int | float | None
OptimizerArg = SettingValue | list[Annotated[str, Field(max_length=256)] | bool | int | float | None]


class HostLink(BaseModel):
    """The device's link to host memory, per direction (offloading's copies), GB/s = 1e9 bytes/s."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    d2h: StrictFloat | StrictInt = Field(ge=MIN_HOST_LINK_GBPS, allow_inf_nan=False,
                                         description="Device to host, GB/s (offloads in the forward).")
    h2d: StrictFloat | StrictInt = Field(ge=MIN_HOST_LINK_GBPS, allow_inf_nan=False,
                                         description="Host to device, GB/s (prefetches in the backward).")
    source: Text = Field(max_length=512, description="Where the figures come from (a device table entry and its "
                         "source, or 'sacplan collect --host-link-gbps').")


class StatsMetadata(BaseModel):
    """Where a stats document came from."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    model_name: Text = Field(min_length=1, max_length=256, examples=["llama-3-8b"])
    batch_size: StrictInt | None = Field(None, ge=1, le=2**31)
    seq_len: StrictInt | None = Field(None, ge=1, le=2**31)
    input_shape: list[Annotated[StrictInt, Field(ge=0, le=2**31)]] | None = Field(None, max_length=16)
    dtype: Text | None = Field(None, max_length=32, examples=["bf16"])
    device: Text | None = Field(None, max_length=64, description="Device the collector ran on.", examples=["cpu"])
    target_device: Text | None = Field(None, max_length=64, description="Device the costs model.", examples=["H100-SXM"])
    optimizer: Text | None = Field(None, max_length=256, description="The optimizer of the step: adamw, adam, sgd "
                                   "(torch's classes at their defaults), none, or a dotted class path.",
                                   examples=["adamw", "torch.optim.Adagrad"])
    optimizer_kwargs: dict[Annotated[Text, Field(max_length=64)], OptimizerArg] | None = Field(
        None, max_length=32, exclude_if=lambda v: v is None, description="The arguments the optimizer was built "
        "with beyond its parameters (sacplan collect --optimizer-kwargs); absent: its defaults.")
    grad_accumulation: StrictInt | None = Field(
        None, ge=2, le=4096, exclude_if=lambda v: v is None, description="Micro-batches per optimizer step "
        "(gradient accumulation; batch_size is per micro-batch): the timeline covers every micro-batch and the "
        "optimizer step, a checkpointed module recomputes in each. Absent: one.")
    max_grad_norm: StrictFloat | StrictInt | None = Field(None, gt=0, exclude_if=lambda v: v is None, allow_inf_nan=False,
                                        description="Gradients clipped to this norm before the optimizer step.")
    grad_scaler: StrictBool | None = Field(None, exclude_if=lambda v: v is None, description="True: the loss was "
                                     "scaled by torch.amp.GradScaler, whose unscale and step are in the step.")
    torch_version: Text | None = Field(None, max_length=64)
    collector_version: Text | None = Field(None, max_length=64)
    tags: dict[Annotated[Text, Field(max_length=128)], Annotated[Text, Field(max_length=1024)]] = Field(
        default_factory=dict, max_length=64)
    model_settings: dict[Annotated[Text, Field(max_length=64)], SettingValue] = Field(
        default_factory=dict, max_length=32, description="Settings of the model the collector ran that decide which ops run, so a plan can be applied to "
        "the same model: use_cache, attn_implementation, experts_implementation, moe_routing, moe_capacity_factor, "
        "training.",
        examples=[{"use_cache": False, "attn_implementation": "sdpa"}],
    )
    sharding: Sharding | None = Field(
        None, description="Set when the step was collected sharded (sacplan collect --fsdp-world-size N): the "
        "figures are one rank's, all-gathered parameters and collective buffers included. Null: one unsharded rank.")
    pipeline: PipelineStageInfo | None = Field(
        None, exclude_if=lambda v: v is None, description="Set when the stats are one pipeline stage's (sacplan "
        "collect --pp-stages S): which stage, the schedule, its microbatches and per-microbatch buffers. Absent: no "
        "pipeline.")
    host_link_gbps: HostLink | None = Field(
        None, exclude_if=lambda v: v is None, description="The target device's host link, per direction (for "
        "offloading activations to host memory). Absent: not known (plan with host_link_gbps then).")
