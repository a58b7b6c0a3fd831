"""The metrics module: busiest links and their groups (closed forms), the memory dict, peak dtypes."""

import json
from types import SimpleNamespace

import pytest

from scenarios.metrics import (
    busiest_links,
    link_groups,
    link_kind,
    link_stats,
    memory_dict,
    peak_dtype_for,
    unrecorded_utilisation,
)
from scenarios.report import stable_json


def link(name, cap, timeline, carried=None):
    ns = SimpleNamespace(name=name, nominal_capacity=cap, timeline=timeline)
    if carried is not None:
        ns.carried = carried
    return ns


def test_busiest_links_closed_form():
    # 50 % for the first half of a 1 s run -> mean 25 %, peak 50 %, carried 0.5 * cap * 0.5 s.
    half = link("half", 100e9, [(0.0, 50e9), (0.5, 0.0)])
    full = link("full", 10e9, [(0.0, 10e9)])  # 100 % all the time but fewer bytes
    idle = link("idle", 10e9, [])
    rows = busiest_links([idle, full, half], 3, 1.0)
    # busiest = highest mean utilisation: the saturated small link before the fatter, half-used one
    assert [r[0] for r in rows] == ["full", "half", "idle"]
    name, carried, mean, peak = rows[1]
    assert carried == pytest.approx(25e9) and mean == pytest.approx(0.25) and peak == pytest.approx(0.5)
    assert rows[0][2:] == pytest.approx((1.0, 1.0))
    assert rows[2][1:] == (0.0, 0.0, 0.0)
    assert len(busiest_links([idle, full, half], 1, 1.0)) == 1
    # ``carried`` wins over the integral when given; the window cuts the timeline.
    assert busiest_links([link("c", 1.0, [(0.0, 1.0)], carried=7.0)], 1, 2.0)[0][1] == 7.0
    assert link_stats([(0.0, 4.0), (3.0, 0.0)], 4.0, 2.0) == pytest.approx((8.0, 1.0, 1.0))


def test_link_groups_merge_equal_loads_and_drop_idle_links():
    # Four links at 40 % of 10 GB/s for 1 s (a symmetric ring), one at 20 %, one idle.
    ring = [link(f"ring{i}", 10e9, [(0.0, 4e9)]) for i in range(4)]
    other = link("other", 10e9, [(0.0, 2e9)])
    idle = link("idle", 10e9, [])
    groups = link_groups([other, idle, *ring], 1.0, 10)
    assert groups[0] == ("ring0", 4, pytest.approx(4e9), pytest.approx(0.4), pytest.approx(0.4))
    assert groups[1][:2] == ("other", 1) and groups[1][2] == pytest.approx(2e9)
    assert len(groups) == 2  # the idle link carried nothing
    assert link_groups([other, *ring], 1.0, 1) == [groups[0]]


def test_links_without_a_timeline_have_their_mean_from_their_bytes_and_no_peak():
    """``record_links = false`` (the search's runs): only ``carried`` is kept. The mean is the bytes over
    capacity x time, as the timeline would integrate; the peak is unknown, not 0."""
    ring = [link(f"ring{i}", 10e9, [], carried=4e9) for i in range(4)]
    other = link("other", 10e9, [], carried=2e9)
    groups = link_groups([other, *ring], 2.0, 10)
    assert groups == [("ring0", 4, 4e9, pytest.approx(0.2), None), ("other", 1, 2e9, pytest.approx(0.1), None)]
    assert unrecorded_utilisation(4e9, 10e9, 2.0) == (pytest.approx(0.2), None)


def test_json_bytes_whole_seconds_to_the_picosecond():
    """Every command's --json: byte counts are integers, seconds carry no last-bit noise of a difference of
    long sums (an idle 4 us out of 1.5 s read 3.99999999989e-06), rates (``_per_s``) keep their digits."""
    doc = json.loads(stable_json({"verdict_need_bytes": 11998100701.2, "idle_s": 1.5 - (1.5 - 4e-6),
                                  "rows": [{"carried_bytes": 2.5e9 + 0.49}], "tokens_per_s": 1e-13,
                                  "bubble_s": -5.4e-16, "iteration_time_s": 1.53706570954123}))
    assert doc == {"verdict_need_bytes": 11998100701, "idle_s": 4e-06, "rows": [{"carried_bytes": 2500000000}],
                   "tokens_per_s": 1e-13, "bubble_s": 0, "iteration_time_s": 1.53706570954}
    assert isinstance(doc["verdict_need_bytes"], int) and isinstance(doc["rows"][0]["carried_bytes"], int)


def test_compute_slowdown_is_zero_within_summation_noise():
    """Kernels that ran exactly as fast as alone: the two sums may differ in their last bits (-5.4e-16);
    that is no slowdown. A real 1e-9 slowdown of 1,000 kernels is kept."""
    from hwmodel.events import KernelInfo
    from scenarios.analysis import overlap_stats

    def kernels(scale):
        return [SimpleNamespace(category="compute", start_s=0.0, end_s=0.1 * (i % 7 + 1) * scale,
                                info=KernelInfo(flops=0.0, solo_time_s=0.1 * (i % 7 + 1))) for i in range(1000)]

    assert overlap_stats(kernels(1 + 1e-16), {}).compute_slowdown == 0.0
    assert overlap_stats(kernels(1 + 1e-9), {}).compute_slowdown == pytest.approx(1e-9, rel=1e-3)


def test_memory_dict_and_peak_dtypes():
    from workload.memory import MemoryBreakdown

    gpu = SimpleNamespace(hbm_capacity_bytes=80e9)
    mem = MemoryBreakdown(parameters=1.0, gradients=2.0, optimizer_states=3.0, activations=4.0, workspace=5.0)
    d = memory_dict(mem, gpu)
    assert d == {"parameters_bytes": 1.0, "gradients_bytes": 2.0, "optimizer_states_bytes": 3.0,
                 "activations_bytes": 4.0, "workspace_bytes": 5.0, "fp8_weights_bytes": 0.0,
                 "hbm_datasheet_bytes": 80e9, "verdict_need_bytes": 15.0, "verdict_capacity_bytes": 80e9,
                 "verdict": mem.verdict(gpu)}
    assert [peak_dtype_for(d) for d in ("bf16", "fp16", "fp32", "fp8")] == ["bf16", "fp16", "fp32", "bf16"]


def test_json_names_the_datasheet_and_the_usable_hbm_as_the_text_does():
    """H100 SXM5: the datasheet's 80 GB (80e9) is below the usable HBM the verdict compares with
    (totalGlobalMem, 85,045,477,376 B): a device use between the two fits. The JSON named the datasheet
    figure ``hbm_capacity_bytes``, so it showed a peak above "the capacity" beside a "fits" verdict; now
    each capacity is named by what it is and the verdict's two figures are in it, as in the text report."""
    import hwmodel.specs as specs
    from scenarios.report import _memory_lines
    from workload import allocator
    from workload.memory import MemoryBreakdown
    from workload.parallel.config import ParallelConfig

    gpu = specs.get_gpu("H100-SXM5-80GB")
    p = ParallelConfig(global_batch_size=8).resolve(8)
    mem = allocator.with_framework(MemoryBreakdown(parameters=10e9, gradients=20e9, optimizer_states=30e9,
                                                   activations=18e9), p, gpu)
    out = memory_dict(mem, gpu)
    assert "hbm_capacity_bytes" not in out
    assert out["hbm_datasheet_bytes"] == 80e9 and out["usable_hbm_bytes"] == 85_045_477_376
    assert 80e9 < out["device_used_bytes"] == out["verdict_need_bytes"] < out["verdict_capacity_bytes"]
    assert out["verdict_capacity_bytes"] == out["usable_hbm_bytes"] and out["verdict"].startswith("fits")
    device = next(line for line in _memory_lines(out, False) if line.startswith("  device"))
    assert device == (f"  device {out['device_used_bytes'] / 1e9:.1f} GB of 85.0 GB usable HBM (95 %; the "
                      f"datasheet's 80.0 GB read as GiB, less the driver's share)")


def test_deepspeed_memory_names_its_two_transient_terms():
    """A DeepSpeed ZeRO-3 run's JSON and summary split the transient term into gathered parameters and
    unpartitioned gradients (by the elements at their joint peak); FSDP's stays one term."""
    from dataclasses import replace

    import hwmodel.specs as specs
    from scenarios.report import _memory_lines
    from workload import allocator
    from workload.parallel.config import ParallelConfig
    from workload.zoo import get_model_config
    from workload.zoo.family import transformer_memory

    gpu = specs.get_gpu("A100-SXM4-80GB")
    cfg = replace(get_model_config("gpt-1.7b"), num_layers=4)
    for impl in ("deepspeed", "megatron"):
        p = ParallelConfig(micro_batch_size=1, global_batch_size=16, zero_stage=3, zero_impl=impl).resolve(8)
        mem = allocator.with_framework(transformer_memory(cfg, p, "bf16"), p, gpu)
        out = memory_dict(mem, gpu)
        text = _memory_lines(out, False)[1]
        if impl == "deepspeed":
            g, r = out["deepspeed_gathered_parameters_bytes"], out["deepspeed_unpartitioned_gradients_bytes"]
            assert g + r == pytest.approx(mem.gather_buffers) and g > 0 and r > 0
            assert "DeepSpeed gathered parameters" in text and "FSDP" not in text
        else:
            assert "deepspeed_gathered_parameters_bytes" not in out and "FSDP gather buffers" in text


def test_link_groups_count_every_link_of_the_last_group():
    """A group's ``links`` is the number of links with its load however many there are (here 1,000 sharing
    one timeline, as a link class's links do, after a group of 700): the last group is not cut at a window
    of candidates, and a text report asking for fewer groups gives the same counts."""
    shared = [(0.0, 3e9)]
    big = [link(f"a{i:04d}", 10e9, [(0.0, 5e9)]) for i in range(700)]
    cls = [link(f"b{i:04d}", 10e9, shared) for i in range(1000)]
    tail = [link("c", 10e9, [(0.0, 1e9)])]
    groups = link_groups([*tail, *cls, *big], 1.0, 10)
    assert [(g[0], g[1]) for g in groups] == [("a0000", 700), ("b0000", 1000), ("c", 1)]
    assert groups[1][3:] == pytest.approx((0.3, 0.3))
    assert link_groups([*tail, *cls, *big], 1.0, 2) == groups[:2]


def bundle(names, cap, timeline, carried):
    """A link class as the report sees it (``hwmodel.link_classes.LinkBundle``): one load, several names."""
    return SimpleNamespace(name=min(names), count=len(names), names=lambda: list(names), nominal_capacity=cap,
                           timeline=timeline, carried=carried)


def test_link_groups_of_bundles_are_those_of_their_links_one_by_one():
    """Bundles rank as their links would one by one, also where another entry's load key is exactly theirs
    (the same bytes on the same capacity, a different peak): then the links interleave by name, and a group
    is cut wherever the peak changes, as with the links one by one."""
    flat, peaky = [(0.0, 5e9)], [(0.0, 10e9), (0.5, 0.0)]  # both carry 5e9 bytes in 1 s on 10 GB/s
    a = bundle(["s1->l0", "s3->l0", "s5->l0"], 10e9, flat, 5e9)
    b = bundle(["s2->l0", "s4->l0"], 10e9, peaky, 5e9)
    c = link("s0->l9", 10e9, flat, 5e9)  # a pinned link with the first bundle's load
    d = bundle([f"x{i}->y" for i in range(5)], 10e9, [(0.0, 2e9)], 2e9)  # ties with nothing
    singles = [link(n, 10e9, lk.timeline, lk.carried) for lk in (a, b, d) for n in lk.names()] + [c]
    for top in (1, 3, 10):
        want = link_groups(singles, 1.0, top)
        assert link_groups([d, b, c, a], 1.0, top) == want
    # two classes of one load (equal timelines, not the same object) and names interleaved: one group
    e, f = bundle(["m1", "m3"], 10e9, [(0.0, 5e9)], 5e9), bundle(["m0", "m2"], 10e9, [(0.0, 5e9)], 5e9)
    assert link_groups([e, f, d], 1.0, 10) == [("m0", 4, 5e9, 0.5, 0.5), ("x0->y", 5, 2e9, 0.2, 0.2)]
    want = link_groups(singles, 1.0, 10)
    # s0 (flat), s1 (flat), s2 (peaky), s3 (flat), s4 (peaky), s5 (flat), then the 5 x links
    assert [(g[0], g[1]) for g in want] == [("s0->l9", 2), ("s2->l0", 1), ("s3->l0", 1), ("s4->l0", 1),
                                            ("s5->l0", 1), ("x0->y", 5)]
    assert want[-1][2:] == pytest.approx((2e9, 0.2, 0.2))


def test_link_kind_tells_nic_links_from_the_fabrics_tiers():
    """64 DGX H100 on a rail-optimised two-tier fabric: NVLink, PCIe, NIC-to-leaf and leaf/spine links,
    each kind with the edges' own bandwidths (NDR NIC 400 Gb/s = 50 GB/s; 18 NVLink 4 links x 25 GB/s)."""
    from hwmodel.systems import build_system

    g = build_system("dgx-h100", num_nodes=64).graph
    kinds: dict[str, set[float]] = {}
    for u, v, d in g.edges(data=True):
        k = link_kind(g, f"{u}->{v}")
        kinds.setdefault(k, set()).add(d["bandwidth_Bps"])
        if k == "nic":
            assert "nic" in (g.nodes[u]["kind"], g.nodes[v]["kind"])
        elif k in ("leaf-spine", "spine-leaf"):
            assert {g.nodes[u]["tier"], g.nodes[v]["tier"]} == {"leaf", "spine"}
    assert set(kinds) == {"nvlink", "pcie", "nic", "leaf-spine", "spine-leaf"}
    assert kinds["nic"] == {50e9} and kinds["nvlink"] == {450e9}
