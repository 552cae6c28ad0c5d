"""What ``sacplan collect`` says when the model cannot be built or run (issue 32, item 5): a config whose shapes do
not fit names the module and the config's fields; ``--hf-config`` takes a Hugging Face hub id (config only) and
says clearly when it cannot fetch one. Nothing here contacts the network: the hub is a local cache laid out as the
hub's, read with ``HF_HUB_OFFLINE=1`` in a fresh process (huggingface_hub reads its settings once, at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner import load_stats  # noqa: E402
from planner.cli import main  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _collect(tmp_path: Path, config: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, **config}))
    rc = main(["collect", "--hf-config", str(path), "--seq", "16", "--out", str(tmp_path / "s.json"), "--quiet"])
    return rc, capsys.readouterr().err


def test_a_config_the_model_rejects_is_one_line_naming_the_fields(tmp_path, capsys):
    # transformers checks this one itself, in an exception that is no ValueError (it was a traceback)
    rc, err = _collect(tmp_path, {"hidden_size": 250}, capsys)
    assert rc == 1 and "Traceback" not in err
    assert "error: --hf-config is not a valid llama config: The hidden size (250) is not a multiple of the number " \
           "of attention heads (4)" in err


def test_shapes_that_fail_inside_the_step_name_the_module_and_the_config_fields(tmp_path, capsys):
    # 5 query heads over 2 key/value heads: transformers builds it, and scaled_dot_product_attention refuses
    rc, err = _collect(tmp_path, {"hidden_size": 250, "num_attention_heads": 5, "num_key_value_heads": 2}, capsys)
    assert rc == 1
    assert "error: in module LlamaForCausalLM.model.layers.0.self_attn (LlamaAttention): Number of heads in key " \
           "and value must divide the number of heads in" in err
    assert "the config's shape fields: hidden_size=250, num_attention_heads=5, num_key_value_heads=2, head_dim=50" in err
    assert not (tmp_path / "s.json").exists()


def _hub_cache(root: Path, repo_id: str, config: dict) -> Path:
    """A cache laid out as huggingface_hub's: refs/main names a snapshot holding config.json."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(config))
    return root


def _sacplan_offline(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "PYTHONPATH": str(ROOT),
           "HF_HOME": str(tmp_path / "hf-home")}
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=300)


def test_hf_config_takes_a_hub_id_from_the_cache(tmp_path):
    _hub_cache(tmp_path / "hub", "sacplan-test/tiny-llama", TINY_LLAMA)
    r = _sacplan_offline(tmp_path, "collect", "--hf-config", "sacplan-test/tiny-llama", "--seq", "16", "--out",
                         "hub.json", "--quiet")
    assert r.returncode == 0, r.stderr
    stats = load_stats(tmp_path / "hub.json")
    assert stats.metadata.model_name == "tiny-llama"
    assert "LlamaForCausalLM.model.layers.1.self_attn" in stats.fw_post_order


def test_hf_config_says_when_it_cannot_fetch_a_hub_id(tmp_path):
    (tmp_path / "hub").mkdir()
    r = _sacplan_offline(tmp_path, "collect", "--hf-config", "Qwen/Qwen2-0.5B", "--out", "q.json", "--quiet")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--hf-config 'Qwen/Qwen2-0.5B' is no file here, so it was taken as a Hugging Face hub id, and its " \
           "config could not be fetched" in r.stderr
    assert "HF_HUB_OFFLINE=1 reads only the local cache" in r.stderr


def test_a_missing_file_is_not_taken_for_a_hub_id(tmp_path, capsys):
    rc = main(["collect", "--hf-config", str(tmp_path / "nothere.json"), "--out", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 1
    assert "does not exist (a Hugging Face hub id looks like Org/Name)" in capsys.readouterr().err
