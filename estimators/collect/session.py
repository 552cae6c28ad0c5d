"""One ``sacplan collect`` run as a library call: build the model, pick the cost model, collect."""

from __future__ import annotations

import json
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from estimators.collect.collector import collect_stats
from estimators.collect.cost_model import BenchmarkCostModel, RooflineCostModel
from estimators.collect.devices import DeviceSpec, cuda_device_entry, device_spec
from estimators.collect.models import DTYPES, BuiltModel, build_from_factory, build_from_hf_config, load_factory
from estimators.collect.moe import parse_moe_routing
from estimators.collect.pipeline import collect_pipeline_stages
from planner import choose_pipeline_split
from estimators.common import FsdpSetup, ParallelDims, PipelineSetup
from planner import PLANNER_VERSION, HostLink, Stats, StatsMetadata, baseline_peak_bytes

__all__ = ["CollectRequest", "CollectResult", "run_collection", "run_pipeline_collection", "target_spec", "host_link_of",
           "COLLECTOR_VERSION"]

COLLECTOR_VERSION = f"sacplan-estimators {PLANNER_VERSION}"
# The CUDA caching allocator hands out blocks in multiples of 512 bytes.
CUDA_BLOCK_BYTES = 512


@dataclass
class CollectRequest:
    model: str | None = None
    hf_config: str | dict | None = None
    batch: int = 1
    seq: int = 512
    dtype: str = "fp32"
    optimizer: str = "adamw"
    optimizer_kwargs: str | dict | None = None  # JSON text (the CLI's) or a dict
    grad_accumulation: int = 1
    autocast: str | None = None
    grad_scaler: bool = False
    max_grad_norm: float | None = None
    device: str = "cpu"
    target_device: str | None = None
    peak_tflops: float | None = None
    mem_bandwidth_gbps: float | None = None
    compute_efficiency: float | None = None
    memory_efficiency: float | None = None
    allow_tf32: bool = False
    benchmark: bool = False
    checkpoint_overhead_us_per_op: float | None = None
    host_link_gbps: float | None = None  # both directions; None: the device table's figure
    moe_routing: str = "balanced"
    attention_mask: str = "none"  # --hf-config only: none, ones or padded:F
    name: str | None = None
    fsdp_world_size: int | None = None
    fsdp_wrap: list[str] | None = None
    mixed_precision: str | None = None
    reshard_after_forward: bool = True
    sync_every_micro_batch: bool = True  # False: --fsdp-sync-last-micro-batch
    compile_backend: str | None = None  # the step compiled whole: torch.compile(model, backend=...)
    tp_size: int = 1  # tensor parallel's degree (1: none)
    parallelize: str | None = None  # the user's TP function, file.py:fn (None: the model's HF plan)
    sequence_parallel: bool = False
    pp_stages: int | None = None  # pipeline parallel: every stage collected, one stats document each
    pp_schedule: str = "1f1b"
    microbatches: int = 1
    pp_split: list[str] | None = None  # ["auto"]: chosen under pp_budget_gib (see run_pipeline_collection)
    pp_virtual_stages: int = 1
    budget_gib: float | None = None  # --pp-split auto: the device budget the split is chosen under
    world_size: int = 1  # --pp-split auto: ranks sharing each stage's parameters, gradients and optimizer state

    @classmethod
    def from_args(cls, args: Any) -> CollectRequest:
        fields = cls.__dataclass_fields__
        return cls(**{k: getattr(args, k) for k in fields if hasattr(args, k)})

    def fsdp_setup(self) -> FsdpSetup | None:
        """The FSDP2 sharding asked for, or None; ValueError for options that need it or contradict it."""
        if self.fsdp_world_size is None:
            for flag, given in (("--fsdp-wrap", self.fsdp_wrap), ("--mixed-precision", self.mixed_precision),
                                ("--no-reshard-after-forward", not self.reshard_after_forward),
                                ("--fsdp-sync-last-micro-batch", not self.sync_every_micro_batch)):
                if given:
                    raise ValueError(f"{flag} shards the step: it needs --fsdp-world-size N")
            return None
        if self.mixed_precision is not None and self.autocast is not None:
            raise ValueError(f"--autocast {self.autocast} and --mixed-precision {self.mixed_precision} both cast the "
                             f"compute: use one of them")
        if self.mixed_precision is not None and self.dtype != "fp32":
            raise ValueError(f"--mixed-precision {self.mixed_precision} keeps fp32 sharded parameters and casts "
                             f"them itself: use --dtype fp32, got --dtype {self.dtype}")
        if not self.sync_every_micro_batch and self.grad_accumulation < 2:
            raise ValueError("--fsdp-sync-last-micro-batch skips the gradient reduction of all micro-batches but "
                             "the last: it needs --grad-accumulation N with N >= 2")
        return FsdpSetup(self.fsdp_world_size, tuple(self.fsdp_wrap) if self.fsdp_wrap else None,
                         self.mixed_precision, self.reshard_after_forward, self.sync_every_micro_batch)

    def parallel_dims(self) -> ParallelDims | None:
        """The job's parallelism (FSDP2, tensor parallel, the pipeline), or None for one unsharded rank without a
        pipeline; ValueError for options that need one it does not have."""
        fsdp = self.fsdp_setup()
        pp = self.pipeline_setup()
        if self.tp_size == 1:
            for flag, given in (("--parallelize", self.parallelize), ("--sequence-parallel", self.sequence_parallel)):
                if given:
                    raise ValueError(f"{flag} applies tensor parallel: it needs --tp-size T (T > 1)")
            return None if fsdp is None and pp is None else ParallelDims(fsdp=fsdp, pp=pp)
        return ParallelDims(fsdp=fsdp, tp_size=self.tp_size, sequence_parallel=self.sequence_parallel,
                            parallelize=self.parallelize, pp=pp)

    def pipeline_setup(self) -> PipelineSetup | None:
        """The pipeline asked for, or None; ValueError for options that need it or contradict it."""
        if self.pp_stages is None:
            for flag, given in (("--pp-split", self.pp_split), ("--microbatches", self.microbatches != 1),
                                ("--pp-virtual-stages", self.pp_virtual_stages != 1)):
                if given:
                    raise ValueError(f"{flag} lays out a pipeline: it needs --pp-stages S")
            return None
        if self.grad_accumulation != 1:
            raise ValueError(f"--grad-accumulation {self.grad_accumulation} with --pp-stages: the pipeline's "
                             f"microbatches are the accumulation; use --microbatches M")
        if self.hf_config is None:
            raise ValueError("--pp-stages cuts a Hugging Face decoder into stages: give --hf-config")
        if self.tp_size != 1 and self.pp_virtual_stages != 1:
            raise ValueError(f"--tp-size with --pp-virtual-stages {self.pp_virtual_stages}: tensor parallel stages "
                             f"are collected for 1f1b and gpipe (one chunk per rank) only")
        for flag, given in (("--fsdp-world-size", self.fsdp_world_size), ("--compile-backend", self.compile_backend),
                            ("--autocast", self.autocast), ("--grad-scaler", self.grad_scaler),
                            ("--max-grad-norm", self.max_grad_norm is not None),
                            ("--attention-mask", self.attention_mask != "none")):
            if given:
                raise ValueError(f"{flag} is not collected with --pp-stages yet")
        auto = self.pp_split == ["auto"]
        if auto and (self.budget_gib is None or self.pp_virtual_stages != 1):
            raise ValueError("--pp-split auto chooses the split under a budget: give --budget-gib B (1f1b or gpipe)"
                             if self.budget_gib is None else "--pp-split auto is for 1f1b and gpipe, got "
                             f"--pp-virtual-stages {self.pp_virtual_stages}")
        if not auto and self.budget_gib is not None:
            raise ValueError(f"--budget-gib {self.budget_gib:g} chooses a split: it needs --pp-split auto")
        return PipelineSetup(self.pp_stages, self.pp_schedule, self.microbatches,
                             tuple(self.pp_split) if self.pp_split and not auto else None, self.pp_virtual_stages)

    def describe(self, target: str) -> str:
        """One line: what is collected, for which target, on what (``target``: the device table's name)."""
        src = self.model or (self.hf_config if isinstance(self.hf_config, str) else "HF config")
        shard = f", one rank of TP x{self.tp_size}" if self.tp_size > 1 else ""
        if self.fsdp_world_size is not None:
            shard = (f", one rank of FSDP2 x{self.fsdp_world_size}{f' x TP x{self.tp_size}' if self.tp_size > 1 else ''}"
                     f"{' bf16 mixed precision' if self.mixed_precision else ''}"
                     f"{', gradients reduced after the last micro-batch' if not self.sync_every_micro_batch else ''}")
        loop = "".join([f", {self.grad_accumulation} micro-batches" if self.grad_accumulation > 1 else "",
                        f", autocast {self.autocast}" if self.autocast else "",
                        ", GradScaler" if self.grad_scaler else "",
                        f", gradients clipped to {self.max_grad_norm:g}" if self.max_grad_norm is not None else "",
                        f", compiled with {self.compile_backend}" if self.compile_backend else "",
                        f", {self.pp_stages} pipeline stages {self.pp_schedule} x {self.microbatches} microbatches"
                        if self.pp_stages else ""])
        return (f"{src} for {target}: batch {self.batch}, seq {self.seq}, {self.dtype}, optimizer {self.optimizer}"
                f"{loop}{shard} (fake tensors on {self.device}: no real memory or compute)")

    def optimizer_arguments(self) -> dict | None:
        """``optimizer_kwargs`` as a dict; ValueError naming the option for text that is not a JSON object."""
        if self.optimizer_kwargs is None or isinstance(self.optimizer_kwargs, dict):
            return self.optimizer_kwargs
        try:
            doc = json.loads(self.optimizer_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--optimizer-kwargs {self.optimizer_kwargs!r} is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"--optimizer-kwargs {self.optimizer_kwargs!r} must be a JSON object of arguments, "
                             f"e.g. '{{\"lr\": 0.01}}'")
        return doc

    def check_loop(self) -> None:
        """ValueError naming the option for a training loop that cannot be collected."""
        if isinstance(self.grad_accumulation, bool) or not isinstance(self.grad_accumulation, int) \
                or self.grad_accumulation < 1:
            raise ValueError(f"--grad-accumulation must be a positive integer, got {self.grad_accumulation!r}")
        if self.autocast is not None and self.dtype != "fp32":
            raise ValueError(f"--autocast {self.autocast} computes in {self.autocast} from fp32 weights: use "
                             f"--dtype fp32, got --dtype {self.dtype}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"--max-grad-norm must be a positive number, got {self.max_grad_norm!r}")


@dataclass
class CollectResult:
    stats: Stats
    parameter_count: int
    baseline_peak_bytes: int
    seconds: float
    target: DeviceSpec
    model_module_count: int  # every module of the model, containers that never run included


def target_spec(req: CollectRequest) -> DeviceSpec:
    """The device the request costs and plans for: ``--target-device``, else the CUDA device or cpu."""
    if req.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda.is_available() is False; use --device cpu "
                           "with --target-device NAME to plan for a GPU from this machine")
    name = req.target_device
    if name is None:
        name = cuda_device_entry(torch.cuda.get_device_name()) if req.device == "cuda" else "cpu"
    return device_spec(name, peak_tflops=req.peak_tflops, mem_bandwidth_gbps=req.mem_bandwidth_gbps,
                       compute_efficiency=req.compute_efficiency, memory_efficiency=req.memory_efficiency,
                       checkpoint_overhead_us_per_op=req.checkpoint_overhead_us_per_op,
                       host_link_gbps=req.host_link_gbps)


def host_link_of(target: DeviceSpec) -> HostLink | None:
    """The stats' ``metadata.host_link_gbps`` for ``target``: its table figures (or ``--host-link-gbps``), or None
    for a target without a host link (cpu, unless given)."""
    if target.host_link_d2h_gbps is None or target.host_link_h2d_gbps is None:
        return None
    return HostLink(d2h=target.host_link_d2h_gbps, h2d=target.host_link_h2d_gbps,
                    source=f"{target.name}: {target.host_link_source}")


def _benchmark_refusal(req: CollectRequest, target: DeviceSpec) -> str | None:
    """Why ``--benchmark`` cannot cost ``target``, or None: it times this machine's kernels, nothing else's."""
    if req.target_device is None:
        return None
    here = "cpu" if req.device == "cpu" else torch.cuda.get_device_name()
    try:
        same = cuda_device_entry(here) == target.name
    except ValueError:  # a GPU the table does not know is no table entry either
        same = False
    if same:
        return None
    return (f"--benchmark times the kernels of the device it runs on ({here}); they say nothing about "
            f"--target-device {req.target_device}: drop --benchmark, or --target-device, or run on that device")


def _build(req: CollectRequest, device: torch.device, progress: Any) -> BuiltModel:
    if progress is None:
        return _build_model(req, device)
    from torch.nn.modules.module import register_module_module_registration_hook

    made = [1]  # the root, which no parent registers

    def counted(*_: Any) -> None:
        made[0] += 1
        progress("building", made[0], 0)

    progress("building", 0, 0)  # shown at once: importing transformers alone takes seconds
    handle = register_module_module_registration_hook(counted)
    try:
        return _build_model(req, device)
    finally:
        handle.remove()


def _build_model(req: CollectRequest, device: torch.device) -> BuiltModel:
    dtype = DTYPES[req.dtype]
    if req.model:
        if req.attention_mask != "none":
            raise ValueError(f"--attention-mask {req.attention_mask} builds the batch of --hf-config; a --model "
                             f"factory returns its own batch (with the attention mask the tokenizer makes)")
        factory = load_factory(req.model)
        return build_from_factory(factory, batch_size=req.batch, seq_len=req.seq, dtype=dtype, device=device)
    if req.hf_config is None:
        raise ValueError("give a model: --model FILE.py:FACTORY or --hf-config CONFIG.json")
    return build_from_hf_config(req.hf_config, batch_size=req.batch, seq_len=req.seq, dtype=dtype, device=device,
                                attention_mask=req.attention_mask)


def _prepare(req: CollectRequest, progress: Any) -> tuple[BuiltModel, DeviceSpec, dict, StatsMetadata]:
    """The model built on meta, the target, collect_stats' arguments (but the model's own) and the metadata."""
    if req.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {req.dtype!r}")
    routing = parse_moe_routing(req.moe_routing)
    req.check_loop()
    optimizer_kwargs = req.optimizer_arguments()
    parallel = req.parallel_dims()  # the pipeline's part is read by run_pipeline_collection
    target = target_spec(req)
    cost = RooflineCostModel(target, allow_tf32=req.allow_tf32)
    if req.benchmark:
        refusal = _benchmark_refusal(req, target)
        if refusal:
            raise ValueError(refusal)
        cost = BenchmarkCostModel(cost, device=req.device)
    # Build on meta: nothing is allocated, whatever the model's size.
    built = _build(req, torch.device("meta"), progress)
    emulate = req.device == "cpu" and target.kind == "cuda"
    meta = StatsMetadata(
        model_name=(req.name or built.name)[:256],
        batch_size=req.batch,
        seq_len=req.seq,
        input_shape=built.input_shape,
        dtype=req.dtype,
        device=req.device,
        target_device=target.name,
        optimizer=None if built.optimizer_fn is not None else req.optimizer,  # optimizer_fn: the class it built
        torch_version=torch.__version__,
        collector_version=COLLECTOR_VERSION,
        tags={"cost_model": "benchmark" if req.benchmark else "roofline",
              "optimizer_step": "foreach" if target.kind == "cuda" else "for-loop", **built.notes},
        host_link_gbps=host_link_of(target),
    )
    kwargs = dict(
        optimizer_kwargs=None if built.optimizer_fn is not None else optimizer_kwargs,
        optimizer_foreach=target.kind == "cuda",  # what PyTorch picks on the target
        device=torch.device(req.device),
        dtype=DTYPES[req.dtype],
        cost_model=cost,
        emulate_cuda_attention=emulate,
        round_bytes_to=CUDA_BLOCK_BYTES if target.kind == "cuda" else 1,
        checkpoint_overhead_us_per_op=target.checkpoint_overhead_us_per_op,
        measure_checkpoint_overhead=req.benchmark,
        moe_routing=routing,
        progress=progress,
    )
    if parallel is not None and (parallel.tp_enabled or parallel.fsdp is not None):  # a step's, or each stage's
        kwargs["parallel"] = dataclasses.replace(parallel, pp=None)
    return built, target, kwargs, meta


def run_collection(req: CollectRequest, *, progress: Any = None) -> CollectResult:
    """Build the requested model and collect its stats (no pipeline: see :func:`run_pipeline_collection`)."""
    if req.pp_stages is not None:
        raise ValueError("--pp-stages collects one stats document per stage: use run_pipeline_collection")
    built, target, kwargs, meta = _prepare(req, progress)
    n_params = sum(p.numel() for p in built.model.parameters())
    t0 = time.perf_counter()
    stats = collect_stats(
        built.model,
        built.inputs,
        loss_fn=built.loss_fn,
        optimizer=built.optimizer_fn or req.optimizer,
        grad_accumulation=req.grad_accumulation,
        autocast=req.autocast,
        grad_scaler=req.grad_scaler,
        max_grad_norm=req.max_grad_norm,
        metadata=meta,
        compile_backend=req.compile_backend,
        **kwargs,
    )
    seconds = time.perf_counter() - t0
    return CollectResult(stats, n_params, baseline_peak_bytes(stats), seconds, target,
                         sum(1 for _ in built.model.modules()))


def run_pipeline_collection(req: CollectRequest, *, progress: Any = None) -> list[CollectResult]:
    """Build the requested decoder, cut it into ``req.pp_stages`` stages and collect every stage's stats."""
    parallel = req.parallel_dims()
    setup = parallel.pp if parallel is not None else None
    if setup is None:
        raise ValueError("run_pipeline_collection needs --pp-stages S")
    built, target, kwargs, meta = _prepare(req, progress)
    t0 = time.perf_counter()
    ids = built.inputs["input_ids"] if isinstance(built.inputs, dict) else built.inputs
    stats = collect_pipeline_stages(built.model, ids, setup, optimizer=req.optimizer,
                                    metadata=meta, **kwargs)
    if req.pp_split == ["auto"]:  # the equal split's per-layer figures choose the split, then it is collected
        choice = choose_pipeline_split(stats, req.budget_gib, world_size=req.world_size)
        if getattr(progress, "note", None):
            progress.note(f"  --pp-split auto: {' '.join(choice.split)} (estimated step {choice.step_ms:.0f} ms, "
                          f"equal split {choice.equal_step_ms or float('nan'):.0f} ms); collecting it")
        setup = PipelineSetup(setup.stages, setup.schedule, setup.microbatches, tuple(choice.split))
        stats = collect_pipeline_stages(built.model, ids, setup, optimizer=req.optimizer, metadata=meta, **kwargs)
    seconds = time.perf_counter() - t0
    out = []
    for s in stats:
        n_params = s.root.param_bytes // max(1, torch.empty((), dtype=DTYPES[req.dtype]).element_size())
        out.append(CollectResult(s, n_params, baseline_peak_bytes(s), seconds / len(stats), target,
                                 len(s.modules)))
    return out
