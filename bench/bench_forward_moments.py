"""A plan's forward moments against a real run: where the memory model's forward is off, and by how much.

For one model of the fidelity set (``bench/fidelity.py``: fp32, CPU, AdamW, batch 4 x 256): collect, plan at a
fraction of the predicted no-checkpointing peak (``--offload on`` with ``--host-link-gbps``, or off), apply the plan
(``apply_plan``), run one real step (``measure_steps``: the optimizer state exists from then on, as in the steady
state the plan predicts), then a second step tracked per forward moment: the most live bytes between two module
finishes, keyed as the collector keys them (how many modules of ``fw_post_order`` have finished), counted as
``measure_steps`` counts (every distinct storage: parameters, buffers, optimizer state, inputs, every storage an
op returns). One markdown row per forward key: the plan's memory there (its timeline), the real one and the
difference; then, per checkpointed module, the bytes of its saved ops' storages that the step without
checkpointing frees inside the module (``storages`` of the stats' ops: not saved for backward, dead before the
module's last op), which SAC keeps from the op on: the most a checkpointed module's own forward can hold beyond
the plain step's forward; the memory model counts what the plan's save list holds there (docs/memory-model.md,
"Forward moments inside a checkpointed module"), so with stats that carry the forward-moment fields every real
forward moment is at most its prediction.

    PYTHONPATH=. python bench/bench_forward_moments.py --model opt --fraction 0.4 --offload on --host-link-gbps 1e6
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

import planner  # noqa: E402
from estimators import apply_plan, call_model, make_optimizer, measure_steps, run_collection  # noqa: E402
from estimators.common import BUFFER, INPUT, OPT, PARAM, StorageBook, tensors_in  # noqa: E402
from estimators.common.training_step import default_loss  # noqa: E402
from estimators.measure import BACKWARD, FORWARD, OPTIMIZER, LiveStorages  # noqa: E402
from fidelity import MODELS, STEP_SEED, build_real  # noqa: E402

REFERENCE = REPO.parent / "shared" / "reference" / "fidelity"


class ForwardKeys:
    """Counts first forward finishes of the modules in ``fw_post_order`` and keeps the most live bytes per count."""

    def __init__(self, model: torch.nn.Module, fw_post_order: list[str]):
        root = type(model).__name__
        self.names = {mod: f"{root}.{n}" if n else root for n, mod in model.named_modules()}
        self.order = set(fw_post_order)
        self.finished: set[str] = set()
        self.most: dict[int, int] = {}
        self.counting = False
        self.handles = [mod.register_forward_hook(self._finished) for mod in model.modules()]

    def _finished(self, mod: torch.nn.Module, *_: object) -> None:
        fqn = self.names[mod]
        if self.counting and fqn in self.order and fqn not in self.finished:
            self.finished.add(fqn)

    def on_alloc(self, _category: str, live: dict[str, int]) -> None:
        if self.counting:
            key, total = len(self.finished), sum(live.values())
            self.most[key] = max(self.most.get(key, 0), total)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def real_forward_moments(model: torch.nn.Module, built, fw_post_order: list[str]) -> dict[int, int]:
    """Forward key -> the most live bytes of step 2 there (step 1 untracked, run by ``measure_steps``)."""
    optimizer = make_optimizer("adamw", list(model.parameters()))
    measure_steps(model, built.inputs, built.loss_fn, optimizer, steps=1, track_memory=False, seed=STEP_SEED)
    book, keys = StorageBook(), ForwardKeys(model, fw_post_order)
    book.add_tensors(model.parameters(), PARAM)
    book.add_tensors(model.buffers(), BUFFER)
    book.add_tensors(tensors_in([list(s.values()) for s in optimizer.state.values()]), OPT)
    book.add_tensors(tensors_in(built.inputs), INPUT)
    tracker = LiveStorages(book)
    book.on_alloc.append(keys.on_alloc)
    torch.manual_seed(STEP_SEED + 1)  # step 2's dropout masks, as measure_steps draws them
    try:
        with tracker:
            tracker.phase, keys.counting = FORWARD, True
            output = call_model(model, built.inputs)
            loss = (built.loss_fn or default_loss)(output)
            del output
            tracker.phase, keys.counting = BACKWARD, False
            loss.backward()
            tracker.phase = OPTIMIZER
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        keys.remove()
    return keys.most


def kept_beyond_plain_bytes(module_stats, save: list[int]) -> int:
    """Bytes of the saved ops' storages the plain step frees inside the module (see the module docstring)."""
    n = len(module_stats.ops or ())
    return sum(nbytes for op, s in zip(module_stats.ops or (), save) if s
               for nbytes, last, saved in op.storages or () if not saved and last < n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="opt")
    ap.add_argument("--fraction", type=float, default=0.4)
    ap.add_argument("--offload", choices=["on", "off"], default="on")
    ap.add_argument("--host-link-gbps", type=float, default=1e6)
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = next(s for s in MODELS if s.name == args.model)
    stats = run_collection(spec.request(args.reference)).stats
    baseline = planner.plan(stats, 1024.0).baseline_peak_bytes
    options = {"offload": "on", "host_link_gbps": args.host_link_gbps} if args.offload == "on" else {}
    p = planner.plan(stats, args.fraction * baseline / planner.GIB, **options)
    if p.status not in ("optimal", "feasible"):
        raise SystemExit(f"{args.model} at {args.fraction:.0%}: {p.status} ({p.message})")
    built = build_real(spec, args.reference)
    real = real_forward_moments(apply_plan(copy.deepcopy(built.model), p, stats=stats), built, stats.fw_post_order)
    model = planner.memory_model(stats)
    budget = int(p.memory_budget_gib * planner.GIB)
    print(f"{args.model} at {args.fraction:.0%}, offload {args.offload}: budget {budget}, plan peak {p.peak_bytes} "
          f"({p.peak_at}); real forward peak {max(real.values())}")
    print("| forward key | module | predicted | real | real - predicted |")
    print("|---|---|---|---|---|")
    for key, moment in zip(model.keys, p.timeline):
        if moment.phase == "forward" and int(key) in real:
            predicted = moment.planned_bytes if moment.planned_bytes is not None else moment.baseline_bytes
            print(f"| {key} | {moment.module} | {predicted} | {real[int(key)]} | {real[int(key)] - predicted:+d} |")
    print("\n| checkpointed module | saved bytes | of them freed inside it by the plain step |")
    print("|---|---|---|")
    for m in p.modules:
        print(f"| {m.fqn} | {m.saved_bytes} | {kept_beyond_plain_bytes(stats.module(m.fqn), m.save)} |")


if __name__ == "__main__":
    main()
