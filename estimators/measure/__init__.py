"""Measuring real training steps: the ground truth every fidelity claim is held to.

``real_step.measure_steps``: real steps on this machine, the peak of every
distinct live storage and where it happened (``track_live_storages``: the same
around a training loop that is not ours, a Trainer's); ``real_fsdp``: the same per rank
of a real FSDP2 job on gloo (``run_ranks`` spawns the ranks on 127.0.0.1,
``shard`` shards the model as the collector does); ``real_pipeline``: one stage of a real
pipeline (``torch.distributed.pipelining`` on gloo); ``gloo_comms``: FSDP2's
collectives on gloo made to release their buffers in program order. Imports
only ``estimators.common`` of its siblings.
"""

from estimators.measure.gloo_comms import (SettledAllGather, SettledFunctionalCollectives, SettledReduceScatter,
                                           run_settled, settle_gloo_collectives)
from estimators.measure.real_pipeline import measure_pipeline_stage
from estimators.measure.real_fsdp import (ALL_GATHER, BACKEND, REDUCE_SCATTER, UNSHARDED, FsdpStepMeasure,
                                          measure_fsdp_steps, run_ranks, shard)
from estimators.measure.real_step import (BACKWARD, FORWARD, OPTIMIZER, PHASES, LiveStorages, StepMeasure, measure_steps,
                                         track_live_storages)

__all__ = ["ALL_GATHER", "BACKEND", "BACKWARD", "FORWARD", "OPTIMIZER", "PHASES", "REDUCE_SCATTER", "UNSHARDED",
           "FsdpStepMeasure", "LiveStorages", "measure_pipeline_stage", "SettledAllGather",
           "SettledFunctionalCollectives", "SettledReduceScatter", "StepMeasure", "measure_fsdp_steps",
           "measure_steps", "run_ranks", "run_settled", "settle_gloo_collectives", "shard",
           "track_live_storages"]
