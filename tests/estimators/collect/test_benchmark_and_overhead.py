"""``--benchmark`` on the CPU, and each module's checkpoint overhead: estimated from its op count or measured."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from estimators import BenchmarkCostModel, RooflineCostModel, collect_stats, device_spec  # noqa: E402
from est_helpers import TINY_LLAMA  # noqa: E402
from planner import load_stats  # noqa: E402
from planner.cli import main  # noqa: E402

aten = torch.ops.aten


@pytest.fixture
def hf_config(tmp_path):
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return path


def test_cpu_benchmark_times_fake_ops_for_real_and_caches_them():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fallback(*_):
        return -1.0

    cost = BenchmarkCostModel(fallback, device="cpu", warmup=1, repeat=3)
    with FakeTensorMode():
        a, b = torch.empty(256, 128), torch.empty(128, 64)
        out = aten.mm.default(a, b)
        ms = cost(aten.mm.default, (a, b), {}, out)
        assert ms > 0
        assert cost(aten.mm.default, (a, b), {}, out) == ms  # one timing per (op, shapes, dtypes)
        assert cost(aten.view.default, (a, [64, 512]), {}, a.view(64, 512)) == 0.0
    # an op that cannot run for real keeps the fallback's figure
    assert cost(aten.mm.default, (torch.ones(4, 3), torch.ones(4, 3)), {}, None) == -1.0


@pytest.mark.slow  # 5 s on an idle machine, 35 s with the two cores shared
def test_collect_benchmark_on_cpu(tmp_path, hf_config):
    """Every op timed for real on the CPU and the 7 modules with op lists below the root measured (HF layers take
    keywords); the root, never checkpointed, gets the estimate."""
    out = tmp_path / "stats.json"
    rc = main(["collect", "--hf-config", str(hf_config), "--batch", "1", "--seq", "16", "--benchmark",
               "--out", str(out), "--quiet"])
    assert rc == 0
    stats = load_stats(out)
    assert stats.metadata.tags["cost_model"] == "benchmark" and stats.metadata.device == "cpu"
    assert stats.metadata.tags["checkpoint_overhead"].startswith("measured on cpu: 7 modules")
    assert stats.metadata.tags["checkpoint_overhead"].endswith(
        f"estimated: 1 modules at {device_spec('cpu').checkpoint_overhead_us_per_op:g} us per op")
    layer = stats.module("LlamaForCausalLM.model.layers.0")
    assert all(op.runtime_ms > 0 for op in layer.ops if not op.view_like)
    for m in stats.modules:
        if m.ops is not None:
            assert m.checkpoint_overhead_ms is not None and m.checkpoint_overhead_ms >= 0, m.fqn


def test_benchmark_refuses_another_target_device(tmp_path, hf_config, capsys):
    rc = main(["collect", "--hf-config", str(hf_config), "--seq", "16", "--benchmark", "--target-device", "H100-SXM",
               "--out", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 1 and not (tmp_path / "s.json").exists()
    assert ("--benchmark times the kernels of the device it runs on (cpu); they say nothing about "
            "--target-device H100-SXM") in capsys.readouterr().err


@pytest.mark.parametrize("flag, us_per_op", [([], device_spec("cpu").checkpoint_overhead_us_per_op),
                                             (["--checkpoint-overhead-us-per-op", "7.5"], 7.5)])
def test_estimated_overhead_is_op_count_times_the_per_op_figure(tmp_path, hf_config, flag, us_per_op):
    out = tmp_path / "stats.json"
    assert main(["collect", "--hf-config", str(hf_config), "--seq", "16", "--out", str(out), "--quiet", *flag]) == 0
    stats = load_stats(out)
    assert stats.metadata.tags["checkpoint_overhead"] == f"estimated: 8 modules at {us_per_op:g} us per op"
    for m in stats.modules:
        if m.ops is None:
            assert m.checkpoint_overhead_ms is None
        else:
            assert m.checkpoint_overhead_ms == pytest.approx(len(m.ops) * us_per_op / 1e3), m.fqn


def test_checkpoint_overhead_option_is_validated(tmp_path, hf_config, capsys):
    with pytest.raises(SystemExit):
        main(["collect", "--hf-config", str(hf_config), "--checkpoint-overhead-us-per-op", "-1"])
    assert "must be at least 0, got '-1'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="checkpoint_overhead_us_per_op must be at least 0, got -2"):
        device_spec("cpu", checkpoint_overhead_us_per_op=-2)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)  # so that both blocks get an input that requires grad: the same call
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x):
        x = self.proj(x)
        for block in self.blocks:
            x = block(x)
        return x


def test_measured_overhead_is_measured_once_per_repeated_module():
    stats = collect_stats(_Stack(), (torch.ones(4, 8),), cost_model=RooflineCostModel(device_spec("cpu")),
                          measure_checkpoint_overhead=True)
    # the root is never checkpointed: not measured (no per-op estimate given, so no figure)
    assert stats.metadata.tags["checkpoint_overhead"] == "measured on cpu: 2 modules (1 distinct), not the root"
    first, second = (stats.module(f"_Stack.blocks.{i}") for i in range(2))
    assert first.checkpoint_overhead_ms == second.checkpoint_overhead_ms >= 0
    assert stats.root.checkpoint_overhead_ms is None


class _Config:
    scale = 2.0


class _NeedsConfig(torch.nn.Module):
    """A block whose forward takes an object the collector does not replay (it gives None)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, config):
        return self.fc(x) * config.scale


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _NeedsConfig()

    def forward(self, x):
        return self.block(x, _Config())


def test_a_module_that_cannot_run_alone_gets_the_estimate():
    stats = collect_stats(_Model(), (torch.ones(4, 8),), cost_model=RooflineCostModel(device_spec("cpu")),
                          checkpoint_overhead_us_per_op=10.0, measure_checkpoint_overhead=True)
    block = stats.module("_Model.block")
    assert block.checkpoint_overhead_ms == pytest.approx(len(block.ops) * 10.0 / 1e3)
    assert stats.root.checkpoint_overhead_ms == pytest.approx(len(stats.root.ops) * 10.0 / 1e3)  # not measured
    assert stats.metadata.tags["checkpoint_overhead"] == ("measured on cpu: 0 modules (0 distinct), not the root; "
                                                          "estimated: 2 modules at 10 us per op")
