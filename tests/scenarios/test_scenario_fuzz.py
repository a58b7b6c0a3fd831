"""Fuzzing the scenario input path (hypothesis): any scenario text, ``--set`` override or GPU override
is either accepted or refused with a one-line ValueError/KeyError/FileNotFoundError -- never another
exception. Cheap paths only (parsing, schema, GPU override and range checks, no tracing), so 1,000+
examples run in seconds."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scenarios.cli import one_line
from scenarios.runner import check_nodes, system_gpu
from scenarios.scenario import SYSTEM_KEYS, apply_overrides, parse_scenario

EXPECTED = (ValueError, KeyError, FileNotFoundError)

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
number = st.one_of(st.integers(-10, 1 << 62), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0, 1, 2, 8, 1000, 1e9, 1e12, float("nan"), float("inf")]))
value = st.one_of(number, st.booleans(), text, st.sampled_from(["dgx-a100", "fat_tree", "ConnectX-7-NDR", "QM9700"]))
GPU_FIELDS = ["hbm_bandwidth_Bps", "hbm_bandwidth_GBps", "nvlink_links", "l2_bytes", "sm_count", "fp32_flops",
              "boost_clock_hz", "pcie_bandwidth_Bps", "hbm_capacity_bytes", "copy_engines", "bogus"]
system = st.fixed_dictionaries(
    {"name": st.sampled_from(["dgx-a100", "dgx-h100", "hgx-h200", "nope"])},
    optional={"nodes": st.one_of(st.integers(-2, 5000), value), "nodes_per_leaf": st.one_of(st.integers(-1, 64), value),
              "spines": st.one_of(st.integers(-1, 64), value), "oversubscription": number,
              "fabric": st.sampled_from(["rail_optimized", "fat_tree", "single_switch", "none", "ring"]),
              "nic": value, "fabric_switch": value, "su_size": st.integers(-1, 64),
              "gpu_overrides": st.dictionaries(st.sampled_from(GPU_FIELDS), number, max_size=3)})
extra = st.dictionaries(text, value, max_size=1)  # unknown keys and sections, any name (newlines too)
section = st.dictionaries(st.one_of(text, st.sampled_from(["seq_length", "host_launch_overhead_s", "mode",
                                                           "global_batch_size", "name", "factory"])), value, max_size=3)
scenario = st.builds(lambda d, sys_extra, top: {**top, **d, "system": {**sys_extra, **d["system"]}},
                     st.fixed_dictionaries({"system": system, "model": st.just({"name": "gpt-1.7b"}) | section},
                                           optional={"training": section, "simulation": section,
                                                     "parallel": section}),
                     extra, extra)
override = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(
    ["system.nodes", "system.nodes_per_leaf", "system.spines", "system.oversubscription",
     "simulation.host_launch_overhead_s", "system.gpu_overrides.hbm_bandwidth_Bps",
     "system.gpu_overrides.nvlink_links", "training.seq_length", "a\nb.c", "system", "."]),
    st.one_of(text, st.sampled_from(["nan", "inf", "-inf", "1e400", "0", "9223372036854775807", '"x\ny"'])))


def _check_one_line(exc: BaseException) -> None:
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    assert "\n" not in one_line(msg)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=scenario, overrides=st.lists(override, max_size=2))
def test_any_scenario_is_accepted_or_refused_in_one_line(data, overrides):
    try:
        sc = parse_scenario(apply_overrides(data, overrides))
    except EXPECTED as exc:
        _check_one_line(exc)
        return
    # accepted: every float is finite, and the cheap system checks also fail in one line only
    for k, v in sc.system.items():
        assert k in SYSTEM_KEYS and not (isinstance(v, float) and not math.isfinite(v))
    try:
        check_nodes(sc.system)
        system_gpu(sc.system)
    except EXPECTED as exc:
        _check_one_line(exc)
