"""What every job of the PyTorch side shares: collecting, applying and measuring all import from here.

``aten_ops``: ATen ops as selective checkpointing sees them (names, views,
in-place and random ops); ``storage_book``: live bytes per category, by weak
reference; ``training_step``: calling the model, its default loss, the
optimizer; ``training_loop``: the loop around the model (micro-batches,
autocast, a GradScaler, clipping); ``module_names``: the stats' module
names; ``host_store``: the flag under which storages are host memory (offloading); ``model_settings``: the op-deciding settings of a model; ``fsdp_units``: how a model is sharded by
FSDP2; ``parallel_dims``: the one description of a job's parallelism (FSDP2, tensor parallel, the pipeline);
``tensor_parallel``: tensor parallel applied to a model (the user's function or the HF plan, sequence parallel too);
``pipeline_setup`` and ``pipeline_stages``: a pipeline's layout and a decoder cut into its stages. Nothing here
imports another subpackage of ``estimators``.
"""

from estimators.common.aten_ops import (SAC_IGNORED_OPS, backward_nodes, is_inplace_op, is_random_op, is_view_op,
                                       op_name, written_tensors)
from estimators.common.fsdp_units import MIXED_PRECISION, FsdpSetup, default_units, shard_model, unit_fqns
from estimators.common.model_settings import (BATCH_VALUES_TAG, CONFIG_SETTINGS, DTYPE_NAMES, UNKNOWN_VALUES_TAG,
                                              experts_implementation, model_config, model_configs, model_dtype_name,
                                              model_settings_of, switch_off_kv_cache)
from estimators.common.host_store import HOST_COPY_OPS, HostBook, host_side, is_host_side, makes_host_copy
from estimators.common.module_names import module_fqns
from estimators.common.pipeline_setup import PP_SCHEDULES, PipelineSetup
from estimators.common.pipeline_stages import DecoderStage, RankChunks, build_stages, decoder_parts, stage_layer_ids
from estimators.common.storage_book import (ACT, BUFFER, CATEGORIES, COMM, GRAD, INPUT, OPT, PARAM, TEMP, StorageBook,
                                            follow_storage_resizes, local_shards, storages_of, tensors_in)
from estimators.common.parallel_dims import MESH_DIM_NAMES, ParallelDims
from estimators.common.tensor_parallel import HF_TP_STYLES, hf_tp_plan, load_function, parallelize_tp
from estimators.common.training_loop import AUTOCAST_DTYPES, TrainingLoop, autocast_name
from estimators.common.training_step import OPTIMIZER_NAMES, call_model, default_loss, make_optimizer, optimizer_class

__all__ = [
    "ACT", "AUTOCAST_DTYPES", "BATCH_VALUES_TAG", "BUFFER", "CATEGORIES", "COMM", "CONFIG_SETTINGS", "DTYPE_NAMES",
    "GRAD", "HF_TP_STYLES", "HOST_COPY_OPS", "HostBook", "host_side", "is_host_side",
    "makes_host_copy", "INPUT", "MESH_DIM_NAMES", "MIXED_PRECISION", "ParallelDims", "hf_tp_plan",
    "load_function", "local_shards", "parallelize_tp", "OPT", "OPTIMIZER_NAMES", "PARAM", "PP_SCHEDULES",
    "SAC_IGNORED_OPS", "TEMP", "UNKNOWN_VALUES_TAG", "DecoderStage", "FsdpSetup", "PipelineSetup", "RankChunks", "StorageBook",
    "TrainingLoop", "autocast_name", "build_stages", "call_model", "decoder_parts", "default_loss",
    "default_units", "experts_implementation", "follow_storage_resizes", "is_inplace_op", "is_random_op",
    "backward_nodes", "is_view_op", "make_optimizer", "model_config", "model_configs", "model_dtype_name", "model_settings_of",
    "module_fqns", "op_name", "optimizer_class", "shard_model", "stage_layer_ids", "storages_of", "switch_off_kv_cache", "tensors_in",
    "unit_fqns", "written_tensors",
]
