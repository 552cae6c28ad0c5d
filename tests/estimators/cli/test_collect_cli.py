"""``sacplan collect`` end to end: files written, stats valid, upload to a real service."""

from __future__ import annotations

import json
import shlex
import socket
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from planner import load_stats  # noqa: E402
from planner.cli import main  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402

FACTORY = '''
import torch
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer


def make(batch_size, seq_len, device):
    args = ModelArgs(n_layers=2, vocab_size=128, max_seq_len=seq_len, dim=64, n_heads=4, dropout_p=0.1)
    with torch.device(device):
        model = Transformer(args)
        tokens = torch.randint(0, 128, (batch_size, seq_len))
    return model, (tokens,)
'''


@pytest.fixture
def hf_config(tmp_path: Path) -> Path:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_collect_hf_config_writes_valid_stats(tmp_path, hf_config, capsys):
    out = tmp_path / "stats.json"
    rc = main(["collect", "--hf-config", str(hf_config), "--batch", "2", "--seq", "32", "--out", str(out), "--quiet",
               "--host-link-gbps", "12.5"])
    assert rc == 0
    stats = load_stats(out)
    assert stats.metadata.batch_size == 2 and stats.metadata.seq_len == 32
    assert stats.metadata.target_device == "cpu"
    link = stats.metadata.host_link_gbps  # a cpu target has none of its own: the flag gives both directions
    assert (link.d2h, link.h2d, link.source) == (12.5, 12.5, "cpu: given by the user (--host-link-gbps)")
    assert "LlamaForCausalLM.model.layers.1" in stats.fw_post_order
    # The rotary embedding's backward hooks never fire (its outputs need no grad): it is still there.
    rotary = stats.module("LlamaForCausalLM.model.rotary_emb")
    assert rotary.bw_ms == 0 and rotary.act_grad_bytes == 0
    assert "baseline peak" in capsys.readouterr().out


def test_collect_factory_for_gpu_target_emulates_flash(tmp_path, capsys):
    factory = tmp_path / "model.py"
    factory.write_text(FACTORY)
    out = tmp_path / "stats.json"
    rc = main(["collect", "--model", f"{factory}:make", "--batch", "2", "--seq", "64", "--dtype", "bf16",
               "--target-device", "H100-sxm", "--out", str(out), "--quiet"])
    assert rc == 0
    stats = load_stats(out)
    assert stats.metadata.target_device == "H100-SXM"
    link = stats.metadata.host_link_gbps  # the device table's PCIe Gen5 x16 figure (estimators/collect/devices.py)
    assert (link.d2h, link.h2d) == (50.0, 50.0) and link.source.startswith("H100-SXM: PCIe Gen5 x16, effective")
    names = {op.name for op in stats.module("Transformer.layers.0").ops}
    assert "aten._scaled_dot_product_flash_attention" in names
    assert "aten.native_dropout" in names


def test_collect_rejects_bad_factory(tmp_path, capsys):
    """Bad input exits 1, as for ``sacplan plan`` (where 2 means infeasible)."""
    rc = main(["collect", "--model", str(tmp_path / "missing.py") + ":make", "--out", str(tmp_path / "s.json")])
    assert rc == 1
    assert "missing.py" in capsys.readouterr().err


@pytest.mark.parametrize("config, message", [
    ({**TINY_LLAMA, "pad_token_id": 300}, "pad_token_id 300 is outside"),
    # transformers' Phi3Config defaults pad_token_id to 32000; the file does not set it
    ({**TINY_LLAMA, "model_type": "phi3"},
     "pad_token_id 32000 (the phi3 default; the file does not set it) is outside"),
])
def test_collect_names_pad_token_outside_vocab(tmp_path, capsys, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    rc = main(["collect", "--hf-config", str(path), "--seq", "16", "--out", str(tmp_path / "s.json"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "AssertionError" not in err  # was nn.Embedding's bare "Padding_idx must be within ..."
    assert f"--hf-config {message} the vocabulary (vocab_size 256): set \"pad_token_id\" to null" in err


def test_pad_token_outside_vocab_is_fine_where_no_embedding_pads(tmp_path):
    # GPT-2's embeddings take no padding_idx, so its pad_token_id never reaches nn.Embedding
    # (transformers only warns): such a config collects
    config = {"model_type": "gpt2", "vocab_size": 128, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 32,
              "pad_token_id": 50256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "s.json"
    assert main(["collect", "--hf-config", str(path), "--seq", "16", "--out", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["modules"]


def test_upload_unreachable_server_keeps_file(tmp_path, hf_config, capsys):
    out = tmp_path / "stats.json"
    url = f"http://127.0.0.1:{_free_port()}"
    rc = main(["collect", "--hf-config", str(hf_config), "--batch", "1", "--seq", "16", "--out", str(out),
               "--quiet", "--upload", url])
    assert rc == 1
    assert "cannot reach" in capsys.readouterr().err
    load_stats(out)


@pytest.fixture
def service_url(tmp_path):
    """The real sacplan service on 127.0.0.1, SQLite built by the migrations, one API key."""
    uvicorn = pytest.importorskip("uvicorn")
    from service.config import Settings
    from service.main import create_app
    from service.store import upgrade

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'svc.db'}",
                        api_keys={"secret-key": "team"})
    upgrade(settings.sqlalchemy_url)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


def test_upload_to_service(tmp_path, hf_config, service_url, capsys):
    out = tmp_path / "stats.json"
    args = ["collect", "--hf-config", str(hf_config), "--batch", "1", "--seq", "16", "--out", str(out), "--quiet",
            "--upload", service_url]
    assert main(args + ["--api-key", "wrong"]) == 1
    assert "answered 401" in capsys.readouterr().err

    assert main(args + ["--api-key", "secret-key"]) == 0
    text = capsys.readouterr().out
    assert "stats id" in text and f"{service_url}/docs" in text
    stats_id = text.split("stats id ")[1].split()[0]
    from service.store import is_id

    assert is_id(stats_id), text  # the opaque id the service gave, as it gave it

    import urllib.request

    req = urllib.request.Request(f"{service_url}/v1/stats/{stats_id}", headers={"Authorization": "Bearer secret-key"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc = json.loads(resp.read())
    assert doc["model_name"] == load_stats(out).metadata.model_name


def test_same_model_gives_the_same_document(tmp_path, hf_config):
    """No run-dependent fields: the service's content-hash dedup sees one document."""
    from planner import stats_hash

    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p in paths:
        assert main(["collect", "--hf-config", str(hf_config), "--seq", "16", "--out", str(p), "--quiet"]) == 0
    assert stats_hash(load_stats(paths[0])) == stats_hash(load_stats(paths[1]))


def test_collect_summary_guides_and_progress_is_clean_lines_in_a_log(tmp_path, hf_config, capsys):
    """Issue 18: the header names the target, a log gets one line per phase (no carriage returns), the
    counts agree, and the printed next command plans."""
    out = tmp_path / "stats.json"
    rc = main(["collect", "--hf-config", str(hf_config), "--seq", "32", "--target-device", "L40S", "--out", str(out)])
    assert rc == 0
    captured = capsys.readouterr()
    err, summary = captured.err, captured.out
    assert "\r" not in err  # capsys' stderr is no terminal
    assert err.splitlines()[0].startswith(f"collecting {hf_config} for L40S: batch 1, seq 32")
    stats = load_stats(out)
    ran = len(stats.modules)
    # the tiny Llama has one container (model.layers, a ModuleList) that never runs on its own
    assert f"  building the model: {ran + 1} modules" in err
    assert f"  forward: {ran} modules" in err
    assert "optimizer step" in err and "1/1" not in err
    rows = dict(line.split("  ", 1) for line in summary.splitlines() if "  " in line and not line.startswith(" "))
    assert rows["modules"].strip().startswith(f"{ran} that run")
    assert "48 GB = 44.70 GiB" in summary  # L40S datasheet: 48 GB
    assert rows["fits as is"].strip().startswith("yes")  # a tiny model
    # issue 32: no plan at the device's capacity that checkpoints nothing
    assert rows["next"].strip() == "nothing to plan: the step fits L40S without checkpointing"
    assert "step time" in rows and "the ops' runtimes alone (a roofline" in rows["step time"]


def test_collect_summary_puts_step_and_recompute_on_one_basis(tmp_path, hf_config, capsys):
    """Issue 32: the tiny Llama's recompute was "1048.6% of the step": ops against ops, the host overhead apart,
    and why it dominates; the printed next command checkpoints something and plans."""
    out = tmp_path / "stats.json"
    assert main(["collect", "--hf-config", str(hf_config), "--batch", "2", "--seq", "32", "--out", str(out),
                 "--quiet"]) == 0
    summary = capsys.readouterr().out
    suggested = [line for line in summary.splitlines() if " GiB: recompute " in line]
    assert suggested and all(" ms = ops " in line and "of the step's ops) + host overhead " in line
                             for line in suggested)
    shares = [float(line.split("(")[1].split("%")[0]) for line in suggested]
    assert all(0 <= share <= 100 for share in shares), suggested
    assert "host overhead               checkpointing's own work on the host" in summary
    command = next(line.split(None, 1)[1] for line in summary.splitlines() if line.startswith("next "))
    assert command.startswith(f"sacplan plan {out} --budget-gib ")
    assert main(shlex.split(command)[1:] + ["--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "optimal" and plan["modules"]


@pytest.mark.parametrize("flag, value, message", [
    ("--target-device", "h100", "'h100' is ambiguous: it could be H100-SXM or H100-PCIe"),
    ("--target-device", "a100", "'a100' is ambiguous: it could be A100-40GB or A100-80GB"),
])
def test_collect_refuses_device_names_it_would_have_to_guess(tmp_path, hf_config, capsys, flag, value, message):
    rc = main(["collect", "--hf-config", str(hf_config), flag, value, "--out", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


def test_unknown_model_type_is_a_short_error_with_the_closest_names(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**TINY_LLAMA, "model_type": "lama"}))
    rc = main(["collect", "--hf-config", str(path), "--out", str(tmp_path / "s.json"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "--hf-config model_type 'lama' is not a model type of transformers" in err
    assert "closest: llama" in err
    assert len(err) < 400  # was ~9,000 characters: every model type transformers knows
