"""Synthetic N-layer stats: one transformer block of a real sample, repeated.

``make_layers(source, n_layers)`` takes a PyTorch-format document (``module_info``
+ ``sac_stats``, e.g. ``../shared/reference/torch_format_transformer_L12.json``)
and returns another PyTorch-format document for the same model with
``n_layers`` blocks. Both our planner and PyTorch's ``sac_milp`` read it, so the
scaling series compares the two on identical input.

Construction (every number below is read from the source, none is invented):

* **Template.** Block ``K`` (``template_layer``, default the middle block
  ``L//2 - 1`` of the ``L`` source blocks) is the block every new block copies:
  its modules' figures, its op lists (``sac_stats``) and PyTorch's fitted curve
  fields. The first and last blocks are avoided because PyTorch's collector
  sees slightly different autograd-saved sets at the ends of the stack.
* **Per-block shifts.** In the source every block-relative module (``.attention``,
  ``.feed_forward.w1``, ...) differs from the same module one block later by a
  constant ``dA`` in ``act_total``/``act_bw_per_module`` (activations pile up
  through the forward) and ``dG`` in ``grad_total`` (``-`` one block's
  parameters: later blocks run backward earlier, with fewer gradients
  accumulated). Block ``k`` of the new model gets the template's values plus
  ``(k - K) * dA`` and ``(k - K) * dG``; its ``grad_total`` further gains
  ``-(N - L) * dG`` because the ``N - L`` extra blocks all run backward first.
* **Modules outside the stack.** Modules before it in forward (embeddings)
  keep their activations and gain ``-(N - L) * dG`` gradients (they run
  backward last); modules after it (final norm, output) keep their gradients
  and gain ``(N - L) * dA`` activations. The root gains ``N - L`` blocks'
  parameters, gradients, forward/backward time and ``(N - L) * dA`` in its
  activation fields; its ``act_grad_per_module`` and ``grad_total`` stay.
* **Orders.** Each of the four ``mod_order`` lists (and the listing order of
  ``mod_stats``) is prefix + one contiguous
  group per block + suffix in the source; the new list repeats the template
  block's group, renamed, in the source's direction (ascending in forward,
  descending in backward).
* **Root ops.** The root's op list is its prefix ops, one run of ops per block,
  then its suffix ops. The runs are found by matching the template block's op
  names and runtimes; the new list repeats the root's own run for block ``K``
  (whose last op keeps its memory, unlike the block's own list where the block
  output is kept anyway) and shifts the suffix indices. ``sac_memory`` and
  ``sac_runtime`` of the root are recomputed as the op sums; its fitted curve
  fields (fractions of those totals) are kept, since the normalized
  trade-off curve of a stack of identical blocks barely moves with depth.

Run as a script to write a document: ``python bench/synthetic.py SOURCE N OUT``.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["make_layers", "layer_count"]

_BLOCK = re.compile(r"^(?P<stack>.+?\.layers)\.(?P<k>\d+)(?P<rest>(?:\..+)?)$")
_SHIFTED = ("act_total", "act_bw_per_module", "grad_total")


def _split(fqn: str) -> tuple[str, int, str] | None:
    m = _BLOCK.match(fqn)
    return (m["stack"], int(m["k"]), m["rest"]) if m else None


def layer_count(doc: Mapping[str, Any]) -> int:
    """Number of repeated blocks in a PyTorch-format document."""
    ks = {s[1] for m in doc["module_info"]["mod_stats"] if (s := _split(m["fqn"]))}
    return max(ks) + 1 if ks else 0


def make_layers(source: Mapping[str, Any], n_layers: int, *, template_layer: int | None = None) -> dict[str, Any]:
    """A PyTorch-format document like ``source`` with ``n_layers`` copies of one block (see module docstring)."""
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive integer, got {n_layers!r}")
    info = source["module_info"]
    stats = {m["fqn"]: m for m in info["mod_stats"]}
    pre = info["mod_order"]["fw_pre_order"]
    blocks = [s for f in pre if (s := _split(f))]
    stacks = {s[0] for s in blocks}
    if len(stacks) != 1:
        raise ValueError(f"source must have exactly one '<prefix>.layers.<k>' stack, found {sorted(stacks)}")
    stack = stacks.pop()
    n_src = max(s[1] for s in blocks) + 1
    if n_src < 2:
        raise ValueError("source needs at least 2 blocks to measure the per-block shifts")
    k_tpl = n_src // 2 - 1 if template_layer is None else template_layer
    if not 0 <= k_tpl < n_src - 1:
        raise ValueError(f"template_layer {k_tpl} must lie in [0, {n_src - 2}] (the next block measures the shifts)")
    rests = [s[2] for s in blocks if s[1] == k_tpl]
    name = lambda k, rest: f"{stack}.{k}{rest}"  # noqa: E731
    extra = n_layers - n_src

    # Constant per-block shifts of the cumulative fields, per block-relative module.
    delta = {
        rest: {f: stats[name(k_tpl + 1, rest)][f] - stats[name(k_tpl, rest)][f] for f in _SHIFTED} for rest in rests
    }
    d_act = delta[""]["act_total"]
    d_grad = delta[""]["grad_total"]
    tpl_block = stats[name(k_tpl, "")]

    first = pre.index(name(0, ""))
    root = pre[0]
    orders = {key: _repeat_order(lst, stack, k_tpl, n_layers) for key, lst in info["mod_order"].items()}

    # mod_stats keeps the source's listing order (PyTorch's model.modules()).
    listing = _repeat_order([m["fqn"] for m in info["mod_stats"]], stack, k_tpl, n_layers)
    mod_stats = []
    for fqn in listing:
        s = _split(fqn)
        if s:
            m = copy.deepcopy(stats[name(k_tpl, s[2])])
            m["fqn"] = fqn
            for f in _SHIFTED:
                m[f] += (s[1] - k_tpl) * delta[s[2]][f]
            m["grad_total"] -= extra * d_grad
        else:
            m = copy.deepcopy(stats[fqn])
            if fqn == root:
                for f in ("param_per_module", "grad_per_module"):
                    m[f] += extra * tpl_block["param_per_module"]
                for f in ("act_fw_per_module", "act_bw_per_module", "act_total"):
                    m[f] += extra * d_act
                for f in ("fw_runtime_per_module", "bw_runtime_per_module"):
                    m[f] += extra * tpl_block[f]
            elif pre.index(fqn) < first:
                m["grad_total"] -= extra * d_grad
            else:
                m["act_total"] += extra * d_act
                m["act_bw_per_module"] += extra * d_act
        mod_stats.append(m)

    sac_src = source.get("sac_stats") or {}
    sac: dict[str, Any] = {}
    tpl_ops = sac_src.get(name(k_tpl, ""))
    for fqn in orders["fw_post_order"]:
        s = _split(fqn)
        src_fqn = name(k_tpl, s[2]) if s else fqn
        if src_fqn not in sac_src:
            continue
        if s or tpl_ops is None:
            sac[fqn] = copy.deepcopy(sac_src[src_fqn])
        else:
            sac[fqn] = _repeat_ops(sac_src[fqn], tpl_ops, n_src, k_tpl, n_layers)
    for m in mod_stats:
        if m["fqn"] == root and root in sac:
            m["sac_memory"] = sum(sac[root]["memory"])
            m["sac_runtime"] = sum(sac[root]["runtimes"])

    return {
        "model": f"synthetic_{n_layers}_layers(block {k_tpl} of {source.get('model', 'source')})",
        "synthetic": {"source_model": source.get("model"), "template_layer": k_tpl, "n_layers": n_layers},
        "module_info": {"mod_order": orders, "mod_stats": mod_stats},
        "sac_stats": sac,
    }


def _repeat_order(order: list[str], stack: str, k_tpl: int, n_layers: int) -> list[str]:
    ids = [s[1] if (s := _split(f)) else None for f in order]
    pos = [i for i, k in enumerate(ids) if k is not None]
    lo, hi = pos[0], pos[-1] + 1
    region = ids[lo:hi]
    if None in region:
        raise ValueError(f"order list has non-block modules inside the block stack near {order[lo]!r}")
    seq = [k for j, k in enumerate(region) if j == 0 or region[j - 1] != k]
    if len(seq) != len(set(seq)):
        raise ValueError("each block's modules must be contiguous in every order list")
    pattern = [_split(f)[2] for f in order[lo:hi] if _split(f)[1] == k_tpl]
    ks = range(n_layers) if seq[0] < seq[-1] else range(n_layers - 1, -1, -1)
    return order[:lo] + [f"{stack}.{k}{rest}" for k in ks for rest in pattern] + order[hi:]


def _repeat_ops(ops: Mapping[str, Any], tpl: Mapping[str, Any], n_src: int, k_tpl: int, n_layers: int) -> dict:
    n, total = len(tpl["func_names"]), len(ops["func_names"])
    start = _find_runs(ops, tpl, n_src)
    if start is None:
        return copy.deepcopy(dict(ops))  # the container does not hold the blocks' ops
    run_lo, stack_hi = start + k_tpl * n, start + n_src * n
    shift = (n_layers - n_src) * n

    def expand(idx: list[int]) -> list[int]:
        out = [i for i in idx if i < start]
        rel = sorted(i - run_lo for i in idx if run_lo <= i < run_lo + n)
        out += [start + k * n + r for k in range(n_layers) for r in rel]
        return out + [i + shift for i in idx if i >= stack_hi]

    in_stack = lambda i: start <= i < stack_hi  # noqa: E731
    inplace = []
    for a, b in ops["inplace_ops"]:
        if in_stack(a) != in_stack(b) or (in_stack(a) and (a - start) // n != (b - start) // n):
            raise ValueError(f"in-place op {a} (parent {b}) crosses a block boundary")
        if not in_stack(a):
            inplace.append([a if a < start else a + shift, b if b < start else b + shift])
        elif run_lo <= a < run_lo + n:  # the template run stands for every block
            inplace += [[start + k * n + a - run_lo, start + k * n + b - run_lo] for k in range(n_layers)]
    inplace.sort()
    out: dict[str, Any] = {}
    for key in ("func_names", "runtimes", "memory"):
        v = ops[key]
        out[key] = v[:start] + v[run_lo : run_lo + n] * n_layers + v[stack_hi:]
    for key in ("view_like_ops", "rand_ops", "saved_autograd_ops"):
        out[key] = expand(ops[key])
    out["inplace_ops"] = inplace
    out["force_store_random"] = ops["force_store_random"]
    assert len(out["func_names"]) == total + shift
    return out


def _find_runs(ops: Mapping[str, Any], tpl: Mapping[str, Any], n_src: int) -> int | None:
    """Index where ``n_src`` consecutive runs of the block's ops start (names and runtimes)."""
    n, names, rts = len(tpl["func_names"]), ops["func_names"], ops["runtimes"]
    for p in range(len(names) - n_src * n + 1):
        if all(
            names[p + k * n : p + (k + 1) * n] == tpl["func_names"] and rts[p + k * n : p + (k + 1) * n] == tpl["runtimes"]
            for k in range(n_src)
        ):
            return p
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python bench/synthetic.py SOURCE.json N_LAYERS OUT.json", file=sys.stderr)
        return 1
    doc = make_layers(json.loads(Path(argv[0]).read_text()), int(argv[1]))
    Path(argv[2]).write_text(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
