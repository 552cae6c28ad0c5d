"""Turning what the collector saw into a stats v1 document."""

from __future__ import annotations

from typing import Any

from torch import nn

from estimators.tracking import GRAD, StorageBook, storages_of
from planner.stats import ModuleStats, OpStats, Stats, StatsMetadata

__all__ = ["build_stats"]


def build_stats(model: nn.Module, mods: dict, col: Any, hooks: Any, opt_bytes: dict[int, int], book: StorageBook,
                metadata: StatsMetadata | None) -> Stats:
    """The stats of one collected step: modules in forward pre-order, op lists of non-leaf modules."""
    by_fqn = {m.fqn: (mod, m) for mod, m in mods.items()}
    # Only modules that ran in forward are in the stats; parents fall back to the nearest that ran.
    ran = set(hooks.post_order)
    modules = []
    for fqn in hooks.pre_order:
        mod, m = by_fqn[fqn]
        parent = m.parent
        while parent is not None and parent not in ran:
            parent = by_fqn[parent][1].parent
        pbytes, obytes = _param_bytes(mod, book, opt_bytes)
        grad_total = m.grad_total
        if grad_total is None:  # backward never reached this module: take its parent's figure
            p = parent
            while p is not None and by_fqn[p][1].grad_total is None:
                p = by_fqn[p][1].parent
            grad_total = by_fqn[p][1].grad_total if p is not None else book.live[GRAD]
        ops = None if m.is_leaf else _op_stats(m, col)
        modules.append(
            ModuleStats(
                fqn=fqn,
                parent=parent,
                is_leaf=m.is_leaf,
                param_bytes=pbytes,
                grad_bytes=_grad_bytes(mod, book),
                act_saved_bytes=max(0, m.act_after - m.act_before - m.output_bytes),
                act_total_bytes=m.act_after,
                act_grad_bytes=max(0, m.temp_peak - m.temp_start),
                act_bw_bytes=m.act_at_peak,
                grad_total_bytes=grad_total or 0,
                input_bytes=m.input_bytes,
                output_bytes=m.output_bytes,
                optimizer_state_bytes=obytes,
                fw_ms=m.fw_ms,
                bw_ms=m.bw_ms,
                ops=ops,
            )
        )
    return Stats(
        metadata=metadata or StatsMetadata(model_name=type(model).__name__),
        fw_pre_order=hooks.pre_order,
        fw_post_order=hooks.post_order,
        modules=modules,
    )


def _param_bytes(mod: nn.Module, book: StorageBook, opt_bytes: dict[int, int]) -> tuple[int, int]:
    params = list(mod.parameters())
    pbytes = sum(book.nbytes(s) for s in storages_of(params))
    return pbytes, sum(opt_bytes.get(id(p), 0) for p in {id(p): p for p in params}.values())


def _grad_bytes(mod: nn.Module, book: StorageBook) -> int:
    return sum(book.nbytes(s) for s in storages_of([p for p in mod.parameters() if p.requires_grad]))


def _op_stats(m: Any, col: Any) -> list[OpStats]:
    ops = [col.ops[i] for i in m.ops]
    out: list[OpStats] = []
    for k, op in enumerate(ops):
        parent = None
        if op.inplace:
            parent = k
            if op.mutated_serial is not None:
                for j in range(k):
                    if op.mutated_serial in ops[j].out_serials:
                        parent = j
                        break
        out.append(
            OpStats(
                name=op.name,
                runtime_ms=op.runtime_ms,
                output_bytes=op.output_bytes,
                view_like=op.view_like,
                random=op.random,
                inplace_parent=parent,
                saved_by_autograd=bool(op.out_serials) and op.out_serials <= col.saved,
            )
        )
    # PyTorch's SACEstimator zeroes the last op that is neither view-like nor
    # in-place: the block output is kept anyway. That holds only when autograd
    # does keep it (a decoder layer's output, saved by the next layer's norm);
    # a feed-forward whose output only feeds a residual add does not keep it,
    # and caching it under SAC costs its bytes. So: zero it only when saved.
    for k in range(len(out) - 1, -1, -1):
        if not out[k].view_like and out[k].inplace_parent is None:
            if out[k].saved_by_autograd:
                out[k].output_bytes = 0
            break
    return out
