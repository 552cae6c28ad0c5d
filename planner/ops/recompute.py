"""What a checkpointed module's recompute holds at once, beyond what the step without checkpointing holds then.

A recompute re-runs the module's ops up to its early stop (``recompute_op_count``)
in its backward. Each storage an op makes lives as long as it did in the
forward (the same code holds the same references; the stats' per-op
``storages``) or until the recompute stops; a saved op's storage, cached by
SAC since the forward, is live from the start until its last use. What the
step without checkpointing holds of the module then is what autograd saved
in it. The excess is a transient (SDPA's math path under CPU autocast: a
score matrix and its dropout, which no op saves) on top of the backward's
memory where the recompute runs (``recompute_key``), less how far that
instant lies below the moment's most (``recompute_headroom_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.stats.format import ModuleStats

__all__ = ["recompute_transient_bytes"]


def recompute_transient_bytes(m: ModuleStats, save: Sequence[int]) -> int:
    """Bytes a recompute of ``m`` with ``save`` (its per-op save list) adds to its ``recompute_key`` moment;
    0 where the stats do not say (no ``storages`` or ``recompute_key``)."""
    if m.recompute_key is None or not m.ops or not any(op.storages for op in m.ops):
        return 0
    stop = len(m.ops) if m.recompute_op_count is None else m.recompute_op_count
    if stop == 0:
        return 0
    live = np.zeros(stop + 1, dtype=np.int64)  # difference array over the recompute's ops
    kept = 0
    for i, op in enumerate(m.ops[:stop]):
        for nbytes, last, saved in op.storages or ():
            live[0 if save[i] else i] += nbytes
            live[min(last, stop - 1) + 1] -= nbytes
            kept += nbytes if saved else 0
    most = int(np.cumsum(live[:stop]).max())
    return max(0, most - kept - (m.recompute_headroom_bytes or 0))
