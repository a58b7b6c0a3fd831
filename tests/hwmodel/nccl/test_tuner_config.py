"""Tuner-plugin rules (hwmodel.nccl.tuner_config) and their effect on NCCL's choice and the simulation."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Collective
from hwmodel.nccl import algorithms
from hwmodel.nccl import tuner as T
from hwmodel.nccl.channels import CommTopology, nccl_channels
from hwmodel.nccl.comm import PROTOCOL_INDEX
from hwmodel.nccl.engine import NcclEngine, simulate_nccl_tests
from hwmodel.nccl.tuner_config import TunerConfigError, load_tuner_config, parse_tuner_config
from hwmodel.topology import build_system

MiB = 1 << 20

# NCCL's own example file (plugins/tuner/example/nccl_tuner.conf, 2.30.7), abridged: 8, 9 and 10 fields.
EXAMPLE = """\
# comment
allreduce,0,65536,tree,simple,2,1,-1,-1,1   # trailing comment

allreduce,65537,1048576,ring,simple,4,4,32,1,0
allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4,-1
broadcast,32769,4294967295,ring,simple,2,-1,-1,1,0
allgather,0,4294967295,ring,simple,4,2,-1
"""


@pytest.fixture(scope="module")
def a100x1():
    return CommTopology.from_system("ampere", 1, 8, 240.0, 25.0, 8, "amd")


def test_parses_nccls_example_file_with_8_9_and_10_fields():
    cfg = parse_tuner_config(EXAMPLE, "nccl_tuner.conf")
    assert len(cfg) == 5
    r = cfg.rules[0]
    assert (r.collective, r.min_bytes, r.max_bytes, r.algorithm, r.protocol) == ("all_reduce", 0, 65536, "tree",
                                                                                "simple")
    assert (r.channels, r.n_nodes, r.n_ranks, r.num_pipe_ops, r.reg_buff) == (2, 1, -1, -1, 1)
    assert r.where == "nccl_tuner.conf:2"
    last = cfg.rules[-1]
    assert last.collective == "all_gather" and (last.num_pipe_ops, last.reg_buff) == (-1, -1)
    assert parse_tuner_config("\n".join(x.to_line() for x in cfg.rules)).rules[3].channels == 2


def test_matching_is_inclusive_and_respects_every_field():
    (r,) = parse_tuner_config("allreduce,100,200,ring,simple,-1,1,8,2,0").rules
    assert r.matches("all_reduce", 100, 1, 8, 2, False) and r.matches("all_reduce", 200, 1, 8, 2, False)
    assert not r.matches("all_reduce", 201, 1, 8, 2, False)
    assert not r.matches("all_gather", 150, 1, 8, 2, False)
    assert not r.matches("all_reduce", 150, 2, 8, 2, False)
    assert not r.matches("all_reduce", 150, 1, 16, 2, False)
    assert not r.matches("all_reduce", 150, 1, 8, 1, False)
    assert not r.matches("all_reduce", 150, 1, 8, 2, True)


@pytest.mark.parametrize("line,msg", [
    ("allreduce,0,1,ring,simple,-1,1", "8 to 10"),
    ("gather,0,1,ring,simple,-1,1,-1", "collective_type 'gather' unknown; allowed: allreduce"),
    ("allreduce,0,1,bruck,simple,-1,1,-1", "algorithm 'bruck' unknown; allowed: tree, ring"),
    ("allreduce,0,1,ring,fast,-1,1,-1", "protocol 'fast' unknown; allowed: ll, ll128, simple"),
    ("allreduce,0,1k,ring,simple,-1,1,-1", "max_bytes must be an integer"),
    ("allreduce,9,1,ring,simple,-1,1,-1", "min_bytes <= max_bytes"),
    ("allreduce,0,1,ring,simple,0,1,-1", "channels must be -1"),
    ("allreduce,0,1,ring,simple,-1,1,-1,1,2", "regBuff must be -1, 0 or 1"),
])
def test_malformed_lines_name_the_line_and_field(line, msg):
    with pytest.raises(TunerConfigError, match="f.conf:2") as ei:
        parse_tuner_config("# header\n" + line, "f.conf")
    assert msg in str(ei.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TunerConfigError, match="cannot read"):
        load_tuner_config(tmp_path / "nope.conf")


def test_first_matching_available_rule_decides(a100x1):
    # 64 MiB on one A100 node: NCCL's model picks Ring/Simple; the rule forces Tree/Simple.
    assert T.choose("all_reduce", 64 * MiB, a100x1).algorithm == "ring"
    cfg = parse_tuner_config("allreduce,0,1073741824,nvls,simple,-1,-1,-1\n"   # no NVLS on A100: skipped
                             "allreduce,0,1073741824,pat,simple,-1,-1,-1\n"    # not modelled: skipped
                             "allreduce,1,67108864,tree,simple,-1,1,8\n"
                             "allreduce,0,1073741824,ring,ll,-1,-1,-1\n", "t.conf")
    c = T.choose("all_reduce", 64 * MiB, a100x1, tuner=cfg)
    assert (c.algorithm, c.protocol, c.decided_by) == ("tree", "simple", "tuner config t.conf:3")
    assert c.predicted_time_s == pytest.approx(T.predict_time_s("all_reduce", "tree", "simple", 64 * MiB, a100x1))
    assert c.n_channels == nccl_channels("tree", "simple", 64 * MiB, a100x1).n_channels
    # one byte past the range: the next rule (Ring/LL)
    assert T.choose("all_reduce", 64 * MiB + 1, a100x1, tuner=cfg).protocol == "ll"
    # NCCL_ALGO still applies first: with algo=ring the Tree rule is unavailable
    assert T.choose("all_reduce", 64 * MiB, a100x1, algo="ring", tuner=cfg).protocol == "ll"
    # another collective: no rule matches, the model decides
    ag = T.choose("all_gather", 64 * MiB, a100x1, tuner=cfg)
    assert ag.decided_by == "model"


def test_module_default_rules_and_context_manager(a100x1):
    cfg = parse_tuner_config("allreduce,0,1073741824,tree,ll128,-1,-1,-1")
    assert T.get_default_tuner_config() is None
    with T.tuner_config(cfg):
        assert T.choose("all_reduce", 64 * MiB, a100x1).algorithm == "tree"
    assert T.get_default_tuner_config() is None
    assert T.choose("all_reduce", 64 * MiB, a100x1).algorithm == "ring"
    with pytest.raises(TypeError):
        T.set_default_tuner_config("all_reduce,...")


def test_channel_override_holds_fewer_sms_and_lowers_bandwidth():
    """Ring/Simple on 12 of 24 channels: half the SMs held, and the per-channel bandwidth cap
    (NCCL's model busBw 240 GB/s over 24 channels) binds below NVLink, so a 1 GiB all-reduce takes
    NCCL's base latency + one step latency + 2(n-1)/n * S / 120 GB/s (the chunk pipeline streams)."""
    topo = build_system("dgx-a100", 1)
    size = 1 << 30
    full = simulate_nccl_tests(topo, "all_reduce", [size], algorithm="ring", protocol="simple")[0]
    half_cfg = parse_tuner_config(f"allreduce,0,{size},ring,simple,12,-1,-1")
    half = simulate_nccl_tests(topo, "all_reduce", [size], tuner_config=half_cfg)[0]
    assert half.algorithm == "ring" and half.protocol == "simple"
    ct = NcclEngine(Cluster(topo)).comm_topology(tuple(topo.gpus()))
    assert T.bus_bandwidth_Bps("all_reduce", "ring", "simple", ct) == pytest.approx(240e9)
    lat = T.latency_s("all_reduce", "ring", "simple", ct)
    # NCCL's chunk pipeline, bandwidth-bound: base latency once, one step latency (the rest overlaps
    # the transfer), then 2(n-1)/n * S at 12 x 10 GB/s
    base = algorithms.get("ring").base_latency_us[PROTOCOL_INDEX["simple"]] * 1e-6
    assert half.time_s == pytest.approx(base + (lat - base) / 14 + 14 / 8 * size / 120e9, rel=1e-6)
    assert half.time_s > 1.9 * full.time_s
    eng = NcclEngine(Cluster(topo), tuner_config=half_cfg)
    plan = eng.plan(Collective("all_reduce", size, tuple(range(8))), tuple(topo.gpus()))
    assert plan.n_channels == 12 and plan.info["decided_by"].endswith(":1")
    # more channels than the communicator has: clamped to its 24
    many = parse_tuner_config(f"allreduce,0,{size},ring,simple,64,-1,-1")
    eng = NcclEngine(Cluster(topo), tuner_config=many)
    assert eng.plan(Collective("all_reduce", size, tuple(range(8))), tuple(topo.gpus())).n_channels == 24


def test_nvls_tree_rules_apply_on_multi_node_hopper_only(a100x1):
    # 1 MiB on 2 DGX H100: NCCL's model picks Tree/LL128; an nvls_tree rule now decides, with its channels
    # clamped to the 16 NVLS channels. On one A100 node the same rule is unavailable and skipped.
    h2 = CommTopology.from_system("hopper", 2, 8, 370.8, 50.0, 8, "intel")
    assert T.choose("all_reduce", MiB, h2).algorithm == "tree"
    cfg = parse_tuner_config("allreduce,0,67108864,nvls_tree,simple,64,2,-1\n"
                             "allreduce,0,67108864,ring,simple,-1,-1,-1\n", "n.conf")
    c = T.choose("all_reduce", MiB, h2, tuner=cfg)
    assert (c.algorithm, c.n_channels, c.decided_by) == ("nvls_tree", 16, "tuner config n.conf:1")
    assert c.predicted_time_s == pytest.approx(66.8e-6 + MiB / (461.6e9 * 16 / 30), rel=1e-6)
    assert T.choose("all_reduce", MiB, a100x1, tuner=cfg).decided_by == "tuner config n.conf:2"
