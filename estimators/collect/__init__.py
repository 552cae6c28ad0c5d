"""Collecting one training step under fake tensors: what ``sacplan collect`` measures.

The flow: ``session`` (one run as a library call) builds the model
(``models``), picks the cost model (``devices``, ``cost_model``) and calls
``collector.collect_stats``, which runs the fake step (``fake_step``) with
its watchers: module events (``module_hooks``, ``repeat_calls``), the
timeline (``timeline``), MoE routing (``moe``), one FSDP2 rank under a fake
process group (``fsdp``), CUDA kernels emulated on the CPU (``emulation``),
checkpointing's own cost (``overhead``); every stage of a pipeline (``pipeline``); ``assemble`` writes the stats and
``settings_record`` the model's settings; ``step_errors`` names the module
and the config's shape fields of an error raised inside the step. Imports only ``estimators.common``
of its siblings: collecting depends neither on applying nor on measuring.
"""

from estimators.collect.assemble import LEFT_OUT_TAG
from estimators.collect.collector import OPTIMIZERS, collect_stats
from estimators.collect.cost_model import BenchmarkCostModel, RooflineCostModel, elapsed_ms
from estimators.collect.devices import (CPU_CHECKPOINT_OVERHEAD_US, DEVICES, DeviceSpec, cuda_device_entry,
                                        device_names, device_spec)
from estimators.collect.emulation import attention_kernel
from estimators.collect.models import (ATTENTION_MASKS, DTYPES, BuiltModel, attention_mask_batch, build_from_factory,
                                      build_from_hf_config, load_factory, parse_attention_mask)
from estimators.collect.moe import MoeRouting, TopKRecorder, parse_moe_routing
from estimators.collect.overhead import measure_checkpoint_overhead
from estimators.collect.pipeline import collect_pipeline_stages, pipeline_loss
from estimators.collect.session import (COLLECTOR_VERSION, CollectRequest, CollectResult, host_link_of,
                                       run_collection, run_pipeline_collection, target_spec)
from estimators.collect.step_errors import explain_step_error
from estimators.collect.timeline import BACKWARD, FORWARD, OPTIMIZER, TimelineRecorder

__all__ = [
    "ATTENTION_MASKS", "BACKWARD", "COLLECTOR_VERSION", "CPU_CHECKPOINT_OVERHEAD_US", "DEVICES", "DTYPES", "FORWARD",
    "LEFT_OUT_TAG", "OPTIMIZER", "OPTIMIZERS", "BenchmarkCostModel", "BuiltModel", "CollectRequest", "CollectResult",
    "DeviceSpec", "MoeRouting", "RooflineCostModel", "TimelineRecorder", "TopKRecorder", "attention_kernel",
    "attention_mask_batch", "build_from_factory", "build_from_hf_config", "collect_pipeline_stages", "collect_stats", "cuda_device_entry",
    "device_names", "device_spec", "elapsed_ms", "explain_step_error", "load_factory", "measure_checkpoint_overhead",
    "parse_attention_mask", "parse_moe_routing", "pipeline_loss", "run_collection", "run_pipeline_collection",
    "target_spec",
    "host_link_of",
]
