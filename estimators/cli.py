"""``sacplan collect``: build a model, collect its stats under fake tensors, write and upload them.

Nothing here imports torch at module level, so ``sacplan --help`` works
without it; the handler imports the collector when it runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["register", "upload_stats", "UploadError"]

_DTYPES = ("fp32", "bf16", "fp16")
_OPTIMIZERS = ("adamw", "adam", "sgd", "none")


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
    p.add_argument("--batch", type=_positive, default=1, help="batch size (default 1)")
    p.add_argument("--seq", type=_positive, default=512, help="sequence length (default 512)")
    p.add_argument("--dtype", choices=_DTYPES, default="fp32", help="parameter/activation dtype (default fp32)")
    p.add_argument("--optimizer", choices=_OPTIMIZERS, default="adamw", help="optimizer of the step (default adamw)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="device the fake tensors live on (default cpu; no real memory is used)")
    p.add_argument("--target-device", metavar="NAME",
                   help="device to cost and emulate: A100-40GB, A100-80GB, H100-SXM, H100-PCIe, H200, L40S, "
                   "MI300X or cpu (case-insensitive; default: the CUDA device's name with --device cuda, else cpu)")
    p.add_argument("--peak-tflops", type=float, help="override the target's peak TFLOP/s (every dtype)")
    p.add_argument("--mem-bandwidth-gbps", type=float, help="override the target's memory bandwidth in GB/s")
    p.add_argument("--compute-efficiency", type=float, help="fraction of peak FLOP/s reached (default 1.0)")
    p.add_argument("--memory-efficiency", type=float, help="fraction of peak bandwidth reached (default 1.0)")
    p.add_argument("--allow-tf32", action="store_true", help="cost fp32 matmuls at the TF32 rate")
    p.add_argument("--benchmark", action="store_true",
                   help="time real kernels on the collection device (--device, CPU or CUDA) instead of the roofline, "
                   "and measure each module's checkpoint overhead there; refused with another --target-device")
    p.add_argument("--checkpoint-overhead-us-per-op", type=_non_negative, metavar="US",
                   help="checkpoint overhead per op in microseconds, beyond recomputing it (default: the target's "
                   "table figure; with --benchmark only for modules that cannot be measured)")
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


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of microseconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text!r}")
    return value


class _Progress:
    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.last = 0.0

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if self.quiet or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        print(f"\r  {phase:<9} {done:>5}/{total} modules", end="", file=sys.stderr, flush=True)

    def done(self, text: str) -> None:
        if not self.quiet:
            print(f"\r  {text:<40}", file=sys.stderr, flush=True)


def run_collect(args: argparse.Namespace) -> int:
    """Handler of ``sacplan collect``: exit 0, or 1 on any error, as ``plan`` on bad input (its 2 means infeasible)."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        print("error: sacplan collect needs torch: pip install 'sacplan[collector]'", file=sys.stderr)
        return 1
    from estimators.session import CollectRequest, run_collection

    try:
        request = CollectRequest.from_args(args)
        progress = _Progress(args.quiet)
        if not args.quiet:
            print(f"collecting {request.describe()}", file=sys.stderr)
        result = run_collection(request, progress=progress)
    except (ValueError, RuntimeError, ImportError) as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 1
    progress.done(f"collected in {result.seconds:.1f} s")
    out = Path(args.out)
    out.write_text(json.dumps(result.stats.model_dump(mode="json"), indent=1))
    print(_summary(result, out))
    if args.upload:
        try:
            reply = upload_stats(args.upload, result.stats.model_dump(mode="json"), api_key=args.api_key)
        except UploadError as exc:
            print(f"error: upload failed: {exc} (the stats are in {out})", file=sys.stderr)
            return 1
        base = args.upload.rstrip("/")
        print(f"uploaded: stats id {reply.get('id')}  ({base}/v1/stats/{reply.get('id')}; Swagger UI: {base}/docs)")
    return 0


def _summary(result: Any, out: Path) -> str:
    from estimators.assemble import LEFT_OUT_TAG  # torch is loaded by now

    s = result.stats
    left_out = s.metadata.tags.get(LEFT_OUT_TAG)
    rows = [
        ("model", s.metadata.model_name),
        ("modules", f"{len(s.modules)} ({sum(m.ops is not None for m in s.modules)} with op lists)"),
        ("parameters", f"{result.parameter_count:,} ({_size(s.root.param_bytes)})"),
        ("activations at forward end", _size(s.root.act_total_bytes)),
        ("baseline peak", f"{_size(result.baseline_peak_bytes)} (no checkpointing, world size 1)"),
        ("step time", f"{s.root.fw_ms + s.root.bw_ms:.2f} ms (fw {s.root.fw_ms:.2f} + bw {s.root.bw_ms:.2f}) "
         f"on {s.metadata.target_device}"),
        ("optimizer state", f"{_size(s.root.optimizer_state_bytes)} ({s.metadata.optimizer})"),
        ("model settings", (", ".join(f"{k}={v}" for k, v in sorted(s.metadata.model_settings.items())) or "none")
         + (f" (attention: {s.metadata.tags['attention']})" if "attention" in s.metadata.tags else "")),
        ("emulated kernels", s.metadata.tags.get("attention_kernels", "none")),
        ("checkpoint overhead", s.metadata.tags.get("checkpoint_overhead", "not known")),
        ("left out", f"{left_out}; never checkpointed on their own, their ops count in the modules they ran "
         f"inside" if left_out else "none"),
        ("written to", str(out)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


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
