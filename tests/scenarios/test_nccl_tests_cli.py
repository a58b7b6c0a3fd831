"""``trainsim nccl-tests`` and the nccl-tests emulation against measured 8x A100 data.

Measured rows: ``tests/data/nccl_tests_a100_8gpu.csv`` (copied with its source columns from the
project's validation set: stas00/ml-engineering, nccl-tests ``all_reduce_perf -b 32k -e 16G -f 2 -g 8``
on one 8x A100 SXM4 NVSwitch node, NCCL version not stated).
"""

import csv
import json
from pathlib import Path

import pytest

from hwmodel.nccl.engine import simulate_nccl_tests
from hwmodel.nccl.tuner_config import load_tuner_config
from hwmodel.topology import build_system
from scenarios.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "nccl_tests_a100_8gpu.csv"
GOLDEN = ROOT / "scenarios" / "golden" / "nccl_tests_all_reduce_dgx_a100_g8.txt"
TUNER = ROOT / "tests" / "data" / "nccl_tuner_a100_tree_midband.conf"
MiB = 1 << 20


def _measured():
    with DATA.open() as fh:
        return {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def sweep():
    meas = _measured()
    rows = simulate_nccl_tests(build_system("dgx-a100", 1), "all_reduce_perf", sorted(meas), gpus_per_thread=8)
    return {r.size_bytes: (r, meas[r.size_bytes]) for r in rows}


def _errors(sweep, lo, hi):
    return {s: r.busbw_Bps / 1e9 / m - 1 for s, (r, m) in sweep.items() if lo <= s < hi}


def test_band_below_1MB_host_enqueue_floor_within_30_percent(sweep):
    # 32 KiB .. 512 KiB: bounded by the single thread enqueueing 8 GPUs (fitted constants); the fit
    # is in fact within 2 %.
    err = _errors(sweep, 0, MiB)
    assert len(err) == 5
    assert max(abs(e) for e in err.values()) < 0.02


def test_band_1MB_to_64MB_within_15_percent_only_up_to_8MB(sweep):
    err = _errors(sweep, MiB, 64 * MiB)
    ok = {s: e for s, e in err.items() if s <= 4 * MiB}
    assert len(ok) == 3 and max(abs(e) for e in ok.values()) < 0.02  # host floor, 1..4 MiB
    # KNOWN GAP (see the report): 8, 16, 32 MiB are predicted too fast -- NCCL 2.30.7's tuner picks
    # Ring LL128/Simple, the measured run behaves like Tree. Asserted at the error the model gives
    # (regression values: NCCL's chunk pipeline, which streams each ring step's latency under the
    # transfer, `python bench/nccl_chunked_vs_measured.py` prints them).
    assert err[8 * MiB] == pytest.approx(0.318, abs=0.02)
    assert err[16 * MiB] == pytest.approx(0.853, abs=0.03)
    assert err[32 * MiB] == pytest.approx(0.620, abs=0.02)


def test_band_64MB_and_up_within_6_percent_from_512MB(sweep):
    err = _errors(sweep, 64 * MiB, 1 << 40)
    big = {s: e for s, e in err.items() if s >= 512 * MiB}
    assert len(big) == 6
    assert max(abs(e) for e in big.values()) < 0.06  # +5.2 % at 512 MiB, within 2.4 % from 1 GiB
    # KNOWN GAP: 64..256 MiB measured ~100-111 GB/s algbw (Tree-like); the model's Ring is 20-34 % faster.
    mid = {s: e for s, e in err.items() if s < 512 * MiB}
    assert len(mid) == 3
    assert min(mid.values()) > 0.18 and max(mid.values()) < 0.36


def test_forcing_tree_reproduces_the_8MB_to_32MB_band():
    # Evidence for the Tree hypothesis (not the default): with NCCL_ALGO=Tree (LL128 there) the model is
    # within 5 % at 8 and 32 MiB; 16 MiB stays 22 % fast (a dip in the measurement). From 64 MiB Tree
    # runs Simple, whose 512 KiB chunks cross the 14 hops of a one-node chain store-and-forward: the
    # pipeline's fill makes it 39-68 % slower than measured at 64-256 MiB (regression values), so
    # Tree/Simple as NCCL's chunking gives it does not explain that band.
    meas = _measured()
    sizes = [s for s in sorted(meas) if 8 * MiB <= s <= 256 * MiB]
    rows = simulate_nccl_tests(build_system("dgx-a100", 1), "all_reduce", sizes, gpus_per_thread=8,
                               algorithm="tree")
    err = {r.size_bytes: r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 for r in rows}
    assert all(r.algorithm == "tree" for r in rows)
    assert max(abs(e) for s, e in err.items() if s in (8 * MiB, 32 * MiB)) < 0.05
    assert err[16 * MiB] == pytest.approx(0.22, abs=0.02)
    assert err[64 * MiB] == pytest.approx(-0.682, abs=0.02)
    assert err[256 * MiB] == pytest.approx(-0.391, abs=0.02)


def test_replaying_the_inferred_tree_choice_with_tuner_rules():
    """The same hypothesis through the tuner-plugin path a user would take (``--tuner-config``):
    every band then meets its tolerance except the 16 MiB row, which matches neither algorithm, and
    the Tree/Simple rows 64-256 MiB (see the test above)."""
    meas = _measured()
    rows = simulate_nccl_tests(build_system("dgx-a100", 1), "all_reduce", sorted(meas), gpus_per_thread=8,
                               tuner_config=load_tuner_config(TUNER))
    err = {r.size_bytes: r.busbw_Bps / 1e9 / meas[r.size_bytes] - 1 for r in rows}
    algo = {r.size_bytes: (r.algorithm, r.protocol) for r in rows}
    assert algo[8 * MiB] == ("tree", "ll128") and algo[256 * MiB] == ("tree", "simple")
    assert algo[512 * MiB] == ("ring", "simple")
    assert max(abs(e) for s, e in err.items() if s < MiB) < 0.30
    assert max(abs(e) for s, e in err.items() if MiB <= s < 64 * MiB and s != 16 * MiB) < 0.15
    assert max(abs(e) for s, e in err.items() if s >= 512 * MiB) < 0.06
    assert max(err[s] for s in err if 64 * MiB <= s <= 256 * MiB) < -0.35  # Tree/Simple's fill
    assert err[16 * MiB] == pytest.approx(0.22, abs=0.02)


def test_cli_tuner_config(tmp_path, capsys):
    path = tmp_path / "rows.json"
    assert main(["nccl-tests", "all_reduce", "-b", "64M", "-e", "1G", "-f", "4", "-g", "8",
                 "--tuner-config", str(TUNER), "--json", str(path)]) == 0
    assert "tuner rules" in capsys.readouterr().out
    assert [(r["size_bytes"], r["algorithm"]) for r in json.loads(path.read_text())] == [
        (64 * MiB, "tree"), (256 * MiB, "tree"), (1 << 30, "ring")]
    bad = tmp_path / "bad.conf"
    bad.write_text("allreduce,0,1,ring,fast,-1,1,-1\n")
    assert main(["nccl-tests", "all_reduce", "--tuner-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--tuner-config" in err and "protocol 'fast' unknown" in err and len(err.strip().splitlines()) == 1


def test_host_floor_only_with_several_gpus_per_thread():
    topo = build_system("dgx-a100", 1)
    one = simulate_nccl_tests(topo, "all_reduce", [32768], gpus_per_thread=1)[0]
    eight = simulate_nccl_tests(topo, "all_reduce", [32768], gpus_per_thread=8)[0]
    assert eight.time_s == pytest.approx(41.3e-6 + 2.5e-6 * 1, rel=1e-9)  # 1 channel at 32 KiB (Ring LL)
    assert one.time_s < 0.75 * eight.time_s


def test_cli_output_matches_golden(capsys):
    assert main(["nccl-tests", "all_reduce_perf", "-b", "32K", "-e", "16G", "-f", "2", "-g", "8",
                 "--nodes", "1", "--system", "dgx-a100"]) == 0
    out = capsys.readouterr().out
    assert out == GOLDEN.read_text()
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(lines) == 20
    first = lines[0].split()
    assert first[:5] == ["32768", "8192", "float", "sum", "-1"]
    assert float(first[5]) == pytest.approx(43.8, abs=0.05)


@pytest.mark.parametrize("name", ["all_reduce", "all_reduce_perf", "allreduce"])
def test_cli_names_json_and_overrides(tmp_path, capsys, name):
    path = tmp_path / "rows.json"
    assert main(["nccl-tests", name, "-b", "1M", "-e", "4M", "-g", "8", "--algo", "ring", "--proto", "simple",
                 "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    assert [r["size_bytes"] for r in rows] == [MiB, 2 * MiB, 4 * MiB]
    for r in rows:
        assert {"size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "algorithm", "protocol"} <= set(r)
        assert (r["algorithm"], r["protocol"]) == ("ring", "simple")
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 14 / 8)
    assert "NCCL_ALGO=ring" in capsys.readouterr().out


@pytest.mark.parametrize("coll,factor", [("all_gather", 7 / 8), ("reduce_scatter", 7 / 8), ("broadcast", 1.0),
                                         ("reduce", 1.0), ("alltoall", 7 / 8), ("sendrecv", 1.0)])
def test_cli_every_collective(tmp_path, coll, factor):
    path = tmp_path / "rows.json"
    assert main(["nccl-tests", coll, "-b", "64M", "-e", "64M", "-g", "8", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)
    assert 10 < row["busbw_GBps"] < 300


def test_cli_multi_node_step_fidelity(tmp_path):
    path = tmp_path / "rows.json"
    assert main(["nccl-tests", "all_reduce", "-b", "256M", "-e", "256M", "-g", "8", "--nodes", "2",
                 "--fidelity", "step", "--json", str(path)]) == 0
    (row,) = json.loads(path.read_text())
    assert row["busbw_GBps"] == pytest.approx(8 * 25 * 0.94, rel=0.1)  # 8 HDR rails


def test_cli_chunked_fidelity(tmp_path, capsys):
    path = tmp_path / "rows.json"
    argv = ["nccl-tests", "all_reduce", "-b", "1M", "-e", "4G", "-f", "64", "-g", "8", "--json", str(path)]
    assert main([*argv, "--fidelity", "chunked"]) == 0
    assert "fidelity chunked" in capsys.readouterr().out
    chunked = json.loads(path.read_text())
    assert main(argv) == 0
    flow = json.loads(path.read_text())
    # flow is the same pipeline in closed form (hwmodel/nccl/pipeline_closed.py)
    for c, f in zip(chunked, flow, strict=True):
        assert c["busbw_GBps"] == pytest.approx(f["busbw_GBps"], rel=0.02)


def test_cli_nvls_on_h100(tmp_path):
    path = tmp_path / "rows.json"
    assert main(["nccl-tests", "all_reduce", "-b", "1G", "-e", "1G", "-g", "8", "--system", "dgx-h100",
                 "--json", str(path)]) == 0
    assert json.loads(path.read_text())[0]["algorithm"] == "nvls"


@pytest.mark.parametrize("argv,msg", [
    (["gather"], "unknown collective"),
    (["all_reduce", "--system", "dgx-z9"], "system"),
    (["all_reduce", "-b", "8T"], "invalid size"),
    (["all_reduce", "-g", "9"], "only 8 GPUs"),
    (["all_reduce", "-g", "8", "--algo", "nvls"], "nvls"),
    (["all_reduce", "--proto", "fast"], "protocol"),
    (["all_reduce", "-d", "complex"], "dtype"),
])
def test_cli_errors_are_one_line_exit_2(capsys, argv, msg):
    assert main(["nccl-tests", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_scenario_file_with_only_a_system_section_describes_the_cluster(tmp_path):
    """nccl-tests uses only ``[system]``: a file without ``[model]`` is enough, and gives the same result as
    the same cluster named by options (2 DGX H100 over their NICs)."""
    sys_only = tmp_path / "cluster.toml"
    sys_only.write_text('[system]\nname = "dgx-h100"\nnodes = 2\n')
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["nccl-tests", "all_reduce", "-b", "64M", "-e", "64M", "-g", "8", "--scenario", str(sys_only),
                 "--json", str(a)]) == 0
    assert main(["nccl-tests", "all_reduce", "-b", "64M", "-e", "64M", "-g", "8", "--system", "dgx-h100",
                 "--nodes", "2", "--json", str(b)]) == 0
    assert json.loads(a.read_text()) == json.loads(b.read_text())
    bad = tmp_path / "bad.toml"
    bad.write_text("[system\n")
    assert main(["nccl-tests", "all_reduce", "--scenario", str(bad)]) == 2
