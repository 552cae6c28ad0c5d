"""Device table and roofline cost model."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from estimators import DEVICES, RooflineCostModel, device_spec  # noqa: E402
from estimators.collect import cuda_device_entry, host_link_of  # noqa: E402

aten = torch.ops.aten


@pytest.mark.parametrize("name", ["A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "L40S", "MI300X"])
def test_every_required_device_is_in_the_table_with_a_source(name):
    for spelling in (name, name.lower(), name.upper()):
        spec = device_spec(spelling)
        assert spec.name == name and spec.kind == "cuda"
    assert "datasheet" in spec.source.lower() or "data sheet" in spec.source.lower()


def test_datasheet_figures():
    # NVIDIA A100 datasheet: 312 TFLOP/s BF16 dense, 2,039 GB/s for the 80GB SXM part.
    a100 = device_spec("a100-80gb")
    assert a100.tflops("bf16") == 312.0 and a100.mem_bandwidth_gbps == 2039.0
    # H100 SXM datasheet: 1,979 TFLOP/s BF16 with sparsity, i.e. 989.5 dense; 3.35 TB/s.
    h100 = device_spec("H100-SXM")
    assert h100.tflops("bf16") == 989.5 and h100.mem_bandwidth_gbps == 3350.0
    # H100 datasheet: 80 GB, read as 10**9 bytes (74.5 GiB), the cautious reading (estimators/collect/devices.py)
    assert h100.memory_bytes == 80 * 10**9 and device_spec("H200").memory_bytes == 141 * 10**9
    assert device_spec("cpu").memory_bytes is None
    assert cuda_device_entry("NVIDIA H100 80GB HBM3") == "H100-SXM"  # torch.cuda.get_device_name spellings
    assert cuda_device_entry("NVIDIA A100-SXM4-40GB") == "A100-40GB"
    assert len(DEVICES) >= 8


@pytest.mark.parametrize("name, message", [
    ("h100", "'h100' is ambiguous: it could be H100-SXM or H100-PCIe; give one exactly"),
    ("A100", "'A100' is ambiguous: it could be A100-40GB or A100-80GB"),
    ("a100-80", "'a100-80' is not in the table; closest: A100-80GB"),
    ("NVIDIA H100 80GB HBM3", "not in the table; closest: H100-SXM"),
    ("tpu-v5", "'tpu-v5' is not in the table; known: A100-40GB, "),
])
def test_device_names_are_exact_never_guessed(name, message):
    """A name that is not an entry is refused with the entries it could mean (issue 18: h100 was taken as H100-SXM)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        device_spec(name)


def test_unknown_cuda_device_is_refused():
    with pytest.raises(ValueError, match="'NVIDIA H100 NVL' is not in the device table; pass --target-device"):
        cuda_device_entry("NVIDIA H100 NVL")


def test_overrides_and_bad_values():
    spec = device_spec("h200", peak_tflops=100, mem_bandwidth_gbps=1000, compute_efficiency=0.5)
    assert spec.tflops("bf16") == 100 and spec.tflops("fp32") == 100
    assert spec.mem_bandwidth_gbps == 1000 and spec.compute_efficiency == 0.5
    with pytest.raises(ValueError, match="target device 'tpu-v5' is not in the table"):
        device_spec("tpu-v5")
    with pytest.raises(ValueError, match="compute_efficiency must be in \\(0, 1\\], got 1.5"):
        device_spec("h200", compute_efficiency=1.5)
    with pytest.raises(ValueError, match="mem_bandwidth_gbps must be positive, got -1"):
        device_spec("h200", mem_bandwidth_gbps=-1)


def test_host_link_figures_per_target():
    """Effective host-link figures, per direction (estimators/collect/devices.py's docstring gives the sources):
    PCIe Gen4 x16 24/24 (A100, L40S), PCIe Gen5 x16 50/50 (H100, H200), NVLink-C2C 290 D2H / 340 H2D (GH200,
    nvbandwidth#23: H2D 346 GB/s measured, D2H about 15% slower); a cpu target has no host link."""
    expected = {"A100-40GB": (24, 24), "A100-80GB": (24, 24), "L40S": (24, 24), "H100-SXM": (50, 50),
                "H100-PCIe": (50, 50), "H200": (50, 50), "MI300X": (50, 50), "GH200": (290, 340)}
    for name, (d2h, h2d) in expected.items():
        spec = device_spec(name)
        assert (spec.host_link_d2h_gbps, spec.host_link_h2d_gbps) == (d2h, h2d), name
        assert spec.host_link_source and ("PCIe" in spec.host_link_source or "NVLink" in spec.host_link_source)
    assert "assumed" in device_spec("MI300X").host_link_source  # not measured: said so
    cpu = device_spec("cpu")
    assert (cpu.host_link_d2h_gbps, cpu.host_link_h2d_gbps, cpu.host_link_source) == (None, None, None)


def test_gh200_entry_and_its_cuda_name():
    # DataCrunch's GH200 memcpy analysis and JSC's JUPITER page: 96 GB HBM3 at 4 TB/s (the 480 GB LPDDR5X part).
    gh200 = device_spec("gh200")
    assert gh200.memory_bytes == 96 * 10**9 and gh200.mem_bandwidth_gbps == 4000.0
    assert "assumed" in gh200.source  # its compute figures are H100-SXM's, not its datasheet's
    assert cuda_device_entry("NVIDIA GH200 480GB") == "GH200"
    assert cuda_device_entry("NVIDIA H200") == "H200"  # the H200 pattern does not take a GH200
    with pytest.raises(ValueError, match="'NVIDIA GH200 144G HBM3e' is not in the device table"):
        cuda_device_entry("NVIDIA GH200 144G HBM3e")  # another memory: refused, not costed as the 96 GB part


def test_host_link_override():
    spec = device_spec("cpu", host_link_gbps=12.5)
    assert (spec.host_link_d2h_gbps, spec.host_link_h2d_gbps) == (12.5, 12.5)
    assert "given by the user" in spec.host_link_source
    # what the collector writes as metadata.host_link_gbps: none for a cpu target, the table's figures otherwise
    assert host_link_of(device_spec("cpu")) is None
    gh200 = host_link_of(device_spec("GH200"))
    assert (gh200.d2h, gh200.h2d) == (290.0, 340.0) and gh200.source.startswith("GH200: NVLink-C2C")
    assert host_link_of(spec).d2h == 12.5
    for bad in (0, -3, 1e-9, float("inf"), float("nan")):  # the stats' HostLink takes 1e-6 GB/s and up
        with pytest.raises(ValueError, match=re.escape(f"host_link_gbps must be a positive number of GB/s (at least "
                                                       f"1e-06), got {bad!r}")):
            device_spec("h100-sxm", host_link_gbps=bad)


def test_roofline_times():
    cost = RooflineCostModel(device_spec("cpu", peak_tflops=1.0, mem_bandwidth_gbps=1.0))
    a, b = torch.ones(64, 32), torch.ones(32, 16)
    out = aten.mm.default(a, b)
    # mm FLOPs = 2*M*N*K = 65,536 -> 65.5 ns at 1 TFLOP/s; bytes = 4*(64*32 + 32*16 + 64*16) = 14,336
    # -> 14.3 us at 1 GB/s: memory bound.
    assert cost(aten.mm.default, (a, b), {}, out) == pytest.approx(14336 / 1e9 * 1e3)
    fast_memory = RooflineCostModel(device_spec("cpu", peak_tflops=1e-6, mem_bandwidth_gbps=1e6))
    assert fast_memory(aten.mm.default, (a, b), {}, out) == pytest.approx(65536 / 1e6 * 1e3)
    view = aten.view.default(a, [32, 64])
    assert cost(aten.view.default, (a, [32, 64]), {}, view) == 0.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_benchmark_needs_cuda(tmp_path, capsys):
    from estimators import BenchmarkCostModel
    from planner.cli import main

    with pytest.raises(RuntimeError, match="--benchmark needs a CUDA device"):
        BenchmarkCostModel(RooflineCostModel(device_spec("cpu")))
    rc = main(["collect", "--hf-config", str(tmp_path / "none.json"), "--device", "cuda", "--benchmark",
               "--out", str(tmp_path / "s.json"), "--quiet"])
    assert rc == 1  # bad input (2 means infeasible for plan and sweep)
    assert "--device cuda: torch.cuda.is_available() is False" in capsys.readouterr().err
