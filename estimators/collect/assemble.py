"""Turning what the collector saw into a stats v1 document."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from torch import nn

from estimators.common import GRAD, StorageBook, storages_of
from planner import ModuleStats, OpStats, Stats, StatsMetadata

__all__ = ["build_stats", "modules_out_of_place", "LEFT_OUT_TAG"]

# metadata tag listing the modules left out of the stats because they ran out of place
LEFT_OUT_TAG = "modules_left_out"


def build_stats(model: nn.Module, mods: dict, col: Any, hooks: Any, opt_bytes: dict[int, int], book: StorageBook,
                metadata: StatsMetadata | None) -> Stats:
    """The stats of one collected step: modules in forward pre-order, op lists of non-leaf modules."""
    by_fqn = {m.fqn: (mod, m) for mod, m in mods.items()}
    left_out = modules_out_of_place(hooks.pre_order, by_fqn)
    pre_order = [f for f in hooks.pre_order if f not in left_out]
    # Only modules that ran in forward (and in place) are in the stats; parents fall back to the nearest kept.
    ran = set(hooks.post_order) - left_out.keys()
    held_of = {fqn: _held_inputs(by_fqn[fqn][1], col) for fqn in pre_order}
    held_serials = {serial for held in held_of.values() for serial, _ in held}
    per_call = _described_per_call(pre_order, by_fqn, hooks)
    post_order = [f for f in hooks.post_order if f not in left_out]
    fw_keys = col.timeline.forward_keys(post_order)
    modules = []
    for fqn in pre_order:
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
        ops = None if m.is_leaf else _op_stats(m, col, held_serials, fw_keys)
        held = held_of[fqn]
        modules.append(
            ModuleStats(
                fqn=fqn,
                parent=parent,
                is_leaf=m.is_leaf,
                param_bytes=pbytes,
                grad_bytes=_grad_bytes(mod, book),
                act_saved_bytes=max(0, m.act_after - m.act_before - m.output_bytes - _cached_cast_bytes(m, col)),
                act_total_bytes=m.act_after,
                act_grad_bytes=max(0, m.temp_peak - m.temp_start),
                act_bw_bytes=m.act_at_peak,
                grad_total_bytes=grad_total or 0,
                input_bytes=m.input_bytes,
                held_input_bytes=sum(b for _, b in held),
                held_inputs=held,
                output_bytes=m.output_bytes,
                optimizer_state_bytes=obytes,
                fw_ms=m.fw_ms,
                bw_ms=m.bw_ms,
                recompute_op_count=None if ops is None else m.recompute_stop,
                calls=max(1, m.calls),
                chained_calls=_chained_calls(m, col) if fqn in per_call else None,
                recompute_key=_recompute_key(m, col, post_order) if ops else None,
                ops=ops,
            )
        )
    metadata = (metadata or StatsMetadata(model_name=type(model).__name__)).model_copy(deep=True)
    if left_out:
        metadata.tags[LEFT_OUT_TAG] = "; ".join(f"{f} ({why})" for f, why in left_out.items())[:1024]
    moments = col.timeline.moments(post_order, per_call)
    for module in modules:
        module.recompute_headroom_bytes = _recompute_headroom(module, col, moments)
    try:
        return Stats(metadata=metadata, fw_pre_order=pre_order, fw_post_order=post_order, modules=modules,
                     timeline=moments)
    except ValidationError as exc:  # a ValueError too, but its text is a dump of the whole document
        msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"the collected stats are not valid stats v1: {msg}. This is a collector bug: "
                         f"please report it with the model") from None


def modules_out_of_place(pre_order: list[str], by_fqn: dict) -> dict[str, str]:
    """Modules whose first forward call does not nest as their fqns do, each with the reason.

    Stats v1 reads nesting off the fqns. A module run from outside one of its
    fqn-ancestors (LLaVA's ``get_input_embeddings()``) or inside a module that
    is not one (a T5 ``shared`` embedding run by the encoder, a child running
    its parent's other child) has no place in the orders, so it is left out,
    with its submodules placed likewise. Nothing is lost to the modules it ran
    inside: their op lists and activation bytes were measured at run time and
    hold its ops, exactly what checkpointing them recomputes.
    """
    ran = set(pre_order)
    reasons: dict[str, str] = {}
    for fqn in pre_order:
        inside = by_fqn[fqn][1].ran_inside
        cuts = [k for k, c in enumerate(fqn) if c == "."]
        outside = [fqn[:k] for k in reversed(cuts) if fqn[:k] in ran and fqn[:k] not in inside]
        stranger = [a for a in reversed(inside) if not fqn.startswith(a + ".")]
        if outside:
            reasons[fqn] = f"ran outside {outside[0]}"
        elif stranger:
            reasons[fqn] = f"ran inside {stranger[0]}"
    return reasons


def _described_per_call(pre_order: list[str], by_fqn: dict, hooks: Any) -> set[str]:
    """Non-leaf modules called more than once whose later calls save what the first does: the timeline counts
    each of their calls (the others keep the first call's description alone: see docs/memory-model.md)."""
    return {f for f in pre_order if by_fqn[f][1].calls > 1 and not by_fqn[f][1].is_leaf
            and f not in hooks.repeats.differ}


def _held_inputs(m: Any, col: Any) -> list[tuple[int, int]]:
    """(storage serial, bytes) of the inputs checkpointing would keep until the module's backward that no op saves
    (the plain step frees them).

    torch.utils.checkpoint holds a checkpointed module's inputs to recompute
    from; an input some op saves for backward is kept anyway, so only the
    others cost extra (a MultiheadAttention's input, only copied inside it).
    The serial names the storage, so an input several modules take (an
    attention mask) is known to be one tensor.

    So is a collective past the module's early stop (a row-wise layer's
    all-reduce ends a tensor-parallel block): it is always saved (must_save),
    and SAC caches it in the forward but the recompute, stopping before it,
    never takes it back, so it lives through the module's backward where the
    plain step freed it (the tiny llama at TP x2, its last layer checkpointed:
    one 16 KiB all-reduce output over the predicted peak). Its op then costs
    nothing to save (``_op_stats``): the held bytes are its cost, in the
    forward (they offset the discard) and in the backward.
    """
    if m.is_leaf:
        return []
    past_stop = [(serial, nbytes) for i in m.ops[m.recompute_stop:] if col.ops[i].must_save
                 for serial, nbytes in col.ops[i].new_storages if serial not in col.saved]
    return [(serial, nbytes) for serial, nbytes in m.activation_inputs if serial not in col.saved] + past_stop


def _recompute_key(m: Any, col: Any, post_order: list[str]) -> int | None:
    """The key of the backward moment where the backward first unpacks a tensor ``m``'s forward saved (where a
    recompute of ``m`` runs); None if it never does (nothing saved, or backward never reached it)."""
    position = col.life.first_unpack.get(m.fqn)
    return None if position is None else col.timeline.backward_key(position[:2], post_order)


def _recompute_headroom(module: ModuleStats, col: Any, moments: list[dict]) -> int | None:
    """How far below its moment's most live memory the instant of ``module``'s recompute lies (the moment holds
    the backward's later instants too: SDPA's own backward temporaries), so that only a recompute holding more
    than that goes above the moment."""
    if module.recompute_key is None:
        return None
    micro_batch, _, live = col.life.first_unpack[module.fqn]
    most = max((m["activation_bytes"] + m["grad_bytes"] + m["optimizer_bytes"] for m in moments
                if m["phase"] == "backward" and m["key"] == module.recompute_key and m["micro_batch"] == micro_batch),
               default=live)
    return max(0, most - live)


def _cached_cast_bytes(m: Any, col: Any) -> int:
    """Bytes of autocast's parameter casts made in the module: its cache holds them through the forward, so no plan
    frees them (see :func:`estimators.collect.step_loop.is_cached_cast`)."""
    return sum(col.ops[i].output_bytes for i in m.ops if col.ops[i].cached_cast)


def _param_bytes(mod: nn.Module, book: StorageBook, opt_bytes: dict[int, int]) -> tuple[int, int]:
    params = list(mod.parameters())
    pbytes = sum(book.nbytes(s) for s in storages_of(params))
    return pbytes, sum(opt_bytes.get(id(p), 0) for p in {id(p): p for p in params}.values())


def _grad_bytes(mod: nn.Module, book: StorageBook) -> int:
    return sum(book.nbytes(s) for s in storages_of([p for p in mod.parameters() if p.requires_grad]))


def _alias_parent(ops: list[Any], k: int) -> int | None:
    """The earlier op of the module whose new storage op k returns again, if any (else None).

    An op that is neither a view nor in-place may still hand back an existing
    storage: ``_unsafe_view`` (the ``mm`` of a linear on a 3-D input, a clone
    made contiguous) aliases its input without autograd's view tracking. Its
    bytes are that op's: saving both keeps one allocation, so the two share
    one decision, as an in-place op shares its parent's (twice_mlp: a cloned
    attention input saved with its ``_unsafe_view`` was counted twice, 512 KiB
    over the real peak).
    """
    op = ops[k]
    if op.view_like or op.inplace or op.fresh or len(op.out_serials) != 1:
        return None
    (serial,) = op.out_serials
    for j in range(k):
        if serial in ops[j].out_serials:
            return j if ops[j].fresh and not ops[j].view_like and not ops[j].inplace else None
    return None


def _chained_calls(m: Any, col: Any) -> tuple[int, int] | None:
    """(op index, bytes) when every later call of ``m`` takes, as an input checkpointing holds, the tensor that op
    made in the call before (a layer applied in a chain, ``x = layer(x)``); else None.

    Checkpointed, call k's saved op and call k+1's held input are then one
    tensor (shared_encoder at 50% saving its last norm: three 512 KiB tensors
    counted twice, real/predicted 0.97).
    """
    prev, link = m.out_serials, None
    for inputs, outputs in m.later_calls:
        chained = [(s, b) for s, b in inputs.items() if s in prev and s not in col.saved]
        if len(chained) != 1 or (link is not None and chained[0][1] != link[1]):
            return None
        link = link or chained[0]
        prev = outputs
    if link is None:
        return None
    ops = [col.ops[i] for i in m.ops]
    maker = next((k for k, op in enumerate(ops) if link[0] in op.out_serials), None)
    if maker is None or not ops[maker].fresh or ops[maker].view_like or ops[maker].inplace:
        return None  # the output is an input passed through, or an alias: no op of the module made it
    return maker, link[1]


def _bytes_beside_output(op: Any, module_output: frozenset[int]) -> int:
    """The bytes of the storages ``op`` made that are not the module's output (0 where it makes none of it)."""
    if not op.out_serials & module_output:
        return 0
    return sum(nbytes for serial, nbytes in op.new_storages if serial not in module_output)


def _forward_moment(op: Any, fw_keys: list[int]) -> tuple[int | None, int | None]:
    """(forward_key, forward_live_bytes) of an op of the first micro-batch's forward, or (None, None)."""
    if op.fw_count is None or op.fw_live is None or not 0 <= op.fw_count < len(fw_keys):
        return None, None
    return fw_keys[op.fw_count], op.fw_live


def _op_stats(m: Any, col: Any, held_serials: set[int], fw_keys: list[int]) -> list[OpStats]:
    ops = [col.ops[i] for i in m.ops]
    unsaved = col.life.unsaved_freed_at is not None
    out: list[OpStats] = []
    # the ops whose recompute may take an op's output under compile: not views (their takers take the storage), not
    # random ones (saved there), not the one making the module's output that autograd saves (kept anyway: never
    # recomputed, as the last-op rule below has it)
    in_module = {i for i, op in zip(m.ops, ops) if not op.random and not op.view_like and not (
        op.out_serials and op.out_serials <= m.out_serials and op.out_serials <= col.saved)}
    for k, op in enumerate(ops):
        # a collective past the early stop: its bytes are held through the backward (_held_inputs), counted there
        held_past_stop = op.must_save and k >= m.recompute_stop
        parent = _alias_parent(ops, k)
        if op.inplace:
            parent = k
            if op.mutated_serial is not None:
                for j in range(k):
                    if op.mutated_serial in ops[j].out_serials:
                        parent = j
                        break
        nbytes = op.output_bytes
        if col.life.compiled and op.fresh:  # under aot_eager: what its partitioner keeps of the op saved
            nbytes = min(nbytes, col.life.compiled_kept_bytes(op.new_storages, m.fqn, col.saved_in, in_module,
                                                              m.ops[k]))
        key, live = _forward_moment(op, fw_keys)
        storages = [(nbytes, col.life.last_live_op(serial, m.ops), m.fqn in col.saved_in.get(serial, ()))
                    for serial, nbytes in op.new_storages]
        out.append(
            OpStats(
                name=op.name,
                runtime_ms=op.runtime_ms,
                output_bytes=0 if (parent is not None and not op.inplace) or op.cached_cast or held_past_stop
                else nbytes,
                view_like=op.view_like,
                random=op.random,
                inplace_parent=parent,
                saved_by_autograd=bool(op.out_serials) and op.out_serials <= col.saved,
                must_save=op.must_save or None,
                held_tensors=(sorted(op.out_serials & held_serials) or None)
                if parent is None and op.fresh and not held_past_stop else None,
                storages=storages or None,
                unsaved_last_ops=[col.life.last_live_op(serial, m.ops, unsaved=True) for serial, _ in op.new_storages]
                if unsaved and storages else None,
                forward_key=key,
                forward_live_bytes=live,
                compiled_takers=col.life.compiled_takers(op.new_storages, m.ops, in_module, m.ops[k]),
            )
        )
    # PyTorch's SACEstimator zeroes the last op that is neither view-like nor
    # in-place: the block output is kept anyway. That holds only when autograd
    # does keep it (a decoder layer's output, saved by the next layer's norm);
    # a feed-forward whose output only feeds a residual add does not keep it,
    # and caching it under SAC costs its bytes. So: zero it only when saved,
    # and only when a recompute reaches it: past the early stop a cached output
    # is never handed back, so SAC holds it until the module's backward ends,
    # after autograd would have freed it (qwen2_moe's shared expert, whose
    # backward comes last: 0.5 MiB over the predicted peak). Only the module's
    # output is kept anyway: the op's other outputs (a LayerNorm's mean and
    # rstd) cost their bytes when saved (counted free, BERT's attention output
    # blocks went 4 KiB each over their plans: bench_training_loops_model).
    for k in range(len(out) - 1, -1, -1):
        if not out[k].view_like and out[k].inplace_parent is None:
            if out[k].saved_by_autograd and k < m.recompute_stop:
                out[k].output_bytes = _bytes_beside_output(ops[k], m.out_serials)
            break
    return out
