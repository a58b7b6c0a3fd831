"""The validation tables' loaders, the not-expressible rows, in-sample marking from calibration.toml, and
the clock override behind the leave-one-source-out refit."""

import csv
import math

import pytest

from scenarios.cmd_validate import DEFAULT_TABLES, format_table, layer_times_22b, ranking, summary
from scenarios.validation import provenance, stats
from scenarios.validation.tables import DATA, TABLE4, TABLES, interleave_depth, rows

# (table key, rows, rows not expressible)
COUNTS = {"sc21": (10, 0), "t5": (8, 0), "t4": (10, 0), "sc21t2": (6, 0), "sc21t2-zero3": (6, 0),
          "megascale": (8, 0), "readme2020": (8, 0), "torchtitan": (8, 0)}


@pytest.mark.parametrize("key", list(TABLES))
def test_table_row_counts_and_not_expressible_reasons(key):
    rs = rows((key,))
    assert (len(rs), sum(not r.expressible for r in rs)) == COUNTS[key]
    assert len({(r.name, r.metric) for r in rs}) == len(rs)
    for r in rs:
        assert r.measured > 0 and r.gpus > 0 and r.key == key
        assert (r.not_expressible is None) or len(r.not_expressible) > 20


def test_torchtitan_rows_name_their_run_once_and_read_the_precision_column():
    """The async-TP rows' CSV run names end in their precision cell, "(None (bfloat16))" (torchtitan's
    Float8 setting: none, so BF16): the row names drop it, the dtype comes from the column."""
    from scenarios.validation.tables import torchtitan_dtype

    names = [r.name for r in rows(("torchtitan",))]
    assert "torchtitan-async-TP 70B vanilla TP" in names and "torchtitan-async-TP 8B async TP" in names
    assert not any("None" in n or "bfloat16" in n for n in names), names
    assert {r.scenario["training"]["dtype"] for r in rows(("torchtitan",))} == {"bf16"}
    assert torchtitan_dtype("BF16") == torchtitan_dtype("None (bfloat16)") == "bf16"
    with pytest.raises(ValueError, match=r"precision 'Float8 \(tensorwise\)' not read; allowed: BF16, None"):
        torchtitan_dtype("Float8 (tensorwise)")


@pytest.mark.parametrize("csv_name", ["megascale_table2_megatron.csv", "megatron_sc21_table2.csv",
                                      "megatron_readme_2020_a100.csv", "torchtitan_llama3_h100_bf16.csv"])
def test_copied_tables_keep_their_source_columns(csv_name):
    with (DATA / csv_name).open(newline="") as f:
        table = list(csv.DictReader(f))
    assert {"source", "provenance"} <= set(table[0]) and all(r["source"] for r in table)


def test_megascale_rows_follow_the_paper():
    rs = rows(("megascale",))
    assert [r.gpus for r in rs] == [256, 512, 768, 1024, 3072, 6144, 8192, 12288]
    sc = rs[-1].scenario
    assert sc["system"]["nodes"] * 8 == 12288 and sc["parallel"]["data_parallel_size"] == 192
    assert sc["parallel"]["virtual_pipeline_model_parallel_size"] == 6
    assert sc["parallel"]["overlap_p2p_comm"] is False  # Megatron-LM 285068c8: batched, synchronised exchanges
    assert sc["model"]["num_attention_heads"] == 128 and sc["model"]["vocab_size"] == 64000
    assert sc["training"]["global_batch_size"] == 6144 and rs[0].measured == 40.0


def test_sc21_table2_zero3_rows_run_deepspeed_and_ptdp_rows_are_built():
    rs = rows(("sc21t2", "sc21t2-zero3"))
    zero3 = {r.name: r.scenario for r in rs if "zero3" in r.name}
    assert len(zero3) == 6
    for sc in zero3.values():
        par = sc["parallel"]
        assert (par["zero_stage"], par["zero_impl"]) == (3, "deepspeed")
        assert par["tensor_model_parallel_size"] == par["pipeline_model_parallel_size"] == 1
    assert zero3["sc21t2-530b-zero3-640gpu"]["training"] == {"dtype": "fp16", "global_batch_size": 2560,
                                                             "micro_batch_size": 4}
    ptdp = {r.name: r.scenario for r in rs if "ptdp" in r.name}
    assert ptdp["sc21t2-530b-ptdp-2240gpu"]["parallel"]["virtual_pipeline_model_parallel_size"] == 3
    assert ptdp["sc21t2-175b-ptdp-1536gpu"]["parallel"]["data_parallel_size"] == 16


def test_interleave_depth_is_the_smallest_divisor_above_one():
    assert [interleave_depth(n) for n in (1, 3, 8, 9, 12)] == [None, 3, 2, 3, 2]


def test_unknown_table_is_a_one_line_error():
    with pytest.raises(ValueError, match="--tables: unknown \\['t9'\\]; allowed: sc21, t5, t4"):
        rows(("t9",))
    assert "megascale" not in DEFAULT_TABLES and set(DEFAULT_TABLES) < set(TABLES)


def test_in_sample_marking_follows_calibration_toml():
    fits = provenance.fitted_to()
    listed = provenance.end_to_end_constants(fits)
    # the end-to-end constants: the A100 sustained clock, fitted on SC'21 T1 and Korthikanti T4/T5, and
    # DeepSpeed ZeRO-3's host time per rank, fitted on SC'21 T2's three 175B ZeRO-3 rows
    assert set(listed) == {provenance.CLOCK_CONSTANT, "deepspeed.host_per_rank_s"}
    rs = rows(tuple(TABLES))
    provenance.mark_in_sample(rs, fits)
    assert {r.key for r in rs if r.in_sample} == {"sc21", "t5", "t4", "sc21t2-zero3"}
    assert all(r.in_sample for r in rs if r.key in ("sc21", "t5", "t4"))
    assert sorted(r.name for r in rs if r.key == "sc21t2-zero3" and r.in_sample) == [
        "sc21t2-175b-zero3-1536gpu", "sc21t2-175b-zero3-384gpu", "sc21t2-175b-zero3-768gpu"]
    # dropping a row from fitted_to makes it out-of-sample
    fits[provenance.CLOCK_CONSTANT] = [i for i in fits[provenance.CLOCK_CONSTANT] if i != "sc21:sc21-gpt-1t"]
    provenance.mark_in_sample(rs, fits)
    assert [r.name for r in rs if r.key == "sc21" and not r.in_sample] == ["sc21-gpt-1t"]


def test_every_fitted_constant_names_its_rows():
    fits = provenance.fitted_to()
    assert {"architecture.ampere.gemm_efficiency.bf16", "nccl.host_launch_s",
            "nccl.nvlink_efficiency.ampere"} <= set(fits)
    assert all(fits.values())


def test_clock_override_scales_tensor_core_work_and_the_two_point_curve_predicts_a_third_clock():
    setting = TABLE4["Baseline no recompute"]
    f0 = provenance.shipped_clock()
    base = layer_times_22b(setting)
    with provenance.clock_fraction(provenance.REFIT_PROBE):
        probe = layer_times_22b(setting)
    with provenance.clock_fraction(0.75):
        third = layer_times_22b(setting)
    assert layer_times_22b(setting) == base  # restored
    assert probe[0] < base[0] < third[0]
    for i in (0, 1):
        a, b = stats.two_point_curve(f0, base[i], provenance.REFIT_PROBE, probe[i])
        assert b > 0 and a >= 0
        assert a + b / 0.75 == pytest.approx(third[i], rel=0.01)


def test_summary_and_ranking_split_and_rank():
    rs = rows(("megascale",))
    for r, p in zip(rs, (40.0, 21.0, 15.0, 12.0, 29.0, 15.0, 12.5, 8.0), strict=True):
        r.predicted = p
    rs[0].in_sample = True
    s = summary(rs)["MegaScale Table 2"]
    assert s["in_sample"]["rows"] == 1 and s["in_sample"]["mape"] == 0.0 and s["out_of_sample"]["rows"] == 7
    rk = ranking(rs)
    for batch, series in (("768", rs[:4]), ("6144", rs[4:])):  # the two strong-scaling series
        entry = rk[f"MegaScale Table 2 / GPT 175B, TP 8 x PP 8, global batch {batch}"]
        assert entry["rows"] == 4
        assert entry["tau"] == pytest.approx(
            stats.kendall_tau_b([r.predicted for r in series], [r.measured for r in series]))
        assert entry["slope_points_per_doubling"] == pytest.approx(
            stats.slope_per_doubling([r.gpus for r in series], [r.error for r in series]))
    assert rk["MegaScale Table 2"]["rows"] == 8  # pooled
    assert rk["MegaScale Table 2"]["slope_points_per_doubling"] == pytest.approx(
        stats.slope_per_doubling([r.gpus for r in rs], [r.error for r in rs]))


def test_ranking_covers_every_table_with_several_plans_of_one_model_on_one_cluster():
    """Kendall tau for Korthikanti Table 4 (per metric, five settings on 8 GPUs), Table 5 (two plans per
    model) and torchtitan (per model and GPU count); one-row groups and plan lists of several models
    (SC'21 Table 1, README 2020) are not ranked."""
    rs = rows(("sc21", "t5", "t4", "readme2020", "torchtitan"))
    for r in rs:
        r.predicted = r.measured * (1.1 if "selective" in r.name.lower() else 1.0)  # one pair swapped at most
    rk = ranking(rs)
    assert rk["Korthikanti Table 4 / 22B layer forward on 8 GPUs"]["rows"] == 5
    assert rk["Korthikanti Table 4 / 22B layer backward on 8 GPUs"]["rows"] == 5
    assert rk["Korthikanti Table 5 / 175b on 64 GPUs"]["tau"] == 1.0  # full recompute is slower either way
    assert rk["torchtitan H100 BF16 / Llama 3 70B on 256 GPUs"] == {"tau": 1.0, "rows": 2}
    assert rk["torchtitan H100 BF16 / Llama 3.1 8B on 8 GPUs"]["rows"] == 2
    assert not any(k.startswith(("SC'21 Table 1", "Megatron README 2020")) for k in rk)
    assert all("slope_points_per_doubling" not in v for v in rk.values())


def test_format_table_gives_each_row_its_unit():
    """The tables mix TFLOP/s per GPU, iteration times in s and layer times in ms: the row table's measured
    and predicted columns had no unit, so 137 (TFLOP/s), 1.9 (s) and 13.4 (ms) read alike."""
    rs = rows(("sc21", "t5", "t4"))
    for r in rs:
        r.predicted = r.measured
    lines = format_table(rs).splitlines()
    header = lines[0].split()
    assert header[:6] == ["table", "row", "metric", "unit", "sample", "measured"]
    col = lines[0].index(" unit") + 1
    by_row = {line[23:59].strip(): line[col:col + 8].strip() for line in lines[1:len(rs) + 1]}
    assert by_row == {r.name: r.unit for r in rs}
    assert {r.unit for r in rs} == {"TFLOP/s", "s", "ms"}


def test_format_table_prints_tau_and_slope_per_series():
    rs = rows(("megascale",))
    for r in rs:
        r.predicted = r.measured * (1 + 0.01 * math.log2(r.gpus / 256))  # +1 point per doubling
    text = format_table(rs)
    assert "global batch 768: Kendall tau (predicted vs measured) +1.00 over 4 plans; error slope +1.00" in text
    assert "MegaScale Table 2: error slope +1.00 points per doubling of GPUs (8 rows, pooled)" in text


def test_megascale_series_split_into_per_microbatch_and_per_iteration_time():
    """Strong scaling at a fixed global batch: m = batch / DP micro-batches per pipeline (192..48 and
    128..32); each series' measured and predicted times as a line in m (here predicted exactly
    0.2 s x m + 1 s); none for a series in TFLOP/s (SC'21 Table 2)."""
    rs = rows(("megascale",))
    assert [r.microbatches for r in rs] == [192, 96, 64, 48, 128, 64, 48, 32]
    for r in rs:
        r.predicted = 0.2 * r.microbatches + 1.0
    rk = ranking(rs)
    line = rk["MegaScale Table 2 / GPT 175B, TP 8 x PP 8, global batch 768"]["time_vs_microbatches"]
    assert line["predicted"] == {"per_microbatch_s": pytest.approx(0.2), "per_iteration_s": pytest.approx(1.0)}
    # the paper's batch-768 times, 40.0 / 21.2 / 15.2 / 11.9 s, by least squares
    a, b = stats.line_fit([192, 96, 64, 48], [40.0, 21.2, 15.2, 11.9])
    assert line["measured"] == {"per_microbatch_s": pytest.approx(a), "per_iteration_s": pytest.approx(b)}
    assert a == pytest.approx(0.195, abs=5e-4) and b == pytest.approx(2.6, abs=0.05)
    assert "measured 0.195 s x m +2.61 s, predicted 0.200 s x m +1.00 s" in format_table(rs)
    pooled = rk["MegaScale Table 2"]["time_vs_microbatches"]  # all 8 rows, DP 4..192, on one line
    assert pooled["predicted"]["per_iteration_s"] == pytest.approx(1.0)
    assert pooled["measured"]["per_microbatch_s"] == pytest.approx(0.198, abs=5e-4)
    assert pooled["measured"]["per_iteration_s"] == pytest.approx(2.45, abs=0.05)
    t2 = rows(("sc21t2",))
    for r in t2:
        r.predicted = r.measured
    assert all("time_vs_microbatches" not in v for v in ranking(t2).values())
    assert rows(("sc21",))[0].microbatches is None  # a catalog row states no batch here


def test_megascale_rows_run_on_the_papers_cluster():
    rs = rows(("megascale",))
    assert {r.scenario["system"]["name"] for r in rs} == {"megascale-ampere"}
    assert [r.scenario["system"]["nodes"] * 8 for r in rs] == [r.gpus for r in rs]
