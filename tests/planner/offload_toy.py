"""A 3-block toy for offloading's tests: every figure is written here, so the tests can state their answers.

Post-order positions (fw_post_order): R.emb 0, R.layers.0.lin 1, R.layers.0 2, R.layers.1.lin 3,
R.layers.1 4, R.layers.2.lin 5, R.layers.2 6, R.layers 7, R.head 8, R 9 (N = 10 modules).
Each block R.layers.k has four ops: mm (1000 B, 1 ms), a view, silu (2000 B, 0.5 ms) and mul (1000 B,
0.25 ms); block 0's mul makes the tensor (number 7) block 1 holds as its input. Blocks run 2 ms forward and
4 ms backward; R.emb 0.5 / 0.5, R.head 1 / 2, R 7.5 / 14.5. The timeline has one forward moment per key 0..10
and one backward moment per key 10..0, activation bytes 10_000 + 100 * key (forward) and 20_000 + 100 * key
(backward), and an optimizer moment at key 0.
"""

from __future__ import annotations

import copy

from planner import Stats

__all__ = ["toy_doc", "toy_stats"]


def _block_ops(held: bool) -> list[dict]:
    return [dict(name="aten.mm", runtime_ms=1.0, output_bytes=1000, saved_by_autograd=True),
            dict(name="aten.view", runtime_ms=0.0, output_bytes=0, view_like=True),
            dict(name="aten.silu", runtime_ms=0.5, output_bytes=2000, saved_by_autograd=True),
            dict(name="aten.mul", runtime_ms=0.25, output_bytes=1000, saved_by_autograd=True,
                 **({"held_tensors": [7]} if held else {}))]


def toy_doc() -> dict:
    """The toy as a stats document (a fresh copy each call)."""
    mods = [dict(fqn="R", parent=None, is_leaf=False, fw_ms=7.5, bw_ms=14.5, param_bytes=100),
            dict(fqn="R.emb", parent="R", is_leaf=True, fw_ms=0.5, bw_ms=0.5),
            dict(fqn="R.layers", parent="R", is_leaf=False)]
    pre, post = ["R", "R.emb", "R.layers"], ["R.emb"]
    for k in range(3):
        b = f"R.layers.{k}"
        block = dict(fqn=b, parent="R.layers", is_leaf=False, fw_ms=2.0, bw_ms=4.0, act_saved_bytes=4000,
                     ops=_block_ops(held=k == 0))
        if k == 1:
            block.update(held_input_bytes=1000, held_inputs=[(7, 1000)])
        mods += [block, dict(fqn=b + ".lin", parent=b, is_leaf=True)]
        pre += [b, b + ".lin"]
        post += [b + ".lin", b]
    mods.append(dict(fqn="R.head", parent="R", is_leaf=True, fw_ms=1.0, bw_ms=2.0))
    pre.append("R.head")
    post += ["R.layers", "R.head", "R"]
    timeline = [dict(phase="forward", key=k, activation_bytes=10_000 + 100 * k) for k in range(11)]
    timeline += [dict(phase="backward", key=k, activation_bytes=20_000 + 100 * k) for k in range(10, -1, -1)]
    timeline.append(dict(phase="optimizer", key=0, activation_bytes=0))
    return copy.deepcopy(dict(metadata=dict(model_name="offload-toy"), fw_pre_order=pre, fw_post_order=post,
                              modules=mods, timeline=timeline))


def toy_stats(**metadata) -> Stats:
    """The toy, with ``metadata`` fields added."""
    doc = toy_doc()
    doc["metadata"].update(metadata)
    return Stats.model_validate(doc)
