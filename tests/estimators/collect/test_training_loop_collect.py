"""Collecting the training loop people run (issue 27): what the stats record, and the errors that name the option."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from estimators import RooflineCostModel, build_from_hf_config, collect_stats, device_spec  # noqa: E402
from estimators.collect import CollectRequest  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from planner.cli import main  # noqa: E402


def _collect(**options):
    torch.manual_seed(0)
    built = build_from_hf_config(TINY_LLAMA, batch_size=2, seq_len=16, dtype=torch.float32,
                                 device=torch.device("meta"))
    return collect_stats(built.model, built.inputs, device="cpu", cost_model=RooflineCostModel(device_spec("cpu")),
                         **options)


def test_the_plain_loop_adds_nothing_to_the_document():
    meta = _collect().model_dump(mode="json")["metadata"]
    for name in ("grad_accumulation", "optimizer_kwargs", "max_grad_norm", "grad_scaler"):
        assert name not in meta
    assert "autocast" not in meta["model_settings"]


def test_the_loop_is_recorded():
    stats = _collect(optimizer="torch.optim.Adagrad", optimizer_kwargs={"lr": 0.1}, grad_accumulation=2,
                     autocast="bf16", max_grad_norm=1.0)
    meta = stats.metadata
    assert (meta.optimizer, meta.optimizer_kwargs, meta.grad_accumulation, meta.max_grad_norm) == \
        ("torch.optim.Adagrad", {"lr": 0.1}, 2, 1.0)
    assert meta.model_settings["autocast"] == "bf16"
    assert {t.micro_batch for t in stats.timeline} == {1, 2, None}  # None: the optimizer step
    # autocast's parameter casts are kept by its cache through the forward: no plan can free them
    casts = [op for m in stats.modules for op in m.ops or () if op.name == "aten._to_copy"]
    assert casts and any(op.output_bytes == 0 for op in casts)


def test_adagrad_state_is_what_adagrad_keeps():
    adamw, adagrad = _collect(), _collect(optimizer="torch.optim.Adagrad")
    params = adamw.root.param_bytes
    # AdamW: exp_avg and exp_avg_sq per parameter (+ step scalars); Adagrad: one sum per parameter (+ step scalars)
    assert 2 * params <= adamw.root.optimizer_state_bytes < 2 * params + 4096
    assert params <= adagrad.root.optimizer_state_bytes < params + 4096


def test_sgd_is_torch_default_without_momentum_and_momentum_is_an_argument():
    assert _collect(optimizer="sgd").root.optimizer_state_bytes == 0
    stats = _collect(optimizer="sgd", optimizer_kwargs={"momentum": 0.9})
    assert stats.root.optimizer_state_bytes == stats.root.param_bytes


def test_an_optimizer_fn_runs_on_the_fake_parameters_and_its_class_is_recorded():
    stats = _collect(optimizer=lambda params: torch.optim.Adam(params, amsgrad=True))
    assert stats.metadata.optimizer == "torch.optim.adam.Adam"
    assert stats.root.optimizer_state_bytes >= 3 * stats.root.param_bytes  # exp_avg, exp_avg_sq, max_exp_avg_sq


@pytest.mark.parametrize("options, match", [
    ({"grad_accumulation": 0}, "grad_accumulation must be a positive integer, got 0"),
    ({"autocast": "fp8"}, "autocast must be one of bf16, fp16 or None, got 'fp8'"),
    ({"max_grad_norm": -1.0}, "max_grad_norm must be a positive number or None, got -1.0"),
    ({"optimizer": "torch.optim.Adagradd"}, "module 'torch.optim' has no attribute 'Adagradd'"),
    ({"optimizer": "no_such_package.Opt"}, "cannot import module 'no_such_package'"),
    ({"optimizer": "torch.nn.Linear"}, "is not a torch.optim.Optimizer subclass"),
    ({"optimizer": "adagrad"}, "neither one of adamw, adam, sgd, none nor a dotted class path"),
    ({"optimizer": "torch.optim.SGD", "optimizer_kwargs": {"nesterov_typo": True}}, "do not fit SGD"),
])
def test_errors_name_the_option_and_value(options, match):
    with pytest.raises(ValueError, match=match):
        _collect(**options)


@pytest.mark.parametrize("args, message", [
    (["--grad-accumulation", "0"], "--grad-accumulation: must be a positive integer, got '0'"),
    (["--optimizer-kwargs", "{lr: 1}"], "--optimizer-kwargs '{lr: 1}' is not valid JSON"),
    (["--optimizer-kwargs", "[1]"], "--optimizer-kwargs '[1]' must be a JSON object"),
    (["--optimizer", "torch.optim.Nope"], "module 'torch.optim' has no attribute 'Nope'"),
    (["--autocast", "bf16", "--dtype", "bf16"], "--autocast bf16 computes in bf16 from fp32 weights: use --dtype fp32"),
    (["--autocast", "bf16", "--fsdp-world-size", "2", "--mixed-precision", "bf16"],
     "--autocast bf16 and --mixed-precision bf16 both cast the compute"),
    (["--max-grad-norm", "0"], "--max-grad-norm: must be a positive number, got '0'"),
])
def test_cli_errors_name_the_flag_and_value(tmp_path, capsys, args, message):
    config = tmp_path / "llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    try:
        rc = main(["collect", "--hf-config", str(config), "--batch", "1", "--seq", "8", "--quiet",
                   "--out", str(tmp_path / "s.json"), *args])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    assert rc != 0 and message in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


def test_cli_collects_the_loop(tmp_path, capsys):
    config = tmp_path / "llama.json"
    config.write_text(json.dumps(TINY_LLAMA))
    out = tmp_path / "s.json"
    rc = main(["collect", "--hf-config", str(config), "--batch", "1", "--seq", "8", "--quiet", "--out", str(out),
               "--grad-accumulation", "2", "--autocast", "bf16", "--max-grad-norm", "1", "--optimizer",
               "torch.optim.Adam", "--optimizer-kwargs", '{"amsgrad": true, "betas": [0.9, 0.95]}'])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads(out.read_text())["metadata"]
    assert meta["grad_accumulation"] == 2 and meta["max_grad_norm"] == 1.0
    assert meta["optimizer"] == "torch.optim.Adam"
    assert meta["optimizer_kwargs"] == {"amsgrad": True, "betas": [0.9, 0.95]}
    assert meta["model_settings"]["autocast"] == "bf16"
    assert "2 micro-batches, autocast bf16, gradients clipped to 1" in CollectRequest(
        hf_config="x", grad_accumulation=2, autocast="bf16", max_grad_norm=1.0).describe("cpu")


def test_help_says_what_each_optimizer_name_means(capsys):
    with pytest.raises(SystemExit):
        main(["collect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "sgd (torch.optim.SGD: no momentum unless --optimizer-kwargs says so)" in text
    assert "adamw (torch.optim.AdamW)" in text and "torch.optim.Adagrad" in text
