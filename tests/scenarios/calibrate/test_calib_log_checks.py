"""What ``calibrate --nccl-log`` refuses or warns about in a log: rows faster than the hardware (a unit
error), garbled rows, and a bandwidth fraction measured on a partial node."""

import re
from pathlib import Path

import pytest
import tomllib

from hwmodel.nccl.nccltests import busbw_factor
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.fit_nccl import _topology, busbw_bound_Bps, check_busbw, fit_nccl
from scenarios.calibrate.nccl_log import NcclLog, NcclRow, read_nccl_log
from scenarios.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
A100_LOG = DATA / "nccl_tests_a100_8gpu.log"
_ROW = re.compile(r"^(\s*\d+\s+\d+\s+\S+\s+\S+\s+-?\d+\s+)(\S+)\s+(\S+)\s+(\S+)(.*)$")


def _in_ms(text: str) -> str:
    """``text`` with every out-of-place time 1000x too small (ms written where nccl-tests prints us), algbw
    and busbw recomputed from it, as a log post-processed with the wrong unit reads."""
    def scale(m: re.Match) -> str:
        t, a, b = float(m.group(2)), float(m.group(3)), float(m.group(4))
        return f"{m.group(1)}{t / 1000:.5f} {a * 1000:.2f} {b * 1000:.2f}{m.group(5)}"
    return "\n".join(_ROW.sub(scale, line) for line in text.splitlines()) + "\n"


def test_a_log_in_the_wrong_time_unit_is_refused(tmp_path, capsys):
    log = tmp_path / "ms.log"
    log.write_text(_in_ms(A100_LOG.read_text()))
    first = read_nccl_log(log).rows[0]
    assert first.busbw_Bps == pytest.approx(1310e9)  # 1.31 GB/s x 1000
    with pytest.raises(CalibrationInputError, match=r"the 32768-byte row has busbw 1310 GB/s, above the 525 GB/s"):
        fit_nccl(read_nccl_log(log), "dgx-a100")
    out = tmp_path / "ms.toml"
    assert main(["calibrate", "--nccl-log", str(log), "--system", "dgx-a100", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "32768-byte row" in err and "12 x 25 GB/s" in err
    assert not out.exists()


def test_the_published_a100_log_is_within_the_bound():
    log = read_nccl_log(A100_LOG)
    topo, _ = _topology(log, "dgx-a100")
    check_busbw(log, topo, "dgx-a100")  # 234.89 GB/s peak busbw, nothing refused
    bound, _ = busbw_bound_Bps(log, topo)
    # all-reduce of 8: algbw <= the 12 x 25 GB/s NVLink line rate, busbw = algbw x 2(n-1)/n
    assert bound == pytest.approx(300e9 * 2 * 7 / 8)


def _log(collective: str, ranks: int, nodes: int, busbw_GBps: float) -> NcclLog:
    row = NcclRow(1 << 30, 1.0, busbw_GBps * 1e9, busbw_GBps * 1e9)
    return NcclLog("x.log", collective, [row], ranks, nodes, 1)


@pytest.mark.parametrize(("system", "collective", "ranks", "bound_GBps"), [
    ("dgx-a100", "all_reduce", 2, 300.0),  # 2(n-1)/n = 1: the line rate
    ("dgx-a100", "all_gather", 8, 300.0),
    ("dgx-h100", "all_reduce", 8, 450.0 * 1.75),  # NVLS: 478.87 GB/s measured on 8x H100 (Azure ND H100 v5)
])
def test_single_node_bound_is_the_nvlink_line_rate(system, collective, ranks, bound_GBps):
    log = _log(collective, ranks, 1, 1.0)
    topo, _ = _topology(log, system)
    assert busbw_bound_Bps(log, topo)[0] == pytest.approx(bound_GBps * 1e9)


def test_h100_nvls_busbw_above_the_line_rate_is_accepted():
    log = _log("all_reduce", 8, 1, 478.87)  # NCCL_ALGO=NVLS all_reduce_perf -g 8, 8 GiB (Azure ND H100 v5)
    topo, _ = _topology(log, "dgx-h100")
    check_busbw(log, topo, "dgx-h100")
    with pytest.raises(CalibrationInputError, match="above the 450 GB/s"):
        check_busbw(_log("all_gather", 8, 1, 478.87), topo, "dgx-h100")


def test_multi_node_bound_is_the_nics():
    log = _log("all_reduce", 16, 2, 1.0)
    topo, _ = _topology(log, "dgx-a100")
    nic_Bps = topo.nics_per_node * topo.nic_spec.bandwidth_Bps
    assert topo.nics_per_node == 8 and topo.nic_spec.bandwidth_Bps == pytest.approx(25e9)
    bound, why = busbw_bound_Bps(log, topo)
    assert bound == pytest.approx(nic_Bps * busbw_factor("all_reduce", 16) * 2)
    assert "8 x" in why
    with pytest.raises(CalibrationInputError, match="16-rank all_reduce on 2 node"):
        check_busbw(_log("all_reduce", 16, 2, bound / 1e9 * 1.01), topo, "dgx-a100")


def test_a_garbled_row_is_named_by_its_line(tmp_path, capsys):
    lines = A100_LOG.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.split()[:1] == ["8388608"])
    lines[i] = "  8388608  2097152  float sum"  # cut off mid-row
    lines.insert(i + 1, "     16777216       4194304     float     sum      -1    27x.60")
    log_path = tmp_path / "trunc.log"
    log_path.write_text("\n".join(lines) + "\n")
    log = read_nccl_log(log_path)
    assert [n for n, _ in log.skipped] == [i + 1, i + 2]
    assert 8388608 not in {r.size_bytes for r in log.rows} and len(log.rows) == 20 - 1
    assert read_nccl_log(A100_LOG).skipped == []
    out = tmp_path / "trunc.toml"
    assert main(["calibrate", "--nccl-log", str(log_path), "--system", "dgx-a100", "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"trunc.log:{i + 1}: not a complete nccl-tests result row" in err
    assert f"trunc.log:{i + 2}:" in err
    assert tomllib.loads(out.read_text())["fit"]["nccl"][0]["skipped_lines"] == [i + 1, i + 2]


def test_zero_size_rows_and_debug_lines_are_not_garbled(tmp_path):
    text = ("# Collective test starting: all_reduce_perf\n# nThread 1 nGpus 2\n"
            "node:1:1 [0] NCCL INFO 1048576 Bytes -> Algo 1 proto 2 time 30.1\n"
            "[1] 2 coll channels\n"
            "           0             0     float     sum      -1     0.11    0.00    0.00      0     0.10    0.00"
            "    0.00      0\n"
            "1048576  262144  float  sum  -1  101.9  10.29  10.29  0  101.9  10.29  10.29  0\n")
    (tmp_path / "z.log").write_text(text)
    log = read_nccl_log(tmp_path / "z.log")
    assert log.skipped == [] and [r.size_bytes for r in log.rows] == [1048576]


def _partial_node_log(tmp_path: Path, ranks: int) -> Path:
    """The 8x A100 log's header cut to ``ranks`` GPUs (its busbw is within the 2-GPU bound too)."""
    lines = [line.replace("nGpus 8", f"nGpus {ranks}") for line in A100_LOG.read_text().splitlines()
             if not re.search(r"Rank\s+(\d+)", line) or int(re.search(r"Rank\s+(\d+)", line).group(1)) < ranks]
    path = tmp_path / f"ar{ranks}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_partial_node_fit_warns_and_records_its_group_size(tmp_path, capsys):
    log = _partial_node_log(tmp_path, 2)
    out = tmp_path / "ar2.toml"
    assert main(["calibrate", "--nccl-log", str(log), "--system", "dgx-a100", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "nccl.nvlink_efficiency.ampere measured on 2-rank all_reduce (1 node(s)); applied to collectives of " \
           "every group size" in captured.out
    assert "fitted to 2 of the node's 8 GPUs" in captured.err and "all_reduce_perf -g 8" in captured.err
    fit = tomllib.loads(out.read_text())["fit"]["nccl"][0]
    eff = next(c for c in fit["changed"] if c["path"] == "nccl.nvlink_efficiency.ampere")
    assert (fit["ranks"], eff["fitted_ranks"], eff["fitted_nodes"]) == (2, 2, 1)


def test_a_full_node_fit_does_not_warn(tmp_path, capsys):
    out = tmp_path / "ar8.toml"
    assert main(["calibrate", "--nccl-log", str(A100_LOG), "--system", "dgx-a100", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "measured on 8-rank all_reduce" in captured.out
    assert "of the node's" not in captured.err


def test_a_partial_node_profile_warns_where_it_prices_other_group_sizes(tmp_path, capsys):
    from hwmodel import calibration_overlay as O
    from hwmodel.nccl import calibration as nccl_cal

    out = tmp_path / "ar2.toml"
    assert main(["calibrate", "--nccl-log", str(_partial_node_log(tmp_path, 2)), "--system", "dgx-a100",
                 "--output", str(out)]) == 0
    row = tomllib.loads(out.read_text())["nccl"]["nvlink_efficiency"]["ampere"]
    assert (row["ranks"], row["nodes"]) == (2, 1)
    with O.applied(O.load_overlay(out)):
        assert nccl_cal.group_size_warning("ar2", {("ampere", "all_reduce", 2, 1)}) is None
        assert nccl_cal.group_size_warning("ar2", {("hopper", "all_reduce", 8, 1)}) is None
        warning = nccl_cal.group_size_warning("ar2", {("ampere", "all_reduce", 2, 1), ("ampere", "all_gather", 8, 1)})
        assert "fitted to 2-rank nccl-tests and prices this run's collectives of 8 ranks too" in warning
        assert nccl_cal.group_size_warning("ar2", {("ampere", "all_reduce", 4, 2)}) is None  # 2 per node
        assert "of 32 ranks on 4 nodes too" in nccl_cal.group_size_warning("ar2", {("ampere", "all_reduce", 32, 4)})
    capsys.readouterr()
    assert main(["nccl-tests", "all_reduce", "--system", "dgx-a100", "-g", "8", "-b", "1M", "-e", "1M",
                 "--calibration", str(out)]) == 0
    assert "prices this run's collectives of 8 ranks" in capsys.readouterr().err
    assert main(["nccl-tests", "all_reduce", "--system", "dgx-a100", "-g", "2", "-b", "1M", "-e", "1M",
                 "--calibration", str(out)]) == 0
    assert "prices this run's" not in capsys.readouterr().err
