"""A plan of a compiled tensor-parallel step, applied to the TP model that is then compiled (issue 29, point 3).

The reduced check of ``bench/bench_tensor_parallel.py --compiled``: the tiny llama (one decoder layer, for
compile time; no dropout) collected as one rank of TP x2 compiled with ``aot_eager`` (``--compile-backend
aot_eager``: the collectives' waits named ``wait_tensor`` as the AOT trace names them, every seeded op saved),
planned at 90% of its baseline (the decoder layer checkpointed whole: its all-reduces and their waits saved,
the rest recomputed), then trained on 2 gloo ranks: TP, the plan (checked under compile), then
``torch.compile(model, backend="aot_eager")``. Each rank's gradients of one seeded step equal the unplanned
compiled run's. Peaks: the bench (bench/RESULTS.md, "llama, TP x2, compiled (aot_eager)"). FSDP2 over TP and
inductor stay refused when compiled.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import planner  # noqa: E402
from bench.tp_run import TpRun, run_tp  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from estimators import CollectRequest, run_collection, run_ranks  # noqa: E402

LLAMA = {**TINY_LLAMA, "attention_dropout": 0.0, "num_hidden_layers": 1}  # one layer: compile time
BATCH, SEQ = 2, 32


def test_a_compiled_tp_plan_applies_and_the_gradients_equal_the_unplanned_compiled_run(tmp_path) -> None:
    if not torch.distributed.is_gloo_available():
        pytest.skip("no gloo backend in this torch build")
    stats = run_collection(CollectRequest(hf_config=LLAMA, batch=BATCH, seq=SEQ, tp_size=2,
                                          compile_backend="aot_eager")).stats
    waits = {op.name for m in stats.modules for op in m.ops or () if "wait" in op.name}
    assert waits == {"_c10d_functional.wait_tensor"}  # as the AOT trace names it; eager: _wrap_tensor_autograd
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats.model_dump(mode="json")))
    p = planner.plan(stats, 0.9 * planner.plan(stats, 1024.0).baseline_peak_bytes / 2**30)
    assert p.status == "optimal" and [m.fqn for m in p.modules] == ["LlamaForCausalLM.model.layers.0"]
    job = {"steps": 1, "compile_backend": "aot_eager"}
    runs = [TpRun("base", LLAMA, BATCH, SEQ, **job),
            TpRun("planned", LLAMA, BATCH, SEQ, plan=p.model_dump(mode="json"), stats_path=str(path), **job)]
    for rank, (base, planned) in enumerate(run_ranks(run_tp, 2, runs)):
        assert base.error is None and planned.error is None, (rank, base.error, planned.error)
        assert len(base.grads) == len(planned.grads) > 0
        assert all(torch.equal(a, b) for a, b in zip(base.grads, planned.grads)), rank


@pytest.mark.parametrize("fsdp, backend, refusal", [
    (2, "aot_eager", "compile_backend 'aot_eager' with fsdp over tensor parallel: a compiled FSDP2 step is not "
                     "collected yet"),
    (None, "inductor", "compile_backend 'inductor' with tensor parallel: a compiled TP step is collected under "
                       "'aot_eager' only"),
])
def test_a_compiled_fsdp2_over_tp_step_and_inductor_with_tp_are_refused(fsdp, backend, refusal) -> None:
    with pytest.raises(ValueError, match=refusal):
        run_collection(CollectRequest(hf_config=LLAMA, batch=BATCH, seq=SEQ, tp_size=2, fsdp_world_size=fsdp,
                                      compile_backend=backend))
