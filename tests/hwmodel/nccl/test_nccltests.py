"""nccl-tests conventions (hwmodel.nccl.nccltests)."""

import json

import pytest

from hwmodel.nccl import nccltests as N
from hwmodel.nccl.channels import CommTopology
from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.topology import build_system


def test_busbw_factors():
    assert N.busbw_factor("all_reduce", 8) == pytest.approx(14 / 8)
    assert N.busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert N.busbw_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert N.busbw_factor("alltoall", 8) == pytest.approx(7 / 8)
    assert N.busbw_factor("all_to_all", 16) == pytest.approx(15 / 16)
    assert N.busbw_factor("broadcast", 8) == 1.0
    assert N.busbw_factor("reduce", 8) == 1.0
    assert N.busbw_factor("sendrecv", 8) == 1.0
    assert N.busbw_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="all_reduce"):
        N.busbw_factor("gather", 8)


def test_parse_size_and_sweep():
    assert N.parse_size("8G") == 8 * 2**30
    assert N.parse_size("32k") == 32768
    assert N.parse_size("1M") == 2**20
    assert N.parse_size("1.5M") == 1572864
    assert N.parse_size("100") == 100
    assert N.parse_size(4096) == 4096
    for bad in ("8T", "", "G", "-1", "1 GB"):
        with pytest.raises(ValueError):
            N.parse_size(bad)
    assert N.size_sweep("32K", "1M") == [2**15, 2**16, 2**17, 2**18, 2**19, 2**20]
    assert N.size_sweep(8, 64, factor=4) == [8, 32]
    assert N.size_sweep(100, 400, factor=1, step_bytes=100) == [100, 200, 300, 400]
    with pytest.raises(ValueError):
        N.size_sweep("1M", "1K")


def test_counts_sizes_and_bandwidths():
    assert N.dtype_size("bf16") == 2 and N.dtype_size("float") == 4 and N.dtype_size("fp8") == 1
    with pytest.raises(ValueError):
        N.dtype_size("complex64")
    # all_reduce: count = size / 4; S = size.
    assert N.element_count("all_reduce", 2**20, "float", 8) == 262144
    assert N.nccltests_size_bytes("all_reduce", 2**20, "float", 8) == 2**20
    # all_gather: per-rank count, 16-byte aligned; S = count * 4 * nranks.
    assert N.element_count("all_gather", 2**20, "float", 8) == 32768
    assert N.element_count("all_gather", 1000, "float", 3) == 80  # (250 // 3 = 83) & ~3
    assert N.nccltests_size_bytes("all_gather", 1000, "float", 3) == 960
    assert N.algbw_Bps(2**30, 0.01) == pytest.approx(2**30 / 0.01)
    assert N.busbw_Bps("all_reduce", 1e9, 1.0, 8) == pytest.approx(1.75e9)
    row = N.make_row("broadcast", 2**20, 1e-3, 8, "half")
    assert (row.redop, row.root, row.count) == ("none", 0, 2**19)
    assert row.busbw_Bps == pytest.approx(row.algbw_Bps)


GOLDEN = """\
# Collective test starting: all_reduce_perf (trainsim model)
# nThread 1 nGpus 8 minBytes 32768 maxBytes 1073741824 step: 2(factor) warmup iters: 0 iters: 1 \
agg iters: 1 validation: 0 graph: 0 unalign: 0
#
#                                                              out-of-place            trainsim
#       size         count      type   redop    root     time   algbw   busbw    algo   proto
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)
       32768          8192     float     sum      -1    15.70    2.09    3.65    ring      ll
  1073741824     268435456     float     sum      -1  7885.40  136.17  238.29    ring  simple
# Avg bus bandwidth    : 120.974
#
"""


def test_format_table_golden():
    rows = [
        N.make_row("all_reduce", 32768, 15.7e-6, 8, "float", algorithm="ring", protocol="ll"),
        N.make_row("all_reduce", 2**30, 7885.4e-6, 8, "float", algorithm="ring", protocol="simple"),
    ]
    assert N.format_table(rows, step_factor=2) == GOLDEN
    with pytest.raises(ValueError):
        N.format_table([])


def test_float_str_like_nccl_tests():
    assert N._float_str(15.7, 7) == "  15.70"
    assert N._float_str(123456.7, 7) == " 123457"
    assert N._float_str(1234567.0, 7) == "1234567"
    assert N._float_str(12345678.0, 7) == "1.2e+07"


def test_rows_to_json():
    rows = [N.make_row("all_gather", 2**20, 100e-6, 8, "bf16", algorithm="ring", protocol="simple")]
    recs = N.rows_to_json(rows)
    assert json.loads(json.dumps(recs)) == recs
    r = recs[0]
    assert r["size_bytes"] == 2**20 and r["count"] == 65536 and r["type"] == "bfloat16"
    assert r["time_us"] == pytest.approx(100.0)
    assert r["algbw_GBps"] == pytest.approx(2**20 / 100e-6 / 1e9)
    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 7 / 8)
    assert (r["algorithm"], r["protocol"]) == ("ring", "simple")


def test_model_rows_against_measured_a100():
    """NCCL's own model vs. the measured 8x A100 all-reduce (validation/nccl_tests_a100_8gpu.csv):
    at 1 GiB the model's busbw (ring simple, 240 GB/s) is within 5% of the measured 229 GB/s."""
    topo = CommTopology.from_system("ampere", 1, 8, 240.0, 25.0, 8, "amd")
    rows = N.model_rows("all_reduce", topo, N.size_sweep("32K", "1G", factor=32))
    assert [r.size_bytes for r in rows] == [2**15, 2**20, 2**25, 2**30]
    assert rows[-1].algorithm == "ring" and rows[-1].protocol == "simple"
    assert rows[-1].busbw_Bps / 1e9 == pytest.approx(229.04, rel=0.05)
    assert rows[0].protocol == "ll"


def test_cli_sweep_on_four_h100_nodes_shows_nvls_tree(tmp_path, capsys):
    """``trainsim nccl-tests all_reduce -b 1M -e 8G -f 4 -g 8 --nodes 4 --system dgx-h100``: the algorithm
    NCCL 2.30.7's model picks per size on 32 H100 (4 nodes, NVLS graph 8 ch @ 40/48 GB/s), by hand:

    * Tree/LL128 (65.5 us, algBw 116 GB/s x treeCorrectionFactor) vs NVLSTree (25 + 2*2*20.9 = 108.6 us,
      algBw 8*45.5*32/62 = 187.87 GB/s): at 4 MiB (factor 0.8) 110.7 vs 130.9 us -> Tree; at 16 MiB
      (factor 0.9) 226.2 vs 197.9 us -> NVLSTree.
    * NVLSTree vs Ring/Simple (282.8 us x 1.4 plateau = 395.9 us, algBw 384*32/62 = 198.19 GB/s): equal at
      (395.9 - 108.6) us / (1/187.87 - 1/198.19) ns/B = 1.036 GB, so 256 MiB is NVLSTree and 1 GiB Ring.
    The 1 MiB row is host-bound (-g 8: 41.3 + 2.5 x 16 channels = 81.3 us); the NVLSTree rows take
    NCCL's chunk pipeline's time (64 KiB chunks through 6 hops from 4 nodes: slower than the model's
    latency + S/algBw, which pays no fill).
    """
    from scenarios.cli import main

    path = tmp_path / "rows.json"
    argv = ["nccl-tests", "all_reduce", "-b", "1M", "-e", "8G", "-f", "4", "-g", "8", "--nodes", "4",
            "--system", "dgx-h100", "--json", str(path)]
    assert main(argv) == 0
    rows = json.loads(path.read_text())
    picked = [(r["size_bytes"], r["algorithm"], r["protocol"]) for r in rows]
    assert picked == [(1 << 20, "tree", "ll128"), (1 << 22, "tree", "ll128"), (1 << 24, "nvls_tree", "simple"),
                      (1 << 26, "nvls_tree", "simple"), (1 << 28, "nvls_tree", "simple"),
                      (1 << 30, "ring", "simple"), (1 << 32, "ring", "simple")]
    assert rows[0]["time_us"] == pytest.approx(81.3, rel=1e-6)
    topo = build_system("dgx-h100", 4)
    chunked = simulate_nccl_tests(topo, "all_reduce", [r["size_bytes"] for r in rows[2:5]], gpus_per_thread=8,
                                  fidelity="chunked")
    for r, c in zip(rows[2:5], chunked, strict=True):  # NCCL's chunk pipeline, the chunked fidelity's time
        assert r["time_us"] == pytest.approx(c.time_s * 1e6, rel=1e-6)
        assert r["time_us"] > 108.6 + r["size_bytes"] / (8 * 45.5e3 * 32 / 62)  # fill of 64 KiB chunks
    out = capsys.readouterr().out
    assert "nvls_tree  simple" in out and out.count("nvls_tree") == 3


def test_algo_column_widens_for_nvls_tree_and_stays_aligned():
    rows = [N.make_row("all_reduce", 2**24, 197.9e-6, 32, "float", algorithm="nvls_tree", protocol="simple"),
            N.make_row("all_reduce", 2**30, 6006.4e-6, 32, "float", algorithm="ring", protocol="simple")]
    lines = N.format_table(rows).splitlines()
    header = next(ln for ln in lines if "algo" in ln and "size" in ln)
    data = [ln for ln in lines if not ln.startswith("#")]
    end = header.index("algo") + len("algo")
    assert [ln[end - len("nvls_tree"):end] for ln in data] == ["nvls_tree", "     ring"]
    assert all(len(ln) == len(data[0]) for ln in data)
