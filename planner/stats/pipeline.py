"""Stats metadata of one pipeline-parallel stage: where it sits, the schedule, and its per-microbatch buffers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

__all__ = ["PipelineChunkInfo", "PipelineStageInfo"]


class PipelineChunkInfo(BaseModel):
    """One model chunk of a rank under interleaved 1F1B: which stage of the pipeline it is and what one
    microbatch of it keeps."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    stage_index: StrictInt = Field(ge=0, le=2**18, description="The chunk's stage in the whole pipeline "
                                   "(rank + stages x its local index).")
    modules: list[str] = Field(min_length=1, description="The FQNs of the modules that are this chunk's alone "
                               "(its decoder layers; the embedding, final norm and LM head where it has them).")
    held_bytes: StrictInt = Field(ge=0, le=2**62, description="What one microbatch of this chunk keeps from the "
                                  "end of its forward to its backward (saved activations and the chunk's output).")
    output_bytes: StrictInt = Field(ge=0, le=2**62, description="The chunk's output for one microbatch (what a "
                                    "forward send keeps referenced).")
    grad_bytes: StrictInt = Field(0, ge=0, le=2**62, description="The chunk's parameter gradients (absent until "
                                  "its first backward of the step).")
    input_grad_bytes: StrictInt = Field(0, ge=0, le=2**62, description="The gradient of the chunk's received "
                                        "activation for one microbatch (what a backward send keeps referenced).")


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
    chunks: list[PipelineChunkInfo] | None = Field(None, exclude_if=lambda v: v is None, description="Interleaved "
                                                   "1F1B: this rank's model chunks in local order; absent: one.")

    @model_validator(mode="after")
    def _stage_in_range(self) -> PipelineStageInfo:
        if self.stage >= self.stages:
            raise ValueError(f"pipeline.stage {self.stage} is out of range for {self.stages} stages")
        if (self.schedule == "interleaved-1f1b") != (self.chunks is not None):
            raise ValueError(f"pipeline.chunks must be given exactly for interleaved-1f1b (schedule "
                             f"{self.schedule!r}, chunks {'given' if self.chunks is not None else 'absent'})")
        if self.chunks is not None and len(self.chunks) != self.virtual_stages:
            raise ValueError(f"pipeline.chunks has {len(self.chunks)} entries for virtual_stages "
                             f"{self.virtual_stages}")
        return self
