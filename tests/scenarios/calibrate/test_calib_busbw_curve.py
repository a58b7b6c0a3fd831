"""The fitted busbw correction: reproduces a real nccl-tests log in and out of sample, and the simulator's
collective path (so ``run`` too) applies it only where the profile holds it."""

from pathlib import Path

import pytest

from hwmodel import calibration_overlay as O
from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import calibration as nccl_cal
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.topology import build_system
from scenarios.calibrate import CalibrationInputError
from scenarios.calibrate.fit_nccl import fit_nccl, held_out_sizes
from scenarios.calibrate.nccl_log import read_nccl_log
from scenarios.calibrate.profile import write_profile
from scenarios.cli import main

DATA = Path(__file__).resolve().parents[2] / "data"
A100_LOG = DATA / "nccl_tests_a100_8gpu.log"
MiB = 1 << 20


@pytest.fixture(scope="module")
def a100_fit():
    return fit_nccl(read_nccl_log(A100_LOG), "dgx-a100")


def test_fitted_profile_reproduces_the_log_in_and_out_of_sample(a100_fit):
    band = [c for c in a100_fit.comparison if c["size_bytes"] >= MiB]
    assert len(band) == 15
    # acceptance: within 5 % at every size >= 1 MiB with the profile fitted to the log
    assert max(abs(c["error"]) for c in band) <= 0.05
    # ... and within 10 % on the sizes held out of a fit to the others (2^odd held out: 7 of them)
    held = [c for c in band if c["held_out"]]
    assert [c["size_bytes"] for c in held] == [2 * MiB << (2 * i) for i in range(7)]
    assert max(abs(c["held_out_error"]) for c in held if c["size_bytes"] != 8 * MiB) <= 0.10
    # KNOWN GAP (regression value): under NCCL's chunk pipeline 8 MiB's GPU time is just below the -g 8
    # host floor, so its factor (0.62 in the full fit) is not the interpolation of 4 MiB's (host-bound,
    # 1.0) and 16 MiB's (0.54)
    assert {c["size_bytes"]: c for c in held}[8 * MiB]["held_out_error"] == pytest.approx(0.243, abs=0.02)
    # the mid band the tuning model misses (8-256 MiB was 15-55 % off with global constants only)
    assert abs({c["size_bytes"]: c for c in band}[16 * MiB]["error"]) <= 0.05
    # few knots: the curve is pruned, not one knot per size
    assert 2 <= a100_fit.curve_knots <= 10


def test_held_out_sizes():
    assert held_out_sizes([1, 2, 4, 8, 16]) == {2, 8}
    assert held_out_sizes([3, 5, 7, 9]) == {5, 9}


def _profile(tmp_path, fit) -> O.Overlay:
    return O.load_overlay(write_profile(tmp_path / "p.toml", {"profile": {"name": "a100"}, "nccl": fit.sections}))


def test_nccl_tests_with_the_profile_matches_the_log(tmp_path, a100_fit, capsys):
    prof = tmp_path / "p.toml"
    write_profile(prof, {"profile": {"name": "a100"}, "nccl": a100_fit.sections})
    assert main(["nccl-tests", "all_reduce", "-b", "16M", "-e", "64M", "-f", "2", "-g", "8", "--nodes", "1",
                 "--system", "dgx-a100", "--calibration", str(prof)]) == 0
    out = capsys.readouterr().out
    assert "nccl.busbw_correction.ampere.all_reduce_8ranks_1nodes.factor" in out.splitlines()[0]
    measured = {r.size_bytes: r.busbw_Bps / 1e9 for r in read_nccl_log(A100_LOG).rows}
    rows = {int(t[0]): float(t[7]) for t in (line.split() for line in out.splitlines())
            if t and t[0].isdigit()}
    assert sorted(rows) == [16 * MiB, 32 * MiB, 64 * MiB]
    for size, busbw in rows.items():
        assert busbw == pytest.approx(measured[size], rel=0.05), size


def test_engine_applies_the_curve_only_where_the_profile_holds_it(tmp_path, a100_fit):
    ov = _profile(tmp_path, a100_fit)
    topo = build_system("dgx-a100", 1)
    gpus = tuple(topo.gpus())
    coll = Collective("all_reduce", 16 * MiB, tuple(range(8)))

    def time_of(collective, group, **kw) -> float:
        eng = NcclEngine(Cluster(topo, record=False), **kw)
        done = eng.run(collective, group)
        eng.env.run(until=done)
        return eng.env.now

    shipped = time_of(coll, gpus)
    with O.applied(ov):
        factor = nccl_cal.busbw_correction("ampere", "all_reduce", 8, 1, 16 * MiB)
        assert factor == pytest.approx(106.16 / 196.75, rel=0.05)  # measured / shipped model busbw there
        fitted = time_of(coll, gpus)
        # time alone = shipped time / factor (the NVLink fraction refit moves it by < 0.5 %)
        assert fitted == pytest.approx(shipped / factor, rel=0.01)
        # another group size, another collective, a forced algorithm: no curve, no change
        assert nccl_cal.busbw_correction("ampere", "all_reduce", 4, 1, 16 * MiB) == 1.0
        assert nccl_cal.busbw_correction("ampere", "all_gather", 8, 1, 16 * MiB) == 1.0
        assert nccl_cal.busbw_correction("hopper", "all_reduce", 8, 1, 16 * MiB) == 1.0
        forced = NcclEngine(Cluster(topo, record=False), algorithm="ring").plan(coll, gpus)
        assert forced.busbw_correction == 1.0
        # clamped outside the knots: the end knots' factors
        assert nccl_cal.busbw_correction("ampere", "all_reduce", 8, 1, 1 << 40) == \
            nccl_cal.busbw_correction("ampere", "all_reduce", 8, 1, 16 << 30)
    # host_fit_gpus is the GPU count the host fit refers to, not a constant: not listed
    assert ov.applying_to("H100-SXM5-80GB", "hopper") == ("nccl.host_launch_s", "nccl.host_per_channel_s")
    assert time_of(coll, gpus) == shipped  # inactive again: the shipped model, exactly


def test_simulated_sweep_matches_the_fit(a100_fit, tmp_path):
    ov = _profile(tmp_path, a100_fit)
    topo = build_system("dgx-a100", 1)
    with O.applied(ov):
        rows = simulate_nccl_tests(topo, "all_reduce", [8 * MiB, 128 * MiB], gpus_per_thread=8)
    by = {c["size_bytes"]: c["simulated_busbw_GBps"] for c in a100_fit.comparison}
    for r in rows:
        assert r.busbw_Bps / 1e9 == pytest.approx(by[r.size_bytes], rel=1e-6)


@pytest.mark.parametrize(("table", "message"), [
    ({"collective": "all_reduce", "ranks": 8, "nodes": 1, "log2_size_bytes": [20.0, 19.0], "factor": [1.0, 1.0]},
     "must increase"),
    ({"collective": "all_reduce", "ranks": 8, "nodes": 1, "log2_size_bytes": [20.0], "factor": [0.0]}, "> 0"),
    ({"collective": "all_reduce", "ranks": 8, "log2_size_bytes": [20.0], "factor": [1.0]}, "needs collective"),
])
def test_bad_curve_tables(tmp_path, table, message):
    """Refused when the profile is loaded, naming the table, before any collective reads it."""
    path = write_profile(tmp_path / "p.toml", {
        "profile": {"name": "bad"}, "nccl": {"busbw_correction": {"ampere": {"c": table}}}})
    with pytest.raises(ValueError, match=message) as err:
        O.load_overlay(path)
    assert "[nccl.busbw_correction.ampere.c]" in str(err.value) and "\n" not in str(err.value)


def test_a_flow_fitted_curve_under_another_fidelity_is_named(tmp_path, a100_fit):
    """The curve corrects the default (flow) model it was fitted against; a run at another fidelity says
    that it does not reproduce the log there, and a flow run does not."""
    from scenarios.runner import run_scenario
    from scenarios.scenario import load_scenario

    ov = _profile(tmp_path, a100_fit)
    with O.applied(ov):  # the default scenario (DGX A100), cut to 4 layers
        warned = [run_scenario(load_scenario(None, ["model.num_layers=4", f'simulation.fidelity="{f}"']))
                  .metrics.get("warnings", []) for f in ("flow", "chunked")]
    assert not any("busbw-vs-size correction" in w for w in warned[0])
    assert any('fitted under fidelity = "flow"' in w and 'fidelity = "chunked"' in w for w in warned[1])


@pytest.fixture(scope="module")
def chunked_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("chunked") / "a100-chunked.toml"
    assert main(["calibrate", "--nccl-log", str(A100_LOG), "--system", "dgx-a100", "--fidelity", "chunked",
                 "--output", str(out)]) == 0
    return out


def _nccl_tests(profile, fidelity, capsys) -> tuple[dict[int, float], str, str]:
    assert main(["nccl-tests", "all_reduce", "-b", "8M", "-e", "32M", "-f", "2", "-g", "8", "--system", "dgx-a100",
                 "--fidelity", fidelity, "--calibration", str(profile)]) == 0
    cap = capsys.readouterr()
    rows = {int(t[0]): float(t[7]) for t in (line.split() for line in cap.out.splitlines()) if t and t[0].isdigit()}
    return rows, cap.out, cap.err


def test_calibrate_fits_against_the_fidelity_it_is_given(chunked_profile, capsys):
    """``calibrate --fidelity chunked`` fits the curve on NCCL's chunk pipeline: ``nccl-tests --fidelity
    chunked`` with it reproduces the log (8 MiB included, where the host enqueue of -g 8 partly masks the
    GPU time), silently; the same profile under ``flow`` is named as fitted elsewhere."""
    import tomllib

    doc = tomllib.loads(chunked_profile.read_text())
    assert doc["nccl"]["busbw_correction"]["ampere"]["all_reduce_8ranks_1nodes"]["fidelity"] == "chunked"
    fit = doc["fit"]["nccl"][0]
    assert fit["fidelity"] == "chunked"
    assert max(abs(c["error"]) for c in fit["sizes"] if c["size_bytes"] >= MiB) <= 0.05
    measured = {r.size_bytes: r.busbw_Bps / 1e9 for r in read_nccl_log(A100_LOG).rows}
    rows, _, err = _nccl_tests(chunked_profile, "chunked", capsys)
    assert "warning" not in err
    for size, busbw in rows.items():
        assert busbw == pytest.approx(measured[size], rel=0.05), size
    _, _, err = _nccl_tests(chunked_profile, "flow", capsys)
    assert 'fitted under fidelity = "chunked"' in err and 'under fidelity = "flow"' in err


def test_nccl_tests_warns_on_a_flow_fitted_curve_under_chunked(tmp_path, a100_fit, capsys):
    prof = write_profile(tmp_path / "p.toml", {"profile": {"name": "a100"}, "nccl": a100_fit.sections})
    _, _, err = _nccl_tests(prof, "chunked", capsys)
    assert len(err.strip().splitlines()) == 1  # one line, as run's warning
    assert 'fitted under fidelity = "flow"' in err and 'under fidelity = "chunked"' in err
    _, _, err = _nccl_tests(prof, "flow", capsys)
    assert "warning" not in err


def test_nccl_tests_lists_only_the_constants_that_apply(tmp_path, a100_fit, capsys):
    """A profile holding V100 (Volta) constants beside the A100 fit: on a DGX A100 only the A100 ones are
    listed, as ``run`` lists them; a Volta-only profile changes nothing there, and says so."""
    both = write_profile(tmp_path / "both.toml", {
        "profile": {"name": "both"}, "gpu": {"V100-SXM2": {"launch_overhead_s": 5e-6}},
        "nccl": {**a100_fit.sections, "nvlink_efficiency": {
            **a100_fit.sections["nvlink_efficiency"], "volta": {"busbw_Bps": 100e9, "line_rate_Bps": 150e9}}}})
    _, out, err = _nccl_tests(both, "flow", capsys)
    header = out.splitlines()[0]
    assert "nccl.nvlink_efficiency.ampere.busbw_Bps" in header and "busbw_correction.ampere" in header
    assert "V100" not in header and "volta" not in header and "line_rate_Bps" not in header
    volta = write_profile(tmp_path / "volta.toml", {"profile": {"name": "volta"},
                                                    "gpu": {"V100-SXM2": {"launch_overhead_s": 5e-6}}})
    _, out, err = _nccl_tests(volta, "flow", capsys)
    assert "nothing for this GPU" in out.splitlines()[0]
    assert "changes nothing for this run on A100" in err


def test_too_few_rows_leave_the_bandwidth_fraction_unfitted(tmp_path, capsys):
    lines = A100_LOG.read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
    short = tmp_path / "three.log"  # 64 MiB, 128 MiB, 256 MiB
    keep = set(rows[11:14])
    short.write_text("\n".join(line for i, line in enumerate(lines) if i not in rows or i in keep) + "\n")
    fit = fit_nccl(read_nccl_log(short), "dgx-a100")
    assert "nvlink_efficiency" not in fit.sections
    assert not any(k.startswith("nccl.nvlink_efficiency") for k, _, _ in fit.changed)
    assert len(fit.not_fitted) == 2 and fit.curve_knots == 0
    assert "nccl.nvlink_efficiency.ampere: not fitted" in fit.not_fitted[0] and "at least 4" in fit.not_fitted[0]
    # nor a busbw correction: held at its end values, three sizes would move every other size
    assert "busbw_correction.ampere.all_reduce_8ranks_1nodes: not fitted: 3 size(s)" in fit.not_fitted[1]
    assert "busbw_correction" not in fit.sections
    out = tmp_path / "p.toml"
    assert main(["calibrate", "--nccl-log", str(short), "--system", "dgx-a100", "--output", str(out)]) == 0
    assert "at least 4" in capsys.readouterr().out


def test_fidelity_needs_an_nccl_log(capsys):
    assert main(["calibrate", "--measured", "iteration_time_s=1", "--scenario", "default",
                 "--fidelity", "chunked"]) == 2
    assert "--fidelity applies to --nccl-log" in capsys.readouterr().err


def test_a_log_without_its_header_or_of_one_rank_is_a_clear_error(tmp_path):
    lines = A100_LOG.read_text().splitlines()
    bare = tmp_path / "all_reduce_perf.log"  # result rows only: the rank count is unknown
    bare.write_text("\n".join(line for line in lines if line.strip()[:1].isdigit()) + "\n")
    with pytest.raises(CalibrationInputError, match="cannot tell how many GPUs ran it"):
        read_nccl_log(bare)
    assert main(["calibrate", "--nccl-log", str(bare), "--system", "dgx-a100"]) == 2
    one = tmp_path / "one.log"
    one.write_text("\n".join(line.replace("nGpus 8", "nGpus 1") for line in lines
                             if "Rank" not in line or "Rank  0" in line) + "\n")
    with pytest.raises(CalibrationInputError, match="ran on one GPU"):
        read_nccl_log(one)


def test_another_collectives_curve_under_another_fidelity_warns_of_nothing(tmp_path, a100_fit, capsys):
    """The profile's busbw correction is for all_reduce on 8 ranks: an all_gather sweep under chunked does
    not apply it, so nothing is said of the fidelity it was fitted under; an all_reduce on 4 ranks (another
    communicator shape) neither."""
    prof = write_profile(tmp_path / "p.toml", {"profile": {"name": "a100"}, "nccl": a100_fit.sections})
    for coll, gpus in (("all_gather", "8"), ("all_reduce", "4")):
        assert main(["nccl-tests", coll, "-b", "8M", "-e", "8M", "-g", gpus, "--system", "dgx-a100",
                     "--fidelity", "chunked", "--calibration", str(prof)]) == 0
        err = capsys.readouterr().err
        assert "fitted under" not in err, (coll, gpus)


def test_fidelity_warning_names_only_the_curves_used(tmp_path, a100_fit):
    ov = _profile(tmp_path, a100_fit)
    with O.applied(ov):
        key = next(iter(nccl_cal.busbw_curves()))
        assert key == ("ampere", "all_reduce", 8, 1)
        assert nccl_cal.fidelity_warning("a100", "chunked", set()) is None
        assert nccl_cal.fidelity_warning("a100", "chunked", {("ampere", "all_gather", 8, 1)}) is None
        assert nccl_cal.fidelity_warning("a100", "flow", {key}) is None
        assert 'fitted under fidelity = "flow"' in nccl_cal.fidelity_warning("a100", "chunked", {key})
        with nccl_cal.recording_corrections() as used:
            nccl_cal.busbw_correction("ampere", "all_gather", 8, 1, MiB)
            nccl_cal.busbw_correction("ampere", "all_reduce", 8, 1, MiB)
        # every shape priced is recorded (the group-size check needs them); the fidelity check reads the curves
        assert used == {key, ("ampere", "all_gather", 8, 1)}
        assert nccl_cal.fidelity_warning("a100", "flow", used) is None
