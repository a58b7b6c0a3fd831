"""Chrome/Kineto trace export: units, metadata, counters, no overlapping slices, per-rank files."""

import gzip
import json
from collections import defaultdict
from types import SimpleNamespace

import pytest

from hwmodel.runtime import CollectiveInfo, KernelInfo, MemcpyInfo, P2PInfo, TraceEvent
from plots.chrome_trace import (
    NETWORK_PID,
    kineto_kernel_name,
    stream_tids,
    to_chrome_trace,
    write_chrome_trace,
    write_per_rank_traces,
)

Ev = TraceEvent  # the runtime's own record


def events():
    return [
        Ev(0, "compute", 0, "aten.mm", "gemm", 0.0, 1.25e-3, "fwd", "layers.0.mlp", KernelInfo(2e12, 1.0e-3)),
        Ev(0, "compute", 1, "flash_attn_bwd", "attention", 1.25e-3, 2.0e-3, "bwd", "layers.0.attn"),
        Ev(0, "comm", 2, "dp_grad", "nccl:all_reduce", 1.5e-3, 3.1e-3, info=CollectiveInfo("ring", "ll", 8, 1 << 20)),
        Ev(0, "p2p", 3, "act", "send", 0.5e-3, 0.7e-3, info=P2PInfo(1, 4096)),
        Ev(1, "compute", 0, "aten.mm", "gemm", 0.7e-3, 1.9e-3, "fwd"),
        Ev(1, "comm", 1, "dp_grad", "nccl:all_reduce", 2.0e-3, 3.1e-3, info=CollectiveInfo("ring", "ll", 8, 1 << 20)),
        Ev(1, "p2p", 2, "act", "recv", 0.1e-3, 0.7e-3, info=P2PInfo(0, 4096)),
        Ev(1, "copy", 3, "memcpy_h2d", "memcpy", 0.0, 0.3e-3, info=MemcpyInfo(1 << 16)),
    ]


def slices(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_complete_events_in_microseconds_with_kineto_fields():
    doc = to_chrome_trace(events())
    xs = slices(doc)
    assert len(xs) == len(events())
    by_key = {(e["pid"], e["args"]["label"] if "label" in e["args"] else e["name"], e["ts"]): e for e in xs}
    mm = by_key[(0, "aten.mm", 0.0)]
    assert mm["cat"] == "kernel" and mm["dur"] == pytest.approx(1250.0, abs=1e-9)
    assert mm["tid"] == 7 and mm["args"]["stream"] == 7 and mm["args"]["device"] == 0
    assert mm["args"]["kind"] == "gemm" and mm["args"]["phase"] == "fwd"
    assert mm["args"]["layer"] == "layers.0.mlp" and "correlation" in mm["args"]
    for ev in events():
        match = [e for e in xs if e["pid"] == ev.rank and e["ts"] == pytest.approx(ev.start_s * 1e6, abs=1e-9)
                 and e["dur"] == pytest.approx((ev.end_s - ev.start_s) * 1e6, abs=1e-9)]
        assert len(match) >= 1, ev
    ar = [e for e in xs if e["args"].get("Collective name") == "all_reduce"]
    assert {e["name"] for e in ar} == {"ncclDevKernel_AllReduce_Sum_bf16_RING_LL"}
    assert ar[0]["cat"] == "kernel"
    assert ar[0]["args"]["algorithm"] == "ring" and ar[0]["args"]["protocol"] == "ll"
    assert ar[0]["args"]["channels"] == 8 and ar[0]["args"]["size_bytes"] == 1 << 20
    memcpy = [e for e in xs if e["cat"] == "gpu_memcpy"]
    assert memcpy and memcpy[0]["name"] == "Memcpy HtoD"
    assert memcpy[0]["args"]["size_bytes"] == 1 << 16
    send = [e for e in xs if e["args"].get("Collective name") == "send"]
    assert send[0]["args"]["peer"] == 1 and send[0]["args"]["size_bytes"] == 4096
    assert mm["args"]["info"] == [2e12, 1.0e-3]  # KernelInfo's fields in order: flops, solo_time_s
    assert {e["name"] for e in xs if e["args"].get("Collective name") in ("send", "recv")} == {
        "ncclDevKernel_SendRecv"}


def test_top_level_keys_and_metadata():
    doc = to_chrome_trace(events(), metadata={"traceName": "unit"})
    assert doc["schemaVersion"] == 1 and doc["displayTimeUnit"] == "ms"
    assert isinstance(doc["deviceProperties"], list)
    assert doc["distributedInfo"]["world_size"] == 2 and doc["distributedInfo"]["rank"] == 0
    assert doc["traceName"] == "unit"
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    names = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert names == {(0, "GPU 0"), (1, "GPU 1")}
    assert {e["pid"] for e in meta if e["name"] == "process_sort_index"} == {0, 1}
    threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    assert threads == {(e["pid"], e["tid"]) for e in slices(doc)}
    tids = stream_tids(["p2p", "compute", "comm", "copy"])
    assert tids == {"compute": 7, "comm": 8, "p2p": 9, "copy": 10}
    # The same mapping regardless of which ranks hold which streams.
    assert {e["tid"] for e in slices(doc) if e["args"].get("Collective name") == "recv"} == {9}
    json.loads(json.dumps(doc))


def test_link_counters_in_network_process():
    link = SimpleNamespace(name="gpu0->sw", nominal_capacity=100e9, carried=5e7,
                           timeline=[(0.0, 0.0), (1e-3, 50e9), (2e-3, 50e9), (3e-3, 0.0)])
    doc = to_chrome_trace(events(), link_series=[link])
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [c["ts"] for c in counters] == [0.0, 1000.0, 3000.0]  # repeated value dropped
    assert [c["args"]["util %"] for c in counters] == [0.0, 50.0, 0.0]
    assert {c["pid"] for c in counters} == {NETWORK_PID}
    assert counters[0]["name"].startswith("gpu0->sw")
    pname = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["pid"] == NETWORK_PID
             and e["name"] == "process_name"]
    assert pname[0]["args"]["name"] == "Network"
    # Mapping input: fractions.
    doc2 = to_chrome_trace([], link_series={"l": [(0.0, 0.25)]})
    assert [c["args"]["util %"] for c in doc2["traceEvents"] if c["ph"] == "C"] == [25.0]


def test_busiest_links_ranked_by_utilisation_not_bytes():
    """``max_links`` keeps the links the report and links.png rank busiest (carried over capacity): a
    saturated 25 GB/s NIC link before a 450 GB/s NVLink link that carried more bytes at 7 %."""
    nvlink = SimpleNamespace(name="n0.gpu0->nvswitch", nominal_capacity=450e9, carried=31.5e6,
                             timeline=[(0.0, 31.5e9), (1e-3, 0.0)])
    nic = SimpleNamespace(name="n0.nic0->leaf0", nominal_capacity=25e9, carried=25e6,
                          timeline=[(0.0, 25e9), (1e-3, 0.0)])
    doc = to_chrome_trace(events(), link_series=[nvlink, nic], max_links=1)
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "C"} == {"n0.nic0->leaf0 (25 GB/s)"}


def _assert_no_overlaps(doc):
    lanes = defaultdict(list)
    for e in slices(doc):
        lanes[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
    for spans in lanes.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end


def test_no_overlapping_slices_per_thread():
    doc = to_chrome_trace(events())
    _assert_no_overlaps(doc)
    # Back-to-back kernels still touch exactly (integer nanoseconds).
    comp0 = sorted((e for e in slices(doc) if e["pid"] == 0 and e["tid"] == 7), key=lambda e: e["ts"])
    assert round((comp0[0]["ts"] + comp0[0]["dur"]) * 1000) == round(comp0[1]["ts"] * 1000)
    # Overlapping events on one stream (should not happen) are moved to an extra thread.
    bad = events() + [Ev(0, "compute", 9, "stray", "elementwise", 1.0e-3, 1.5e-3, "fwd")]
    doc = to_chrome_trace(bad)
    _assert_no_overlaps(doc)
    stray = [e for e in slices(doc) if e["name"] == "stray"][0]
    assert stray["tid"] == 1007
    tnames = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert "overlap 1" in tnames[1007]


def test_write_files_round_trip(tmp_path):
    p = write_chrome_trace(tmp_path / "t.json", events(), iterations=[(0.0, 3.1e-3)])
    doc = json.loads(p.read_text())
    assert len(slices(doc)) == len(events()) + 2  # plus ProfilerStep#0 on each GPU
    steps = [e for e in slices(doc) if e["name"] == "ProfilerStep#0"]
    assert {e["pid"] for e in steps} == {0, 1} and steps[0]["cat"] == "user_annotation"
    pz = write_chrome_trace(tmp_path / "t.json.gz", events())
    with gzip.open(pz, "rt") as fh:
        assert len(slices(json.load(fh))) == len(events())


def test_per_rank_files_hold_only_their_rank(tmp_path):
    paths = write_per_rank_traces(tmp_path / "traces", events())
    assert [p.name for p in paths] == ["rank-0.json", "rank-1.json"]
    tid_by_stream = {}
    for r, p in enumerate(paths):
        doc = json.loads(p.read_text())
        assert doc["distributedInfo"]["rank"] == r and doc["distributedInfo"]["world_size"] == 2
        assert {e["pid"] for e in doc["traceEvents"]} == {r}
        assert len(slices(doc)) == sum(1 for e in events() if e.rank == r)
        for e in doc["traceEvents"]:
            if e["ph"] == "M" and e["name"] == "thread_name":
                tid_by_stream.setdefault(e["args"]["name"], set()).add(e["tid"])
    # Stream ids agree across the files.
    assert all(len(t) == 1 for t in tid_by_stream.values())
    paths = write_per_rank_traces(tmp_path / "with_links", events(), links_rank=0,
                                  link_series={"l": [(0.0, 1.0)]})
    assert any(e["ph"] == "C" for e in json.loads(paths[0].read_text())["traceEvents"])
    assert not any(e["ph"] == "C" for e in json.loads(paths[1].read_text())["traceEvents"])


def test_kineto_kernel_names():
    assert kineto_kernel_name("all_reduce", "ring", "ll") == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert kineto_kernel_name("reduce_scatter", "ring", "simple", "fp32") == \
        "ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE"
    assert kineto_kernel_name("all_gather", "nvls", "simple") == "ncclDevKernel_AllGather_NVLS_SIMPLE"
    assert kineto_kernel_name("all_to_all") == "ncclDevKernel_SendRecv"


def test_real_trace_event_type():
    import hwmodel.runtime as runtime
    ev = runtime.TraceEvent(0, "compute", 0, "aten.mm", "gemm", 0.0, 1e-3, "fwd", "l0")
    doc = to_chrome_trace([ev])
    assert slices(doc)[0]["dur"] == pytest.approx(1000.0)


def test_collective_dtype_comes_from_the_collective():
    """An fp32 gradient reduce-scatter in a bf16 run: its own dtype in the kernel name, the args and the
    element count (nccl-tests' S is the whole buffer: 4 MiB of fp32 = 1 Mi elements)."""
    from hwmodel.cluster import Cluster
    from hwmodel.ir import Collective, Program
    from hwmodel.runtime import Runtime
    from hwmodel.topology import build_system

    size = 4 << 20
    progs = []
    for r in range(2):
        p = Program(r)
        p.add(Collective("reduce_scatter", size, (0, 1), dtype="fp32", name="fsdp_rs_L0"), "comm")
        p.add(Collective("all_gather", size, (0, 1), name="fsdp_ag_L0"), "comm")  # default bf16
        progs.append(p)
    topo = build_system("dgx-a100", 1)
    res = Runtime(Cluster(topo, record=False), progs, placement={0: "n0.gpu0", 1: "n0.gpu1"}).run()
    rs, ag = [e for e in res.events if e.rank == 0]
    assert (rs.dtype, ag.dtype) == ("fp32", "bf16")
    doc = to_chrome_trace([rs, ag])
    a, b = slices(doc)
    assert a["name"].startswith("ncclDevKernel_ReduceScatter_Sum_f32_")
    assert a["args"]["dtype"] == "fp32" and a["args"]["size_bytes"] == size
    assert a["args"]["In msg nelems"] == size // 4
    assert b["args"]["dtype"] == "bf16" and b["args"]["In msg nelems"] == size // 2
