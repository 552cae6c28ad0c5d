"""``sacplan collect``: build a model, collect its stats under fake tensors, write and upload them.

Nothing here imports torch at module level, so ``sacplan --help`` works
without it; the handler imports the collector when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from estimators.cli.pipeline_cli import add_pipeline_options, collect_stages

__all__ = ["register", "upload_stats", "UploadError"]

_DTYPES = ("fp32", "bf16", "fp16")
_OPTIMIZER_HELP = ("optimizer of the step: adamw (torch.optim.AdamW), adam (torch.optim.Adam), sgd "
                   "(torch.optim.SGD: no momentum unless --optimizer-kwargs says so), none (no optimizer step), "
                   "or any importable class's dotted path, e.g. torch.optim.Adagrad or "
                   "transformers.optimization.Adafactor; each at torch's defaults (default adamw)")


def register(subparsers: Any) -> None:
    """Add the ``collect`` subcommand."""
    p = subparsers.add_parser(
        "collect",
        help="collect SAC stats of one training step under fake tensors",
        description="Run one training step (forward, backward, optimizer step) of a model under "
        "FakeTensorMode and write stats v1: per-module memory, per-op SAC stats, roofline runtimes.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="FILE.py:FACTORY",
                     help="a function returning (model, inputs) or (model, inputs, loss_fn); see the README")
    src.add_argument("--hf-config", metavar="CONFIG.json",
                     help="a Hugging Face config file: AutoModelForCausalLM.from_config, random weights, on meta")
    p.add_argument("--attention-mask", metavar="MASK", default="none",
                   help="with --hf-config, the batch's attention mask as a tokenizer makes it: none (no mask), ones "
                   "(all ones: no padding) or padded:F (the last F of each row's tokens are padding, 0 < F < 1); "
                   "model code that branches on the mask follows it (default none)")
    p.add_argument("--batch", type=_positive, default=1, help="batch size (default 1)")
    p.add_argument("--seq", type=_positive, default=512, help="sequence length (default 512)")
    p.add_argument("--dtype", choices=_DTYPES, default="fp32", help="parameter/activation dtype (default fp32)")
    p.add_argument("--optimizer", metavar="NAME|CLASS", default="adamw", help=_OPTIMIZER_HELP)
    p.add_argument("--optimizer-kwargs", metavar="JSON", help="the optimizer's arguments as a JSON object, e.g. "
                   "'{\"momentum\": 0.9}' or '{\"amsgrad\": true}'; recorded in the stats")
    loop = p.add_argument_group("training loop", "the loop around the model, as your training runs it")
    loop.add_argument("--grad-accumulation", type=_positive, default=1, metavar="N",
                      help="micro-batches per optimizer step (--batch is per micro-batch): the stats cover all of "
                      "them and the optimizer step; a checkpointed module recomputes in each (default 1)")
    loop.add_argument("--autocast", choices=("bf16", "fp16"),
                      help="run forward and loss under torch.autocast in this dtype, weights in --dtype fp32 "
                      "(HF Trainer's bf16=True / fp16=True); not with --mixed-precision")
    loop.add_argument("--grad-scaler", action="store_true",
                      help="scale the loss with torch.amp.GradScaler (fp16 training): its unscale and step are "
                      "part of the step")
    loop.add_argument("--max-grad-norm", type=_positive_float, metavar="X",
                      help="clip gradients to this norm before the optimizer step (HF Trainer's default is 1.0)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="device the fake tensors live on (default cpu; no real memory is used)")
    p.add_argument("--target-device", metavar="NAME",
                   help="device to cost and emulate: A100-40GB, A100-80GB, H100-SXM, H100-PCIe, H200, GH200, L40S, "
                   "MI300X or cpu, exactly (case-insensitive; h100 is refused, not guessed; default: the CUDA device with "
                   "--device cuda, else cpu)")
    p.add_argument("--peak-tflops", type=float, help="override the target's peak TFLOP/s (every dtype)")
    p.add_argument("--mem-bandwidth-gbps", type=float, help="override the target's memory bandwidth in GB/s")
    p.add_argument("--compute-efficiency", type=float, help="fraction of peak FLOP/s reached (default 1.0)")
    p.add_argument("--memory-efficiency", type=float, help="fraction of peak bandwidth reached (default 1.0)")
    p.add_argument("--host-link-gbps", type=_positive_float, metavar="GBPS",
                   help="the target's host link in GB/s per direction, both directions (default: the device "
                   "table's effective figure; none for cpu): what plans that offload activations copy over")
    p.add_argument("--allow-tf32", action="store_true", help="cost fp32 matmuls at the TF32 rate")
    p.add_argument("--benchmark", action="store_true",
                   help="time real kernels on the collection device (--device, CPU or CUDA) instead of the roofline, "
                   "and measure each module's checkpoint overhead there; refused with another --target-device")
    p.add_argument("--checkpoint-overhead-us-per-op", type=_non_negative, metavar="US",
                   help="checkpoint overhead per op in microseconds, beyond recomputing it (default: the target's "
                   "table figure; with --benchmark only for modules that cannot be measured)")
    p.add_argument("--moe-routing", metavar="ROUTING", default="balanced",
                   help="routing assumed for mixture-of-experts layers, whose shapes depend on it: balanced (each "
                   "expert gets tokens x top-k / experts), capacity:C (the busiest expert gets C times that, C >= 1) "
                   "or worst (the busiest expert gets every token); recorded in the stats (default balanced)")
    fsdp = p.add_argument_group("FSDP2", "collect one rank of an FSDP2 (fully_shard) job under a fake process group")
    fsdp.add_argument("--fsdp-world-size", type=_positive, metavar="N",
                      help="shard the step over N ranks with fully_shard: the stats are one rank's (sharded "
                      "parameters, gradients, optimizer state, gathered units and collective buffers)")
    fsdp.add_argument("--fsdp-wrap", action="append", metavar="CLASS",
                      help="class of the modules to shard as units, repeatable (the root is always one; default: "
                      "a Hugging Face model's _no_split_modules, e.g. LlamaDecoderLayer; a --model factory's "
                      "model may name its classes in a _no_split_modules attribute)")
    fsdp.add_argument("--mixed-precision", choices=("bf16",),
                      help="bf16: fp32 sharded parameters, bf16 gathered compute parameters, fp32 gradient "
                      "reduction (torchtitan's default); needs --dtype fp32")
    fsdp.add_argument("--no-reshard-after-forward", dest="reshard_after_forward", action="store_false",
                      help="keep each unit's gathered parameters from its forward to its backward")
    fsdp.add_argument("--fsdp-sync-last-micro-batch", dest="sync_every_micro_batch", action="store_false",
                      help="with --grad-accumulation: reduce the gradients after the last micro-batch only "
                      "(set_requires_gradient_sync(False) before the others: each unit keeps its unsharded "
                      "gradients until then; default: after every micro-batch, FSDP2's default)")
    tp = p.add_argument_group("tensor parallel", "collect one rank of a tensor-parallel job (FSDP2 over it with "
                              "--fsdp-world-size) under a fake process group: see docs/tensor-parallel.md")
    tp.add_argument("--tp-size", type=_positive, default=1, metavar="T",
                    help="ranks of one tensor-parallel group: the stats are one TP rank's (its parameter shards, "
                    "activations and collectives); with --fsdp-world-size D the mesh is D x T (default 1: none)")
    tp.add_argument("--parallelize", metavar="FILE.py:FN",
                    help="your function applying tensor parallel, called as FN(model, tp_mesh) (torchtitan's "
                    "way); default: the model's Hugging Face plan (base_model_tp_plan)")
    tp.add_argument("--sequence-parallel", action="store_true",
                    help="norms and dropout on sequence shards: with the HF plan, derived from it (the residual stream "
                    "on sequence shards, see docs/tensor-parallel.md); with --parallelize, say that your function "
                    "applies it (recorded in the stats)")
    p.add_argument("--compile-backend", choices=("aot_eager", "inductor"),
                   help="collect the step as torch.compile(model, backend=...) runs it (the model compiled whole, "
                   "the loss inside it or after it); recorded in the stats' model settings, and apply_plan then "
                   "wants the same compile_backend (see docs/apply.md, Memory under compile)")
    add_pipeline_options(p, _positive)
    p.add_argument("--name", help="model name in the stats (default: the model's class or config)")
    p.add_argument("--out", default="stats.json", help="output file (default stats.json)")
    p.add_argument("--upload", metavar="URL", help="also POST the stats to a sacplan service at URL")
    p.add_argument("--api-key", help="API key for --upload (sent as 'Authorization: Bearer KEY')")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(handler=run_collect)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text!r}")
    return value


TORCH_HINT = ("error: sacplan collect needs torch, which is not installed. On a machine without a GPU, a CPU "
              "build: pip install torch --index-url https://download.pytorch.org/whl/cpu (add transformers for "
              "--hf-config); on a GPU node bring your own torch (any build >= 2.5), then pip install "
              "'sacplan[collector]' installs nothing more")


def run_collect(args: argparse.Namespace) -> int:
    """Handler of ``sacplan collect``: exit 0, or 1 on any error, as ``plan`` on bad input (its 2 means infeasible)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        print(TORCH_HINT, file=sys.stderr)
        return 1
    from estimators.cli.guide import guide
    from estimators.cli.progress import CollectProgress
    from estimators.cli.summary import collect_summary
    from estimators.collect import explain_step_error
    from estimators.collect.session import CollectRequest, run_collection, target_spec

    progress = CollectProgress(quiet=args.quiet)
    try:
        request = CollectRequest.from_args(args)
        target = target_spec(request)
        progress.note(f"collecting {request.describe(target.name)}")
        if request.pp_stages is not None:
            text = collect_stages(request, args.out, progress)
            progress.close()
            print(text)
            return 0
        result = run_collection(request, progress=progress)
    except (ValueError, RuntimeError, ImportError) as exc:
        progress.close()
        # an op's error inside the model (shapes that do not fit) names the module and the config's fields
        print(f"error: {isinstance(exc, RuntimeError) and explain_step_error(exc) or exc}", file=sys.stderr)
        return 1
    progress.note(f"  collected in {result.seconds:.1f} s; planning a few budgets")
    out = Path(args.out)
    out.write_text(json.dumps(result.stats.model_dump(mode="json"), indent=1))
    try:
        guidance = guide(result.stats, args.out, target.name, target.memory_bytes)
    except (ValueError, RuntimeError) as exc:  # the stats are written: say why there is no advice, and go on
        progress.note(f"note: no budgets suggested: planning failed: {exc}")
        guidance = None
    progress.close()
    print(collect_summary(result, str(out), guidance))
    if args.upload:
        try:
            reply = upload_stats(args.upload, result.stats.model_dump(mode="json"), api_key=args.api_key)
        except UploadError as exc:
            print(f"error: upload failed: {exc} (the stats are in {out})", file=sys.stderr)
            return 1
        base = args.upload.rstrip("/")
        print(f"uploaded: stats id {reply.get('id')}  ({base}/v1/stats/{reply.get('id')}; Swagger UI: {base}/docs)")
    return 0


class UploadError(Exception):
    """The service could not be reached or refused the stats."""


def upload_stats(url: str, document: dict, *, api_key: str | None = None, timeout_s: float = 60.0) -> dict:
    """POST a stats document to ``<url>/v1/stats``; return the service's JSON reply."""
    if not url.startswith(("http://", "https://")):
        raise UploadError(f"--upload URL must start with http:// or https://, got {url!r}")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/stats", data=json.dumps(document).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        raise UploadError(f"the service answered {exc.code}: {_error_text(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UploadError(f"cannot reach {url}: {reason}") from None
    try:
        reply = json.loads(body)
    except json.JSONDecodeError:
        raise UploadError(f"the service at {url} did not answer JSON") from None
    if not isinstance(reply, dict) or "id" not in reply:
        raise UploadError(f"the service at {url} answered without a stats id: {str(reply)[:200]}")
    return reply


def _error_text(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:300].decode(errors="replace") or "(no body)"
    if isinstance(doc, dict):
        for key in ("message", "detail", "error"):
            if key in doc:
                return str(doc[key])[:500]
    return str(doc)[:300]
