"""Tests of hwmodel.specs: real figures, lookup, what-if files and validation errors."""

import dataclasses
from pathlib import Path

import pytest

from hwmodel import specs
from hwmodel.specs import (
    GPUSpec,
    NICSpec,
    UnknownNameError,
    get_gpu,
    get_nic,
    get_switch,
    known_gpus,
    load_gpu_file,
    with_overrides,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a100_80gb_figures():
    g = get_gpu("A100-SXM4-80GB")
    assert g.architecture == "Ampere" and g.compute_capability == (8, 0)
    assert g.sm_count == 108
    assert g.boost_clock_hz == pytest.approx(1.41e9)
    assert g.peak_flops("bf16") == pytest.approx(312e12)
    assert g.peak_flops("fp16") == pytest.approx(312e12)
    assert g.peak_flops("tf32") == pytest.approx(156e12)
    assert g.peak_flops("fp32") == pytest.approx(19.5e12)
    assert "fp8" not in g.tensor_flops
    assert g.hbm_capacity_bytes == 80 * 10**9
    assert g.hbm_bandwidth_Bps == pytest.approx(2.039e12)
    assert g.l2_bytes == 41_943_040
    assert (g.nvlink_generation, g.nvlink_links) == (3, 12)
    assert g.nvlink_bandwidth_per_link_Bps == pytest.approx(25e9)
    assert g.nvlink_bandwidth_Bps == pytest.approx(300e9)
    assert g.nccl_nvlink_bandwidth_Bps == pytest.approx(240e9)  # nccl topo.h 12 x SM80_NVLINK_BW
    assert (g.pcie_generation, g.pcie_bandwidth_Bps) == (4, pytest.approx(32e9))
    assert g.nccl_pcie_bandwidth_Bps == pytest.approx(24e9)
    assert g.copy_engines == 3


def test_other_gpus_figures():
    a40 = get_gpu("A100-SXM4-40GB")
    assert a40.hbm_bandwidth_Bps == pytest.approx(1.555e12) and a40.hbm_capacity_bytes == 40 * 10**9
    h = get_gpu("H100-SXM5")
    assert h.sm_count == 132 and h.compute_capability == (9, 0)
    assert h.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h.peak_flops("fp8") == pytest.approx(1978.9e12)
    assert h.hbm_bandwidth_Bps == pytest.approx(3.35e12)
    assert h.l2_bytes == 52_428_800
    assert h.nvlink_bandwidth_Bps == pytest.approx(450e9)
    assert h.nccl_nvlink_bandwidth_Bps == pytest.approx(370.8e9)
    assert h.pcie_bandwidth_Bps == pytest.approx(64e9)
    h200 = get_gpu("H200")
    assert h200.hbm_capacity_bytes == 141 * 10**9 and h200.hbm_bandwidth_Bps == pytest.approx(4.8e12)
    b = get_gpu("B200")
    assert b.nvlink_bandwidth_Bps == pytest.approx(900e9)
    assert b.nccl_nvlink_bandwidth_per_link_Bps == pytest.approx(40.1e9)
    assert b.peak_flops("fp8") == pytest.approx(4500e12)
    v = get_gpu("V100")
    assert v.sm_count == 80 and set(v.tensor_flops) == {"fp16"}
    assert v.nvlink_bandwidth_Bps == pytest.approx(150e9)


def test_every_figure_has_a_source():
    assert known_gpus()[:6] == ["V100-SXM2", "A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5", "H200-SXM",
                                 "B200-HGX"]
    for name in known_gpus()[:6]:
        g = get_gpu(name)
        missing = [f.name for f in dataclasses.fields(g) if f.name not in ("name", "sources")
                   and getattr(g, f.name) is not None and not g.sources.get(f.name)]  # None: an unset option
        assert g.tdp_w is not None, name  # every shipped GPU gives its rated power
        assert missing == [], (name, missing)
    for name in specs.known_nics():
        n = get_nic(name)
        assert {"bandwidth_Bps", "latency_s", "pcie_generation"} <= set(n.sources)
    for name in specs.known_switches():
        s = get_switch(name)
        assert {"radix", "hop_latency_s", "port_bandwidth_Bps"} <= set(s.sources)


def test_peak_flops_unsupported_dtype_names_gpu_and_supported():
    with pytest.raises(ValueError, match=r"V100-SXM2.*bf16.*supported dtypes: fp32, fp16"):
        get_gpu("V100").peak_flops("bf16")
    with pytest.raises(ValueError, match="A100-SXM4-80GB"):
        get_gpu("A100").peak_flops("fp8")
    assert get_gpu("A100").peak_flops("bfloat16") == get_gpu("A100").peak_flops("BF16")
    assert get_gpu("H100").peak_flops("float32") == pytest.approx(66.9e12)


@pytest.mark.parametrize("alias,name", [
    ("a100", "A100-SXM4-80GB"), ("A100", "A100-SXM4-80GB"), ("a100_40gb", "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("h100", "H100-SXM5"), (" H100 SXM5 ", "H100-SXM5"),
    ("h200", "H200-SXM"), ("b200", "B200-HGX"), ("v100", "V100-SXM2"),
])
def test_gpu_aliases(alias, name):
    assert get_gpu(alias).name == name


def test_spec_objects_pass_through_and_are_frozen_and_hashable():
    g = get_gpu("A100")
    assert get_gpu(g) is g
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.sm_count = 1  # type: ignore[misc]
    assert len({g, get_gpu("A100-SXM4-80GB"), get_gpu("H100")}) == 2


def test_unknown_names():
    with pytest.raises(UnknownNameError) as exc:
        get_gpu("A1000")
    assert isinstance(exc.value, KeyError)
    assert exc.value.field == "gpu" and "A100-SXM4-80GB" in str(exc.value) and "H100-SXM5" in str(exc.value)
    with pytest.raises(UnknownNameError, match="known nic names: ConnectX-5-EDR, ConnectX-6-HDR"):
        get_nic("cx9")
    with pytest.raises(UnknownNameError, match="QM9700"):
        get_switch("QM1")


def test_nics_and_switches():
    assert get_nic("hdr").bandwidth_Bps == pytest.approx(25e9)  # nccl net_ib: 50000 Mb/s x 4 / 8000
    assert get_nic("ConnectX-7-NDR").bandwidth_Bps == pytest.approx(50e9)
    assert get_nic("xdr").bandwidth_Bps == pytest.approx(100e9)
    assert get_nic("cx6").latency_s == pytest.approx(1e-6)
    q = get_switch("QM8700")
    assert (q.kind, q.radix, q.port_bandwidth_Bps) == ("ib", 40, pytest.approx(25e9))
    q2 = get_switch("quantum-2")
    assert (q2.name, q2.radix, q2.switching_capacity_Bps) == ("QM9700", 64, pytest.approx(3.2e12))
    assert get_switch("NVSwitch-gen3").kind == "nvswitch" and get_switch("nvswitch3").radix == 64
    assert specs.get_pcie_switch(4).port_bandwidth_Bps == pytest.approx(32e9)
    assert set(specs.known_switches("ib")) == {"SB7800", "QM8700", "QM9700", "Q3400"}
    assert specs.pcie_link_bandwidth_Bps(5) == pytest.approx(64e9)
    assert specs.nccl_pcie_link_bandwidth_Bps(3) == pytest.approx(12e9)  # nccl topo.h PCI_BW
    assert specs.nccl_pcie_link_bandwidth_Bps(5, lanes=8) == pytest.approx(24e9)
    with pytest.raises(ValueError, match="PCIe generation"):
        specs.pcie_link_bandwidth_Bps(9)


def test_whatif_file_with_base(tmp_path):
    g = load_gpu_file(EXAMPLES / "whatif_a100_2x_nvlink.toml")
    base = get_gpu("A100-SXM4-80GB")
    assert g.name == "A100-2xNVLink"
    assert g.nvlink_links == 24 and g.nvlink_bandwidth_Bps == pytest.approx(600e9)
    assert dataclasses.replace(g, name=base.name, nvlink_links=12, sources=base.sources) == base
    assert "what-if" in g.sources["nvlink_links"] and g.sources["sm_count"] == base.sources["sm_count"]
    register = specs.register_gpu(g, aliases=["a100-2x"])
    assert get_gpu("a100-2xnvlink") is register and get_gpu("A100-2X") is register
    specs.register_gpu(g)  # same figures again: no-op
    with pytest.raises(ValueError, match="already registered"):
        specs.register_gpu(with_overrides(g, sm_count=100))


def test_whatif_full_definition_roundtrip(tmp_path):
    text = """
name = "Toy-GPU"
architecture = "Toy"
compute_capability = "9.0"
sm_count = 10
boost_clock_MHz = 1000
tensor_TFLOPS = { bf16 = 100, fp8 = 200 }
fp32_TFLOPS = 10
hbm_capacity_GB = 24
hbm_bandwidth_GBps = 1000
l2_MiB = 8
nvlink_generation = 0
nvlink_links = 0
nvlink_bandwidth_per_link_GBps = 0
nccl_nvlink_bandwidth_per_link_GBps = 0
pcie_generation = 4
pcie_bandwidth_Bps = 32e9
copy_engines = 2
[sources]
sm_count = "made up"
"""
    p = tmp_path / "toy.toml"
    p.write_text(text)
    g = load_gpu_file(p, register=True)
    assert g.peak_flops("fp8") == pytest.approx(2e14) and g.hbm_bandwidth_Bps == pytest.approx(1e12)
    assert g.l2_bytes == 8 * 2**20 and g.pcie_bandwidth_Bps == 32e9 and g.nvlink_bandwidth_Bps == 0
    assert g.sources["sm_count"] == "made up" and g.sources["hbm_capacity_bytes"] == "what-if file toy.toml"
    assert get_gpu("toy-gpu") is g
    assert GPUSpec.from_dict(g.to_dict()) == g


@pytest.mark.parametrize("body,match", [
    ('base = "A100"\nname = "X"\nhbm_bandwidth = 3',
     r"unknown key 'hbm_bandwidth'; allowed keys: .*hbm_bandwidth_GBps"),
    ('base = "A100"\nname = "X"\nhbm_bandwidth_GBps = -1', r"'hbm_bandwidth_GBps' must be >= 0"),
    ('base = "A100"\nname = "X"\nsm_count = 0', r"'sm_count' must be > 0"),
    ('base = "A100"\nname = "X"\nsm_count = 10.5', r"'sm_count' must give a whole number"),
    ('base = "A100"\nname = "X"\nsm_count = "many"', r"'sm_count' must be a number"),
    ('base = "A100"\nname = "X"\ntensor_TFLOPS = { fp64 = 19.5 }', r"unknown dtype 'fp64'; allowed: fp16"),
    ('base = "A100"\nname = "X"\nsm_count = 100\nhbm_capacity_bytes = 1\nhbm_capacity_GB = 2', "given twice"),
    ('base = "A100"\nnvlink_links = 24', r"key 'name' is required"),
    ('base = "Z100"\nname = "X"', r"unknown gpu 'Z100'"),
    ('name = "X"\nsm_count = 10', r"missing keys \['architecture'"),
    ('base = "A100"\nname = "X"\n[sources]\nbogus = "x"', r"sources has unknown key 'bogus'"),
])
def test_whatif_file_errors(tmp_path, body, match):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises((ValueError, KeyError), match=match):
        load_gpu_file(p)


def test_with_overrides():
    a = get_gpu("A100")
    b = with_overrides(a, name="A100-fast-HBM", hbm_bandwidth_GBps=4000, tensor_flops={"fp8": 624e12})
    assert b.hbm_bandwidth_Bps == pytest.approx(4e12)
    assert b.tensor_flops == {**a.tensor_flops, "fp8": 624e12}
    assert b.sources["hbm_bandwidth_Bps"] == "user override"
    assert b.sources["sm_count"] == a.sources["sm_count"]
    assert a.hbm_bandwidth_Bps == pytest.approx(2.039e12)  # original untouched
    c = with_overrides(a, source="scenario x", nvlink_links=24)
    assert c.nvlink_bandwidth_Bps == pytest.approx(600e9) and c.sources["nvlink_links"] == "scenario x"
    with pytest.raises(ValueError, match=r"unknown key 'hbm_bw'; allowed keys:.*hbm_bandwidth_Bps"):
        with_overrides(a, hbm_bw=1)
    with pytest.raises(ValueError, match="'hbm_bandwidth_Bps' must be >= 0"):
        with_overrides(a, hbm_bandwidth_Bps=-5)
    with pytest.raises(ValueError, match=r"GPUSpec 'A100-SXM4-80GB': field 'fp32_flops' must be > 0"):
        with_overrides(a, fp32_flops=0)
    nic = with_overrides(get_nic("ndr"), bandwidth_Gbps=800)
    assert isinstance(nic, NICSpec) and nic.bandwidth_Bps == pytest.approx(100e9)
    sw = with_overrides(get_switch("QM9700"), hop_latency_ns=300)
    assert sw.hop_latency_s == pytest.approx(300e-9)


def test_direct_construction_validates():
    d = get_gpu("A100").to_dict()
    with pytest.raises(ValueError, match="field 'hbm_bandwidth_Bps' must be > 0"):
        GPUSpec.from_dict({**d, "hbm_bandwidth_Bps": -1.0})
    with pytest.raises(ValueError, match="field 'compute_capability'"):
        GPUSpec.from_dict({**d, "compute_capability": "eight"})
    with pytest.raises(ValueError, match=r"unknown keys \['foo'\]"):
        GPUSpec.from_dict({**d, "foo": 1})
    with pytest.raises(ValueError, match="field 'kind' must be one of ib, pcie, nvswitch"):
        specs.SwitchSpec(name="S", kind="eth", radix=4, hop_latency_s=0, port_bandwidth_Bps=1)
    with pytest.raises(ValueError, match="field 'latency_s' must be >= 0"):
        NICSpec(name="N", bandwidth_Bps=1e9, latency_s=-1, pcie_generation=4)


def test_spec_units_convert_human_units_to_si_in_one_place():
    from hwmodel.spec_units import NIC_KEYS, SWITCH_KEYS, convert

    fields, sources = convert(NIC_KEYS, {}, ["name", "bandwidth_Bps", "latency_s", "pcie_generation"],
                              {"name": "x", "bandwidth_Gbps": 400, "latency_us": 1.5,
                               "sources": {"bandwidth_Gbps": "[SRC] s"}}, "t")
    assert fields == {"name": "x", "bandwidth_Bps": 50e9, "latency_s": pytest.approx(1.5e-6)}
    assert sources == {"bandwidth_Bps": "[SRC] s"}
    fields, _ = convert(SWITCH_KEYS, {}, ["radix"], {"radix": 64.0, "hop_latency_ns": 150}, "t")
    assert fields["radix"] == 64 and isinstance(fields["radix"], int)
    assert fields["hop_latency_s"] == pytest.approx(150e-9)
    with pytest.raises(ValueError, match=r"t: key 'radix' must give a whole number, got 64.5"):
        convert(SWITCH_KEYS, {}, [], {"radix": 64.5}, "t")
    with pytest.raises(ValueError, match=r"'bandwidth_Bps' given twice \(as 'bandwidth_Gbps' and 'bandwidth_GBps'\)"):
        convert(NIC_KEYS, {}, [], {"bandwidth_Gbps": 400, "bandwidth_GBps": 50}, "t")


# -- SKUs defined by a power limit, rack-scale Blackwell ---------------------------------------------


def test_power_limit_clock_model_closed_form():
    from hwmodel.power import STATIC_POWER_FRACTION, sustained_clock_hz, throughput_scale

    # at the reference limit the part runs at the clock its peaks are quoted at (1830 MHz for H100 SXM5)
    assert sustained_clock_hz(700) == pytest.approx(1.83e9, rel=1e-12)
    # cube law above the static power: f = f_ref ((P - Ps) / (P_ref - Ps))^(1/3), Ps = 10 % of 700 W
    assert STATIC_POWER_FRACTION == 0.10
    assert throughput_scale(500) == pytest.approx((430 / 630) ** (1 / 3), rel=1e-12)
    # a higher limit cannot push past the maximum clock (1980 MHz)
    assert sustained_clock_hz(1400) == pytest.approx(1.98e9)
    # the dynamic power implied by the clock is back at the limit (P = Ps + (P_ref - Ps) (f / f_ref)^3)
    f = sustained_clock_hz(400)
    assert 70 + 630 * (f / 1.83e9) ** 3 == pytest.approx(400, rel=1e-12)
    for bad in (0, -5, float("nan"), 70, True):
        with pytest.raises(ValueError, match="power_limit_w"):
            sustained_clock_hz(bad)


def test_h100_96gb_500w_follows_the_power_model_and_hbm2e():
    from hwmodel.power import throughput_scale

    ref, g = get_gpu("H100-SXM5"), get_gpu("H100-SXM5-96GB-500W")
    assert get_gpu("h100-96gb") is g and g.architecture == "Hopper" and g.sm_count == ref.sm_count
    k = throughput_scale(500)  # 0.8805: 1611 MHz sustained under 500 W
    for dtype in ("fp16", "bf16", "tf32", "fp8"):  # the file's figures are the model's, rounded to 0.1 TFLOP/s
        assert g.tensor_flops[dtype] == pytest.approx(ref.tensor_flops[dtype] * k, abs=0.051e12)
    assert g.fp32_flops == pytest.approx(ref.fp32_flops * k, abs=0.051e12)
    assert g.hbm_capacity_bytes == 96e9
    assert g.hbm_bandwidth_Bps == pytest.approx(6 / 5 * 2.0e12)  # 6 HBM2e stacks at the H100 PCIe's 0.4 TB/s each
    assert g.nvlink_bandwidth_Bps == ref.nvlink_bandwidth_Bps


def test_gb200_gpu_figures_are_the_nvl72_datasheet_per_gpu():
    g = get_gpu("gb200")
    assert g.name == "B200-GB200" and g.compute_capability == (10, 0)
    assert g.peak_flops("bf16") == pytest.approx(360e15 / 72 / 2)  # 360 PF sparse per rack -> 2.5 PF dense
    assert g.peak_flops("fp8") == pytest.approx(720e15 / 72 / 2)
    assert g.hbm_bandwidth_Bps == pytest.approx(576e12 / 72)
    assert 2 * g.nvlink_bandwidth_Bps == pytest.approx(1.8e12)  # 1.8 TB/s per GPU, both directions
    assert 72 * 2 * g.nvlink_bandwidth_Bps == pytest.approx(130e12, rel=0.01)  # 130 TB/s per rack


def test_new_parts_have_a_source_for_every_figure():
    for name in ("H100-SXM5-96GB-500W", "B200-GB200"):
        g = get_gpu(name)
        missing = [f.name for f in dataclasses.fields(g) if f.name not in ("name", "sources")
                   and getattr(g, f.name) is not None and not g.sources.get(f.name)]  # None: an unset option
        assert g.tdp_w is not None, name  # every shipped GPU gives its rated power
        assert missing == [], (name, missing)
        assert all(s.startswith(("[SRC]", "[2ND]", "[DERIVED]", "[UNCERTAIN]")) for s in g.sources.values())
    for name in ("NVSwitch-gen1", "SB7800"):
        sw = get_switch(name)
        assert set(sw.sources) >= {"radix", "port_bandwidth_Bps", "hop_latency_s"}
    assert get_switch("SB7800").port_bandwidth_Bps == pytest.approx(100e9 / 8)
