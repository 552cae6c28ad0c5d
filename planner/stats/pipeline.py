"""Stats metadata of one pipeline-parallel stage: where it sits, the schedule, and its per-microbatch buffers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

__all__ = ["PipelineStageInfo"]


class PipelineStageInfo(BaseModel):
    """One stage of a pipeline: the stats describe one microbatch of it (two collected: the second holds the
    first one's gradients); the planner lays them out along the stage's schedule."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    stage: StrictInt = Field(ge=0, le=4096, description="This stage's index, from 0 (the first: the embeddings).")
    stages: StrictInt = Field(ge=2, le=4096, description="Pipeline stages (ranks).")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = Field(description="The pipeline schedule.")
    microbatches: StrictInt = Field(ge=1, le=4096, description="Microbatches per optimizer step (batch_size is "
                                    "per microbatch).")
    virtual_stages: StrictInt = Field(1, ge=1, le=64, exclude_if=lambda v: v == 1, description="Model chunks per "
                                      "rank (interleaved 1F1B); absent: one.")
    held_bytes: StrictInt = Field(ge=0, le=2**62, description="What one microbatch keeps from the end of its "
                                  "forward to its backward with no checkpointing: the activations autograd saved "
                                  "and the stage's output (kept for the backward).")
    buffer_bytes: StrictInt = Field(ge=0, le=2**62, description="One microbatch's tensors the stage keeps through "
                                    "the step: its P2P receive buffers (the activation received, the gradient "
                                    "received for its output), or its token ids and labels.")
    input_grad_bytes: StrictInt = Field(0, ge=0, le=2**62, description="The gradient of one microbatch's received "
                                        "activation (sent back), kept until the next step starts.")

    @model_validator(mode="after")
    def _stage_in_range(self) -> PipelineStageInfo:
        if self.stage >= self.stages:
            raise ValueError(f"pipeline.stage {self.stage} is out of range for {self.stages} stages")
        return self
