"""PNG figures: Gantt, link utilisation, breakdown bars, sweep curves; busiest-link statistics."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from hwmodel.events import CollectiveInfo, P2PInfo
from plots import plot_breakdown, plot_gantt, plot_link_utilisation, plot_sweep
from plots.bars import downsample_ranks
from plots.gantt import category_style, select_ranks

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Ev:
    rank: int
    stream: str
    name: str
    category: str
    start_s: float
    end_s: float
    phase: str = ""
    layer: str = ""
    info: object = None


def pipeline_events():
    """Two ranks, three streams each: a 2-stage pipeline with a bubble and an overlapped all-reduce."""
    evs = []
    for mb in range(4):  # fwd on rank 0 then rank 1 (rank 1 idle at start: the bubble)
        t0 = mb * 1e-3
        evs.append(Ev(0, "compute", "aten.mm", "gemm", t0, t0 + 0.7e-3, "fwd"))
        evs.append(Ev(0, "compute", "flash_attn", "attention", t0 + 0.7e-3, t0 + 1e-3, "fwd"))
        evs.append(Ev(0, "p2p", "act", "send", t0 + 1e-3, t0 + 1.1e-3, info=P2PInfo(1, 1 << 20)))
        evs.append(Ev(1, "p2p", "act", "recv", t0 + 1e-3, t0 + 1.1e-3, info=P2PInfo(0, 1 << 20)))
        evs.append(Ev(1, "compute", "aten.mm", "gemm", t0 + 1.1e-3, t0 + 2e-3, "fwd"))
    for r in (0, 1):
        evs.append(Ev(r, "compute", "aten.mm_bwd", "gemm", 5.2e-3, 7e-3, "bwd"))
        evs.append(Ev(r, "compute", "layernorm", "norm", 7e-3, 7.3e-3, "bwd"))
        evs.append(Ev(r, "comm", "dp_grad", "nccl:all_reduce", 6e-3, 8e-3,
                      info=CollectiveInfo("ring", "ll", 8, 1 << 24)))
        evs.append(Ev(r, "compute", "adam", "optimizer", 8e-3, 8.5e-3, "opt"))
    return evs


def assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_MAGIC


def test_gantt_lanes_and_png(tmp_path):
    info = plot_gantt(pipeline_events(), tmp_path / "g" / "gantt.png", title="2-stage pipeline")
    assert_png(info.path)
    assert info.n_lanes == 6
    assert info.lanes == [(0, "compute"), (0, "comm"), (0, "p2p"), (1, "compute"), (1, "comm"), (1, "p2p")]
    assert info.ranks_shown == [0, 1] and info.n_bars == len(pipeline_events())
    assert {"gemm fwd", "gemm bwd", "attention fwd", "nccl all_reduce", "send", "recv", "optimizer"} <= \
        set(info.groups)


def test_gantt_caps_ranks(tmp_path):
    evs = []
    for r in range(32):
        for s, cat in (("compute", "gemm"), ("comm", "nccl:all_gather")):
            for k in range(320):  # 32 ranks x 2 streams x 320 = 20 480 bars
                t = k * 1e-4
                evs.append(Ev(r, s, "k", cat, t, t + 0.6e-4, "fwd" if k % 2 else "bwd"))
    info = plot_gantt(evs, tmp_path / "big.png", max_ranks=8)
    assert info.ranks_shown == [0, 1, 2, 3, 28, 29, 30, 31]
    assert info.n_lanes == 16 and info.n_bars == 8 * 2 * 320
    assert_png(info.path)
    info = plot_gantt(evs, tmp_path / "sel.png", ranks=[3, 5])
    assert info.ranks_shown == [3, 5]
    with pytest.raises(ValueError, match="time_unit"):
        plot_gantt(evs, tmp_path / "x.png", time_unit="min")


def test_gantt_helpers():
    assert select_ranks(list(range(10)), 4) == [0, 1, 8, 9]
    assert select_ranks([3, 1, 2], 16) == [1, 2, 3]
    assert category_style("gemm", "fwd")[1] != category_style("gemm", "bwd")[1]
    assert category_style("nccl:all_reduce")[0] == "nccl all_reduce"
    assert category_style("softmax", "fwd")[0] == "other compute fwd"
    # the hierarchical mode's macro tasks are whole layer passes, not "other" kernels
    assert category_style("macro", "bwd")[0] == "layer pass (kernels + TP comm) bwd"
    assert category_style("macro", "fwd")[1] not in {category_style(k, "fwd")[1] for k in ("gemm", "softmax")}


def link(name, cap, timeline, carried=None):
    ns = SimpleNamespace(name=name, nominal_capacity=cap, timeline=timeline)
    if carried is not None:
        ns.carried = carried
    return ns


def test_link_utilisation_png(tmp_path):
    # Link i runs at (i + 1) / 9 of 450 GB/s from 0.3*i ms to 0.3*i + 5 ms: busier as i grows.
    links = [link(f"n0.gpu{i}->nvswitch0", 450e9,
                  [(0.3e-3 * i, 450e9 * (i + 1) / 9), (0.3e-3 * i + 5e-3, 0.0)]) for i in range(9)]
    names = plot_link_utilisation(links, tmp_path / "links.png", top=4, title="links")
    assert names == [f"n0.gpu{i}->nvswitch0" for i in (8, 7, 6, 5)]
    assert_png(tmp_path / "links.png")
    assert plot_link_utilisation([], tmp_path / "none.png") == []
    assert_png(tmp_path / "none.png")


def test_breakdown_png(tmp_path):
    bd = {r: {"compute_s": 5e-3 + 1e-4 * r, "exposed_comm_s": 1e-3, "bubble_s": 2e-3 * (r % 4 == 3),
              "idle_s": 0.2e-3} for r in range(8)}
    shown = plot_breakdown(bd, tmp_path / "bd.png", title="breakdown")
    assert shown == list(range(8))
    assert_png(tmp_path / "bd.png")
    many = {r: {"compute_s": 1.0} for r in range(200)}
    shown = plot_breakdown(many, tmp_path / "many.png", max_ranks=64)
    assert len(shown) == 64 and shown[0] == 0 and shown[-1] == 199
    assert downsample_ranks([5, 1, 3], 10) == [1, 3, 5]


def test_sweep_png(tmp_path):
    rows = [{"gpus": g, "tp": tp, "tokens_per_s": 1000.0 * g / tp}
            for g in (8, 16, 32, 64) for tp in (1, 2, 8)]
    rows.append({"gpus": 128, "tp": 1, "tokens_per_s": None})  # an OOM point: skipped
    labels = plot_sweep(rows, "gpus", "tokens_per_s", tmp_path / "sweep.png", group="tp", logx=True,
                        xlabel="GPUs", ylabel="throughput (tokens/s)", title="scaling")
    assert labels == ["1", "2", "8"]
    assert_png(tmp_path / "sweep.png")
    assert plot_sweep(rows, "gpus", "tokens_per_s", tmp_path / "one.png") == ["tokens_per_s"]


def test_links_of_equal_load_share_one_panel(tmp_path):
    """Eight links with the same load (a symmetric collective's) are one panel, "(+7 alike)", as the text
    report's "name (+k)" row; a busier link keeps its own."""
    same = [link(f"n{i}.nic0->leaf0", 25e9, [(0.0, 12.5e9), (1e-3, 0.0)], carried=12.5e6) for i in range(8)]
    busy = link("n9.nic0->leaf0", 25e9, [(0.0, 25e9), (1e-3, 0.0)], carried=25e6)
    names = plot_link_utilisation([*same, busy], tmp_path / "links.png", top=4, end_time_s=1e-3)
    assert names == ["n9.nic0->leaf0", "n0.nic0->leaf0"]
