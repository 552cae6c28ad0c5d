"""``sacplan collect --pp-stages`` then ``sacplan plan`` on every stage file (issue 30)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner import load_stats  # noqa: E402
from planner.cli import main  # noqa: E402

CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
          "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64, "max_position_embeddings": 16,
          "tie_word_embeddings": False}


def test_every_stage_is_collected_to_its_own_file_and_planned(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(CONFIG))
    out = tmp_path / "s.json"
    assert main(["collect", "--hf-config", str(cfg), "--batch", "1", "--seq", "16", "--pp-stages", "2",
                 "--microbatches", "3", "--pp-split", "model.layers.1", "--out", str(out), "--quiet"]) == 0
    stats = [load_stats(tmp_path / f"s.stage{k}.json") for k in range(2)]
    assert not out.exists()
    for k, s in enumerate(stats):
        assert (s.metadata.pipeline.stage, s.metadata.pipeline.stages, s.metadata.pipeline.microbatches) == (k, 2, 3)
    names = [{f.split(".layers.")[1].split(".")[0] for f in s.fw_pre_order if ".layers." in f} for s in stats]
    assert names == [{"0"}, {"1", "2"}]  # the split given: stage 1 starts at model.layers.1
    assert any(f.endswith("embed_tokens") for f in stats[0].fw_pre_order)
    assert any(f.endswith("lm_head") for f in stats[1].fw_pre_order)
    # the received activation and the gradient sent back: 1 x 16 x 32 fp32 each
    assert stats[1].metadata.pipeline.input_grad_bytes == 16 * 32 * 4 and stats[0].metadata.pipeline.input_grad_bytes == 0
    capsys.readouterr()
    code = main(["plan", str(tmp_path / "s.stage0.json"), str(tmp_path / "s.stage1.json"), "--budget-gib", "1",
                 "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and [p["status"] for p in doc["stages"]] == ["optimal", "optimal"]
    assert doc["step_ms"] > 0 and doc["in_flight"] == [2, 1]
    assert main(["plan", str(tmp_path / "s.stage0.json"), str(tmp_path / "s.stage1.json"), "--budget-gib",
                 "1e-6"]) == 2
    assert "stage 0 has no plan under 1e-06 GiB" in capsys.readouterr().err
