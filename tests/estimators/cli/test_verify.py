"""``sacplan verify`` (issue 32, item 6): real steps of the stats' step with and without each plan, predicted
against measured, one line each; stats this machine cannot run as described are refused with the reason.

Known answers: on the CPU the measured peak is the stats' own measure (every distinct live storage), so the
tiny Llama's peaks match the plan's within 2% (tests/estimators/measure/test_fidelity.py holds the same to 1%);
times are not asserted (tests never assert wall-clock times), only that each plan's line has them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import planner  # noqa: E402
from estimators.cli.verify_run import KNOWN_METADATA, training_loop  # noqa: E402
from estimators.common import TrainingLoop  # noqa: E402
from planner.cli import main  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402

RATIO = re.compile(r"peak .* predicted, .* measured \(measured/predicted (\d+\.\d+)\)")


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("verify")
    config = root / "tiny-llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    stats = root / "tiny.json"
    assert main(["collect", "--hf-config", str(config), "--batch", "2", "--seq", "32", "--out", str(stats),
                 "--quiet"]) == 0
    return config, stats


def test_verify_prints_predicted_against_measured_one_line_each(collected, capsys):
    config, stats = collected
    capsys.readouterr()
    smallest = planner.min_feasible_budget_gib(planner.load_stats(stats))
    assert main(["verify", str(stats), "--hf-config", str(config), "--budget-gib", str(smallest),
                 "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("no checkpointing ")
    assert lines[1].startswith(f"{smallest:g} GiB plan, ") and "; recompute " in lines[1]
    assert " ms predicted, " in lines[1] and " ms measured +- " in lines[1]
    for line in lines[:2]:
        assert 0.98 <= float(RATIO.search(line).group(1)) <= 1.02, line


def test_a_plan_file_that_checkpoints_nothing_is_named_not_run(collected, tmp_path, capsys):
    config, stats = collected
    roomy = planner.plan(planner.load_stats(stats), 1.0)  # far above the step's 2 MiB: no checkpointing
    path = tmp_path / "plan.json"
    path.write_text(roomy.model_dump_json())
    assert main(["verify", str(stats), "--hf-config", str(config), "--plan", str(path), "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^1 GiB plan +checkpoints nothing: the run without checkpointing$", out, re.M)


def _edited(stats: Path, tmp_path: Path, **metadata) -> Path:
    doc = json.loads(stats.read_text())
    doc["metadata"].update(metadata)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_stats_for_another_device_are_refused(collected, tmp_path, capsys):
    config, stats = collected
    rc = main(["verify", str(_edited(stats, tmp_path, target_device="H100-SXM")), "--hf-config", str(config)])
    assert rc == 1
    assert "error: not verified: these stats are for H100-SXM, and this machine has no CUDA device" in \
        capsys.readouterr().err


def test_one_rank_of_a_sharded_job_is_refused(collected, tmp_path, capsys):
    config, stats = collected
    sharded = _edited(stats, tmp_path, sharding={"kind": "fsdp2", "world_size": 4, "units": ["LlamaForCausalLM"]})
    assert main(["verify", str(sharded), "--hf-config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "not verified: these stats are one rank of an FSDP2 (fully_shard) job over 4 ranks" in err
    assert "estimators.measure_fsdp_steps" in err


def test_one_stage_of_a_pipeline_is_refused(collected, tmp_path, capsys):
    config, stats = collected
    stage = _edited(stats, tmp_path, pipeline={"stage": 1, "stages": 2, "schedule": "1f1b", "microbatches": 4,
                                               "held_bytes": 0, "buffer_bytes": 0})
    assert main(["verify", str(stage), "--hf-config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "not verified: these stats are stage 1 of a 2-stage 1f1b pipeline" in err
    assert "estimators.measure_pipeline_stage" in err


def test_another_model_is_refused(collected, tmp_path, capsys):
    _, stats = collected
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**TINY_LLAMA, "num_hidden_layers": 1}))
    assert main(["verify", str(stats), "--hf-config", str(other)]) == 1
    assert "not verified: the model is not the one the stats describe: " in capsys.readouterr().err


def test_every_metadata_field_is_known_to_verify():
    # a new setting in the stats must be reproduced by verify (or refused there) on purpose
    assert set(planner.StatsMetadata.model_fields) == KNOWN_METADATA


def test_a_plan_made_from_other_stats_is_named_not_a_traceback(collected, tmp_path, capsys):
    config, stats = collected
    l4 = Path(__file__).resolve().parents[2] / "data" / "torch_format_transformer_L4.json"
    path = tmp_path / "l4-plan.json"
    path.write_text(planner.plan(planner.load_stats(l4), 4).model_dump_json())
    assert main(["verify", str(stats), "--hf-config", str(config), "--plan", str(path), "--rounds", "1"]) == 1
    assert "error: not verified: plan modules[0].fqn 'Transformer.layers.0.attention' is not a module of " \
           "LlamaForCausalLM" in capsys.readouterr().err


def test_a_budget_in_bytes_is_questioned(collected, capsys):
    config, stats = collected
    assert main(["verify", str(stats), "--hf-config", str(config), "--budget-gib", "4294967296"]) == 1
    assert "--budget-gib 4294967296 GiB is over 64 TiB per rank: did you mean bytes?" in capsys.readouterr().err


def test_the_step_run_is_the_stats_training_loop(collected, tmp_path):
    _, stats = collected
    settings = {**planner.load_stats(stats).metadata.model_settings, "autocast": "bf16"}
    edited = _edited(stats, tmp_path, grad_accumulation=2, max_grad_norm=1.0, grad_scaler=True,
                     model_settings=settings)
    assert training_loop(planner.load_stats(edited)) == TrainingLoop(grad_accumulation=2, autocast="bf16",
                                                                     grad_scaler=True, max_grad_norm=1.0)
    assert training_loop(planner.load_stats(stats)).plain
