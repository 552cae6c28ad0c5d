"""How a pipeline-parallel job is laid out: stages, schedule, microbatches, split points.

Standalone on purpose: one frozen description that collection, stats metadata,
planning and the real run all read, to be folded into a job-wide description of
the parallelism (FSDP, TP, PP) later.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PP_SCHEDULES", "PipelineSetup"]

PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class PipelineSetup:
    """A pipeline of ``stages`` ranks running ``schedule`` over ``microbatches`` per optimizer step.

    ``split``: the module FQNs (of the whole model, ``model.layers.N``) where a new
    stage starts, one fewer than the stages; None: equal layer counts.
    ``virtual_stages``: model chunks per rank (interleaved 1F1B only; 1 otherwise).
    """

    stages: int
    schedule: str = "1f1b"
    microbatches: int = 1
    split: tuple[str, ...] | None = None
    virtual_stages: int = 1

    def __post_init__(self) -> None:
        _positive_int("pp_stages", self.stages)
        _positive_int("microbatches", self.microbatches)
        _positive_int("pp_virtual_stages", self.virtual_stages)
        if self.stages < 2:
            raise ValueError(f"pp_stages must be at least 2 for a pipeline, got {self.stages}")
        if self.schedule not in PP_SCHEDULES:
            raise ValueError(f"pp_schedule must be one of {', '.join(PP_SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "interleaved-1f1b":
            if self.virtual_stages < 2:
                raise ValueError(f"pp_virtual_stages must be at least 2 for interleaved-1f1b, "
                                 f"got {self.virtual_stages}")
            if self.microbatches % self.stages:
                raise ValueError(f"microbatches {self.microbatches} must be a multiple of pp_stages {self.stages} "
                                 f"for interleaved-1f1b")
        elif self.virtual_stages != 1:
            raise ValueError(f"pp_virtual_stages {self.virtual_stages} needs pp_schedule interleaved-1f1b, "
                             f"got {self.schedule!r}")
        if self.split is not None:
            if isinstance(self.split, str):
                raise ValueError(f"pp_split must be a list of module FQNs, got the string {self.split!r}")
            object.__setattr__(self, "split", tuple(self.split))
            want = self.stages * self.virtual_stages - 1
            if len(self.split) != want:
                raise ValueError(f"pp_split names {len(self.split)} split points {list(self.split)}; "
                                 f"{self.stages * self.virtual_stages} model chunks need {want}")
            if len(set(self.split)) != len(self.split):
                raise ValueError(f"pp_split names a split point twice: {list(self.split)}")

    @property
    def chunks(self) -> int:
        """Model chunks in all: stages times virtual stages."""
        return self.stages * self.virtual_stages
