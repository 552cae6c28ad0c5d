"""One description of how a job is parallelized: FSDP2's, tensor parallel's and the pipeline's settings.

Collection (one rank under a fake process group), the stats' metadata and
real ranks on gloo all read a :class:`ParallelDims`, as torchtitan's jobs read
its ``ParallelDims``. The FSDP2 part is an :class:`FsdpSetup` (kept whole, so
code that takes one goes on working); the tensor-parallel part is ``tp_size``,
``sequence_parallel`` and where the plan comes from; the pipeline's part is a
:class:`PipelineSetup` (``pp``), kept whole likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from estimators.common.fsdp_units import FsdpSetup
from estimators.common.pipeline_setup import PipelineSetup

__all__ = ["MESH_DIM_NAMES", "ParallelDims"]

MESH_DIM_NAMES = ("dp_shard", "tp")  # the mesh's dimensions, outermost first (torchtitan's names)


@dataclass(frozen=True)
class ParallelDims:
    """The parallelism of one job, as every rank runs it.

    ``fsdp``: FSDP2's setup (None: parameters not sharded by ``fully_shard``;
    its ``world_size`` is the FSDP degree); ``tp_size``: ranks of one
    tensor-parallel group (1: none); ``sequence_parallel``: norms and dropout
    run on sequence shards (with the HF plan: derived from it,
    ``estimators.common.sequence_parallel_styles``; with a function: the
    function applies it, torchtitan's ``SequenceParallel``); ``parallelize``: the user's function
    ``path/to/file.py:fn`` called with ``(model, tp_mesh)`` (None: the
    model's Hugging Face ``base_model_tp_plan``); ``pp``: the pipeline's
    layout (stages, schedule, microbatches, split; None: no pipeline). A job
    with a pipeline is collected stage by stage
    (``estimators.collect.run_pipeline_collection``, which reads ``pp`` from
    here); FSDP2 or TP inside a pipeline stage are described but not collected
    yet. ``make_mesh`` is one stage's (FSDP x TP) mesh.
    """

    fsdp: FsdpSetup | None = None
    tp_size: int = 1
    sequence_parallel: bool = False
    parallelize: str | None = None
    pp: PipelineSetup | None = None

    def __post_init__(self) -> None:
        if self.pp is not None and not isinstance(self.pp, PipelineSetup):
            raise ValueError(f"pp must be a PipelineSetup or None, got {type(self.pp).__name__}")
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or self.tp_size < 1:
            raise ValueError(f"tp_size must be a positive integer, got {self.tp_size!r}")
        if self.tp_size == 1:
            for name, given in (("sequence_parallel", self.sequence_parallel), ("parallelize", self.parallelize)):
                if given:
                    raise ValueError(f"{name} {given!r} needs tensor parallel: give tp_size > 1 (--tp-size T)")
        if self.parallelize is not None and self.parallelize.rpartition(":")[1] != ":":
            raise ValueError(f"parallelize must look like path/to/file.py:fn, got {self.parallelize!r}")

    @property
    def fsdp_size(self) -> int:
        return self.fsdp.world_size if self.fsdp is not None else 1

    @property
    def pp_size(self) -> int:
        """Pipeline stages holding ranks of their own (1: no pipeline)."""
        return self.pp.stages if self.pp is not None else 1

    @property
    def stage_world_size(self) -> int:
        """Ranks of one pipeline stage (of the whole job without a pipeline): the FSDP degree times the TP degree."""
        return self.fsdp_size * self.tp_size

    @property
    def world_size(self) -> int:
        """Ranks of the whole job: the pipeline's stages times the FSDP degree times the TP degree."""
        return self.pp_size * self.stage_world_size

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def mesh_shape(self) -> tuple[int, int]:
        """(FSDP degree, TP degree): TP innermost, the ranks of one TP group adjacent (as torchtitan lays them)."""
        return self.fsdp_size, self.tp_size

    def make_mesh(self, device_type: str) -> Any:
        """The job's device mesh, ``MESH_DIM_NAMES`` (the process group must be up)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=MESH_DIM_NAMES)
