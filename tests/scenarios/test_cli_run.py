"""``trainsim run``, ``list`` and ``synth`` end to end, as a user runs them (in process, through
``scenarios.cli.main``). The default scenario is simulated twice (about 2 s each)."""

import contextlib
import io
import json
import re

import pytest

from scenarios.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The default scenario run with every output, and its JSON from a second run (capsys is per test,
    so output is captured by hand)."""
    d = tmp_path_factory.mktemp("run")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["run", "--json", str(d / "a.json"), "--trace", str(d / "trace.json"), "--plots", str(d / "plots")])
        rc2 = main(["run", "--json", str(d / "b.json")])
    return {"dir": d, "rc": (rc, rc2), "out": out.getvalue(), "err": err.getvalue()}


def test_default_run_succeeds_quietly(default_run):
    assert default_run["rc"] == (0, 0)
    assert default_run["err"] == ""


def test_report_has_every_section_with_numbers(default_run):
    text = default_run["out"]
    metrics = json.loads((default_run["dir"] / "a.json").read_text())
    for needle in ("Scenario    default", "System      dgx-a100: 4 node(s) x 8 GPUs = 32 x A100-SXM4-80GB",
                   "Parallel    TP 8 x PP 2 x DP 2", "sequence parallel", "Throughput", "TFLOP/s per GPU",
                   "Megatron-LM (Narayanan et al. SC'21 eq. 3)", "pipeline bubble", "exposed communication",
                   "Per rank", "Memory per GPU", "verdict: fits", "Busiest links", "nic0->su0.leaf0",
                   "communication hidden under compute", "compute slowed by contention", "Simulation  mode symmetric"):
        assert needle in text, needle
    shown_ms = float(re.search(r"Iteration time\s+([\d,.]+) ms", text).group(1).replace(",", ""))
    assert shown_ms == pytest.approx(metrics["iteration_time_s"] * 1e3, abs=0.006)
    mfu = float(re.search(r"MFU\s+([\d.]+) %", text).group(1))
    assert mfu == pytest.approx(100 * metrics["mfu"], abs=0.06)
    # The four parts of the breakdown add up to the iteration.
    assert sum(metrics["breakdown"].values()) == pytest.approx(metrics["iteration_time_s"], rel=1e-6)


def test_json_is_byte_identical_across_runs_and_has_si_keys(default_run):
    a = (default_run["dir"] / "a.json").read_bytes()
    assert a == (default_run["dir"] / "b.json").read_bytes()
    m = json.loads(a)
    assert list(m) == sorted(m)
    assert "wall_s" not in a.decode()
    assert m["scenario"] == "default" and m["system"]["gpus"] == 32 and m["oom"] is False
    assert 0.1 < m["iteration_time_s"] < 5 and 0.05 < m["mfu"] < 0.8
    assert m["parallel"]["tp"] == 8 and m["parallel"]["pp"] == 2 and m["parallel"]["dp"] == 2


def test_trace_is_kineto_json_with_link_counters(default_run):
    doc = json.loads((default_run["dir"] / "trace.json").read_text())
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    assert len(kernels) > 1000
    assert any(e["name"].startswith("ncclDevKernel_") for e in kernels)
    links = {e["name"] for e in events if e.get("ph") == "C"}
    assert len(links) == 16  # the 16 busiest links as counter tracks


def test_trace_names_the_jobs_world_size_and_its_simulated_ranks(default_run):
    """32 GPUs (4 DGX A100), of which the symmetric run simulates a few: ``world_size`` is the job's, the
    ranks in the file are listed apart, and every process and thread with events is named."""
    doc = json.loads((default_run["dir"] / "trace.json").read_text())
    metrics = json.loads((default_run["dir"] / "a.json").read_text())
    events = doc["traceEvents"]
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 32}
    gpu_pids = sorted({e["pid"] for e in events if e.get("ph") == "X"})
    assert doc["trainsim"]["simulated_ranks"] == gpu_pids == [d["id"] for d in doc["deviceProperties"]]
    assert len(gpu_pids) == metrics["simulation"]["simulated_ranks"] < 32
    process = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert all(process[p] == f"GPU {p}" for p in gpu_pids)
    assert {process[e["pid"]] for e in events if e.get("ph") == "C"} == {"Network"}
    streams = {thread[(e["pid"], e["tid"])] for e in events if e.get("ph") == "X"}  # KeyError: an unnamed one
    assert {"stream 7 compute", "stream 8 dp", "host"} <= streams  # Kineto: "stream <tid> <name>"


def test_plots_writes_three_pngs(default_run):
    for name in ("gantt.png", "links.png", "breakdown.png"):
        data = (default_run["dir"] / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_oom_configuration_exits_3_with_the_numbers(capsys):
    rc = main(["run", "--set", "model.num_layers=96", "--set", "system.nodes=1",
               "--set", "parallel.pipeline_model_parallel_size=1"])
    cap = capsys.readouterr()
    assert rc == 3
    assert cap.err.count("\n") == 1 and cap.err.startswith("OOM: default: needs ")
    # reserved + CUDA context + NCCL buffers against the A100 80 GB's usable 85,100,068,864 bytes
    assert re.search(r"needs [\d.]+ GB > 85\.1 GB usable HBM \(.*reserved [\d.]+ GB", cap.err)
    assert "Memory per GPU (peak, busiest pipeline stage): OOM" in cap.out and "Not simulated" in cap.out


def test_list_prints_known_names(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("gpt3-175b", "llama3-70b", "mixtral-8x7b", "resnet-50", "dgx-a100", "dgx-h100", "dgx-b200",
                 "A100-SXM4-80GB", "H100-SXM5", "ConnectX-7-NDR", "sc21-gpt-1t", "whatif-nic-bandwidth"):
        assert name in out, name
    assert "174.62 B" in out  # GPT-3 175B, trainsim's count
    assert main(["list", "scenarios"]) == 0
    out = capsys.readouterr().out
    assert "[sweep] What if" in out and "Zoo models" not in out


@pytest.mark.parametrize(("table", "header", "footnotes"), [
    ("zoo_table", "arch", 1), ("systems_table", "GPU", 0), ("gpus_table", "arch", 1), ("nics_table", "bandwidth", 1),
    ("switches_table", "kind", 1)])
def test_list_columns_stay_aligned_under_long_names(table, header, footnotes):
    """The second column starts where its header does on every row (ends, where right-aligned), even past
    the longest name (qwen3-235b-a22b, meta-llama3-roce-24k, H100-SXM5-96GB-500W used to push their rows
    out of line)."""
    from scenarios import cmd_list

    lines = getattr(cmd_list, table)().splitlines()
    rows = lines[1:len(lines) - footnotes]
    first_width = max(len(r.split()[0]) for r in rows)
    start, end = lines[0].index(header), lines[0].index(header) + len(header)
    assert len(rows) >= 4 and first_width < start
    for row in rows:
        cell = row[first_width:].lstrip()
        at = len(row) - len(cell)
        assert row[first_width:at].strip() == "" and (at == start or at + len(cell.split()[0]) == end), row


def test_links_name_their_kind_in_the_json_and_the_text(tmp_path, capsys):
    """4 DGX A100 on a two-tier fat tree (2 nodes per leaf): NIC, leaf-to-spine, PCIe and NVLink links, each
    JSON row with the kind and capacity the text table prints, and a per-kind line for the fabric's tier."""
    out = tmp_path / "m.json"
    assert main(["run", "--set", "system.nodes=4", "--set", "system.nodes_per_leaf=2", "--set",
                 'system.fabric="fat_tree"', "--set", "parallel.pipeline_model_parallel_size=1",
                 "--set", "model.num_layers=1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["busiest_links"]
    kinds = {r["kind"]: r["capacity_Bps"] for r in rows}
    assert kinds["nic"] == 25e9 and kinds["pcie"] == 32e9 and kinds["nvlink"] == 300e9  # HDR 200 Gb/s; Gen4 x16
    assert kinds["leaf-spine"] == 16 * 25e9  # a leaf's uplinks carry its 2 nodes' 16 NICs (1:1)
    for r in rows[:6]:
        label = r["link"] if r["links"] == 1 else f"{r['link']} (+{r['links'] - 1})"
        row = rf"^\s+{re.escape(label)}\s+{r['kind']}\s+{r['links']}\s.* {r['capacity_Bps'] / 1e9:.0f} GB/s "
        assert re.search(row, text, re.M), label
    assert re.search(r"^\s+fabric \(leaf to spine\)\s+leaf\d->spine\d .* 400 GB/s", text, re.M)


def test_one_representative_rank_is_singular(capsys):
    """PP 1: one rank simulated for all 32 (TP 8 x DP 4), said in the singular."""
    assert main(["run", "--set", "parallel.pipeline_model_parallel_size=1", "--set", "model.num_layers=1"]) == 0
    out = capsys.readouterr().out
    assert "Per rank (1 representative rank simulated; the others mirror it)" in out


def test_list_nics_and_switches_print_rates_with_their_units(capsys):
    """EDR is 100 Gb/s = 12.5 GB/s (not "12"); the switches fabric_switch takes are listed, by name and alias."""
    assert main(["list", "nics"]) == 0
    nics = capsys.readouterr().out
    assert re.search(r"^ConnectX-5-EDR\s+100 Gb/s = 12\.5 GB/s\s+.*\bedr\b", nics, re.M)
    assert main(["list", "switches"]) == 0
    switches = capsys.readouterr().out
    assert re.search(r"^QM9700\s+ib\s+64\s+400 Gb/s = 50 GB/s\s+150 ns\s+quantum-2\b", switches, re.M)
    assert re.search(r"^SB7800\s+ib\s+36\s+100 Gb/s = 12\.5 GB/s", switches, re.M)
    assert main(["run", "--set", 'system.fabric_switch="quantum-2"', "--set", "system.nodes=1",
                 "--set", "parallel.pipeline_model_parallel_size=1", "--set", "model.num_layers=1"]) == 0


def test_synth_prints_placements(tmp_path, capsys):
    rc = main(["synth", "--system", "dgx-a100", "--nodes", "1", "--axes", "dp=4,tp=2", "--reduce", "dp",
               "--size", "16M", "--top", "2", "--json", str(tmp_path / "s.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "P2 synthesis: dgx-a100, 1 node(s)" in out and "16 MiB per device" in out
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["axes"] == {"dp": 4, "tp": 2} and doc["reduce"] == ["dp"] and len(doc["cases"]) >= 1


@pytest.mark.parametrize("args, message", [
    (["--axes", "dp=16,tp=4", "--reduce", "dp"], "multiply to 64, but the hierarchy has 32 devices"),
    (["--axes", "dp=16,tp=2", "--reduce", "pp"], "--reduce 'pp': unknown axis pp; axes: dp, tp"),
    (["--axes", "dp16", "--reduce", "dp"], "expected name=size"),
    (["--axes", "dp=16,tp=2", "--reduce", "dp", "--size", "lots"], "invalid size 'lots'"),
])
def test_synth_bad_input_is_one_line(capsys, args, message):
    assert main(["synth", "--system", "dgx-a100", "--nodes", "4", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_nccl_tuner_config_in_a_scenario(default_run, tmp_path, capsys):
    """``[simulation] nccl_tuner_config``: rules limiting every TP/DP collective to 2 channels make
    communication slower, so the iteration is longer than the default run's; a bad file is one line."""
    rules = tmp_path / "two_channels.conf"
    rules.write_text("".join(f"{c},0,4294967295,ring,simple,2,-1,-1\n"
                             for c in ("allreduce", "allgather", "reducescatter")))
    out = tmp_path / "slow.json"
    assert main(["run", "--set", f"simulation.nccl_tuner_config={rules}", "--json", str(out)]) == 0
    capsys.readouterr()
    base = json.loads((default_run["dir"] / "a.json").read_text())
    slow = json.loads(out.read_text())
    assert slow["iteration_time_s"] > 1.05 * base["iteration_time_s"]
    rules.write_text("allreduce,0,10,ring,simple\n")
    assert main(["run", "--set", f"simulation.nccl_tuner_config={rules}"]) == 2
    err = capsys.readouterr().err
    assert "simulation.nccl_tuner_config" in err and "8 to 10" in err and err.count("\n") == 1


def test_zero3_is_not_faster_than_zero1_with_the_same_overlap(tmp_path):
    """Llama 3 8B (2 layers) on 16 H100: ZeRO-3 moves the distributed optimizer's traffic (gradient
    reduce-scatter, parameter all-gather) plus a second parameter all-gather (the backward's), the
    embedding and output layer included, so with the distributed optimizer's reduction and gather
    overlapped (``overlap_grad_reduce``, ``overlap_param_gather``, which Megatron-LM allows only with it)
    and ZeRO-3 prefetching, it cannot be faster."""
    times = {}
    for z in (1, 3):
        path = tmp_path / f"z{z}.json"
        overlap = ["--set", "parallel.overlap_grad_reduce=true", "--set", "parallel.overlap_param_gather=true"]
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["run", "llama3-8b-fsdp-dgx-h100", "--set", "parallel.fsdp=false", "--set",
                       f"parallel.zero_stage={z}", "--set", "model.num_layers=2", "--set", "system.nodes=2",
                       "--set", "training.global_batch_size=16", *(overlap if z == 1 else []), "--json", str(path)])
        assert rc == 0
        times[z] = json.loads(path.read_text())["iteration_time_s"]
    assert times[3] >= times[1] > 0


def test_chunked_fidelity_runs_the_default_scenario(default_run, tmp_path):
    """``[simulation] fidelity = "chunked"``: NCCL's chunk pipeline times the collectives item by item;
    flow takes the same pipeline's closed form (hwmodel/nccl/pipeline_closed.py), so the iteration is
    the same."""
    path = tmp_path / "chunked.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--set", 'simulation.fidelity="chunked"', "--json", str(path)]) == 0
    flow = json.loads((default_run["dir"] / "a.json").read_text())["iteration_time_s"]
    chunked = json.loads(path.read_text())["iteration_time_s"]
    assert chunked == pytest.approx(flow, rel=1e-6)


def test_default_names_the_built_in_scenario(capsys):
    """``run default`` is ``run`` (sweep already took the name; calibrate and compare need a name)."""
    from scenarios.cmd_run import load

    assert load("default", []).name == load(None, []).name == "default"
    assert load("default", ["model.num_layers=2"]).model["num_layers"] == 2
