"""``sacplan collect --pp-stages S``: the pipeline options, and every stage collected and written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["add_pipeline_options", "stage_paths", "collect_stages"]


def add_pipeline_options(p: Any, positive: Any) -> None:
    """The ``pipeline parallel`` option group of ``sacplan collect``."""
    pp = p.add_argument_group("pipeline parallel", "collect every stage of a pipeline (torch.distributed.pipelining"
                              "), one stats file per stage")
    pp.add_argument("--pp-stages", type=positive, metavar="S",
                    help="cut the --hf-config decoder into S stages (embedding with the first, final norm and head "
                    "with the last) and collect each: --out s.json writes s.stage0.json ... s.stage{S-1}.json")
    pp.add_argument("--pp-schedule", choices=("gpipe", "1f1b", "interleaved-1f1b"), default="1f1b",
                    help="the pipeline schedule the stages run (default 1f1b; interleaved-1f1b: one stats file per rank, "
                    "its --pp-virtual-stages chunks in it)")
    pp.add_argument("--microbatches", type=positive, default=1, metavar="M",
                    help="microbatches per optimizer step; --batch is per microbatch (default 1)")
    pp.add_argument("--pp-split", action="append", metavar="FQN",
                    help="where a stage starts, a decoder layer of the whole model (model.layers.N), repeatable: "
                    "S - 1 of them, S x V - 1 for interleaved-1f1b (default: equal layer counts); auto: chosen "
                    "with the per-stage plans to least predicted step under --budget-gib (the equal split is "
                    "collected first for its per-layer figures, then the chosen one)")
    pp.add_argument("--budget-gib", type=float, metavar="B", help="--pp-split auto: the device budget per stage")
    pp.add_argument("--world-size", type=positive, default=1, metavar="N",
                    help="--pp-split auto: ranks sharing each stage's parameters, gradients and optimizer state "
                    "(the planner's --world-size; default 1)")
    pp.add_argument("--pp-virtual-stages", type=positive, default=1, metavar="V",
                    help="model chunks per rank, interleaved-1f1b only (default 1)")


def stage_paths(out: str, stages: int) -> list[Path]:
    """``s.json`` -> ``s.stage0.json``, ``s.stage1.json``, ..."""
    path = Path(out)
    suffix = path.suffix or ".json"
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return [path.with_name(f"{stem}.stage{k}{suffix}") for k in range(stages)]


def collect_stages(request: Any, out: str, progress: Any) -> str:
    """Collect every stage, write one file each; the lines to print (ValueError/RuntimeError as collect's)."""
    from estimators.cli.summary import size_text
    from estimators.collect import run_pipeline_collection

    results = run_pipeline_collection(request, progress=progress)
    paths = stage_paths(out, len(results))
    lines = []
    for result, path in zip(results, paths):
        s = result.stats
        path.write_text(json.dumps(s.model_dump(mode="json"), indent=1))
        info = s.metadata.pipeline
        layers = sorted({f.split(".layers.")[1].split(".")[0] for f in s.fw_pre_order if ".layers." in f}, key=int)
        lines.append(f"stage {info.stage}: layers {','.join(layers) or '-'}, parameters "
                     f"{size_text(s.root.param_bytes)}, one microbatch holds {size_text(info.held_bytes)}, "
                     f"baseline peak {size_text(result.baseline_peak_bytes)} -> {path}")
    first = results[0].stats.metadata.pipeline
    lines.append(f"{first.stages} stages, {first.schedule}, {first.microbatches} microbatches; next: sacplan plan "
                 f"{' '.join(str(p) for p in paths)} --budget-gib B")
    return "\n".join(lines)
