"""Published parallel plans against the search's screen (tier 1; no simulation, to keep this modest).

* SC'21 Table 1 and Korthikanti et al. 2022 Table 5: the authors chose their plans by hand; each
  published plan must be within :data:`BEST_TOLERANCE` of the fastest plan the screen finds in the space
  of the software they ran (SC'21: full recomputation, no sequence parallelism, no distributed optimizer;
  Korthikanti: sequence parallelism and selective recomputation available, no data parallelism).
* SC'21 Table 2: at every published size PTD-P (the screen's best plan with TP or PP) has more
  throughput per GPU than DeepSpeed's ZeRO-3 without model parallelism (``zero_impl = "deepspeed"``), as
  measured.
* torchtitan's async TP measurements: async TP is faster than vanilla TP on the same plan.
* BLOOM's 48-node topology search (``tests/data/bloom_tr11_48node_contenders.csv``): Kendall tau
  between the screen's and the measured order of seven plans, with an explicit floor.
"""

from __future__ import annotations

import csv
import math
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from scenarios.runner import scenario_path
from scenarios.scenario import load_scenario, parse_scenario
from scenarios.search import Candidate, ScreenContext, enumerate_space, parse_knobs
from scenarios.search.driver import given_plan, kendall_tau

BEST_TOLERANCE = 0.05
"""A published plan's screened time may exceed the best screened time by at most this fraction."""
BLOOM_TAU_FLOOR = 0.4
"""Kendall tau the screen's order of BLOOM's seven plans must reach (1 = the measured order)."""
DATA = Path(__file__).resolve().parents[2] / "data"
SC21_NAMES = ["1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b", "310b", "530b", "1t"]
KORTHIKANTI = ["22b", "175b", "530b", "1t"]
MEGATRON_2021_MODEL = {"attention_backend": "unfused", "hidden_dropout": 0.1, "attention_dropout": 0.1}
NO_NEW_KNOBS = ["parallel.context_parallel_size=1", "parallel.tp_comm_overlap=false", "parallel.async_tp=false",
                "parallel.rank_order=tp-cp-ep-dp-pp"]
"""Knobs the 2021-2022 Megatron-LM runs did not have (or, for the rank order, did not use)."""
EVEN_STAGES = ["parallel.num_layers_in_first_pipeline_stage=none", "parallel.num_layers_in_last_pipeline_stage=none"]
"""Uneven end stages came later (Megatron-Core's ``--decoder-first/last-pipeline-num-layers``); SC'21's Table 1
plans all split the layers evenly. Table 2's power-of-two depths need them for 530B's 105 layers."""


@cache
def _context(name: str) -> ScreenContext:
    return ScreenContext(load_scenario(scenario_path(name), []))


def _space_with(values: list[int], extra: list[int]) -> str:
    return ",".join(str(v) for v in sorted(set(values) | set(extra)))


def _powers(upto: int) -> list[int]:
    return [1 << i for i in range(upto.bit_length()) if 1 << i <= upto]


def best_and_published(ctx: ScreenContext, given: Candidate, fix: list[str], space: list[str]) -> tuple[float, float,
                                                                                                    Candidate]:
    """(the best screened time in the space, the published plan's screened time, the best plan)."""
    cands, _ = enumerate_space(ctx.facts, ctx.model_cfg, parse_knobs(fix, space), ctx.base_parallel)
    ests = [e for e in (ctx.estimate(c) for c in cands) if e.fits]
    assert ests, "no plan of the space fits"
    best = min(ests, key=lambda e: e.iteration_time_s)
    pub = ctx.estimate(given)
    assert pub.fits, f"the published plan does not fit by the memory model: {pub.oom_reason}"
    return best.iteration_time_s, pub.iteration_time_s, best.candidate


def _plan_space(ctx: ScreenContext, given: Candidate) -> list[str]:
    """TP up to a node, PP powers of two and the published PP, interleaving 1, 2 or the published depth."""
    f = ctx.facts
    return [f"parallel.tensor_model_parallel_size={_space_with(_powers(f.gpus_per_node), [given.tp])}",
            f"parallel.pipeline_model_parallel_size={_space_with(_powers(min(f.num_layers, 64)), [given.pp])}",
            f"parallel.virtual_pipeline_model_parallel_size={_space_with([1, 2], [given.vpp])}"]


_SMALL_TP = ("the screen prefers less TP and more DP or PP than the paper's weak-scaling plan, and so does the "
             "simulation (run, published plan vs the screen's best): it prices TP's per-layer all-reduces on "
             "NVLink (synchronous, 2.3-2.9 s exposed at TP 8, as nccl-tests measured them at 16-32 MiB) above the "
             "data-parallel all-reduce and the pipeline bubble. No 2021 Megatron-LM cost found that reverses it "
             "(docs/DESIGN.md, 'SC'21's alternatives simulated'); validate's TP-ordered error on the PP 1 rows (TP 1 "
             "+3.0 %, TP 2 -3.3 %, TP 4 -7.0 %, TP 8 -5.5 %) is of the size of the gap on the smaller rows")
SC21_XFAIL: dict[str, str] = {
    "3.6b": f"{_SMALL_TP}: TP2 DP32 3.73 s vs TP1 DP64 3.37 s (+10.5 %; 72.0 GB); simulated 3.82 vs 3.46 s (+10.5 %)",
    "7.5b": (f"{_SMALL_TP}: TP4 DP32 3.93 s vs TP1 PP2x2 DP64 3.22 s (+22.1 %; 77.7 GB); simulated 3.97 vs "
             "3.35 s (+18.4 %)"),
    "18b": (f"{_SMALL_TP}: TP8 DP32 9.98 s vs TP2 PP4x2 DP32 7.58 s (+31.6 %); simulated 9.94 vs 7.95 s (+25.0 %); "
            "TP2 PP2x2 DP64 (+33.4 % before) is OOM at the fp16 optimizer's step, 95.1 GB"),
    "39b": (f"{_SMALL_TP}: TP8 PP2x2 DP32 13.87 s vs TP2 PP8x2 DP32 11.44 s (+21.3 %); simulated 14.50 vs 12.08 s "
            "(+20.0 %)"),
}
"""Rows where the published plan is not within the tolerance of the screen's best (measured by this test)."""
KORTHIKANTI_XFAIL: dict[str, str] = {}
@pytest.mark.parametrize("size", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=SC21_XFAIL[s]))
                                  if s in SC21_XFAIL else s for s in SC21_NAMES])
def test_sc21_table1_published_plan_is_near_the_best(size):
    ctx = _context(f"sc21-gpt-{size}")
    given = given_plan(ctx.scenario, ctx.world)
    assert given is not None
    fix = [*NO_NEW_KNOBS, *EVEN_STAGES, "parallel.recompute_granularity=full", "parallel.sequence_parallel=false",
           "parallel.zero_stage=0", "parallel.overlap_grad_reduce=false", "training.micro_batch_size=1"]
    best, pub, plan = best_and_published(ctx, given, fix, _plan_space(ctx, given))
    assert pub <= best * (1 + BEST_TOLERANCE), (
        f"published {given.short()} {pub:.3f} s vs the best {plan.short()} {best:.3f} s (+{pub / best - 1:.1%})")


@pytest.mark.parametrize("size", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KORTHIKANTI_XFAIL[s]))
                                  if s in KORTHIKANTI_XFAIL else s for s in KORTHIKANTI])
def test_korthikanti_table5_published_plan_is_near_the_best(size):
    ctx = _context(f"korthikanti-{size}-sp-selective")
    given = given_plan(ctx.scenario, ctx.world)
    assert given is not None
    fix = [*NO_NEW_KNOBS, "parallel.zero_stage=0", "parallel.overlap_grad_reduce=false",
           f"training.micro_batch_size={given.mbs}"]
    space = [s for s in _plan_space(ctx, given) if not s.startswith("parallel.tensor_model_parallel_size=")]
    space.append("parallel.tensor_model_parallel_size=" + _space_with([2, 4, 8], [given.tp]))
    best, pub, plan = best_and_published(ctx, given, fix, space)
    assert pub <= best * (1 + BEST_TOLERANCE), (
        f"published {given.short()} {pub:.3f} s vs the best {plan.short()} {best:.3f} s (+{pub / best - 1:.1%})")


def _megatron(name: str, *, gpus: int, model: dict[str, Any], gbs: int, dtype: str = "fp16") -> ScreenContext:
    return ScreenContext(parse_scenario({
        "name": name, "system": {"name": "dgx-a100", "nodes": gpus // 8}, "model": model,
        "parallel": {}, "training": {"dtype": dtype, "global_batch_size": gbs, "micro_batch_size": 1}}))


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


SC21_TABLE2 = Path(__file__).resolve().parents[3] / "scenarios" / "data" / "megatron_sc21_table2.csv"


def _zero3_rows() -> list[dict[str, str]]:
    return [r for r in _rows(SC21_TABLE2) if "(ZeRO-3" in r["subtable"]]


ZERO3_XFAIL: dict[str, str] = {}
"""Rows of SC'21 Table 2 where the screen does not rank PTD-P above ZeRO-3 (measured by this test)."""


def _row_id(r: dict[str, str]) -> str:
    return f"{r['model_params_B']}B-{r['num_gpus']}gpu"


@pytest.mark.parametrize("row", [pytest.param(r, id=_row_id(r), marks=pytest.mark.xfail(
    strict=True, reason=ZERO3_XFAIL[_row_id(r)])) if _row_id(r) in ZERO3_XFAIL else pytest.param(r, id=_row_id(r))
    for r in _zero3_rows()])
def test_sc21_table2_ptdp_ranks_above_zero3(row):
    """On the ZeRO-3 row's cluster and batch: DeepSpeed ZeRO-3 (no TP/PP, the row's micro-batch) against the
    screen's best PTD-P plan (TP x PP x DP, full recomputation as SC'21), throughput per GPU."""
    gpus, gbs, mbs = int(row["num_gpus"]), int(row["global_batch_size"].rstrip("*")), int(row["micro_batch_size"])
    model = {"name": "gpt3-175b" if row["model_params_B"].startswith("174") else "gpt-530b", **MEGATRON_2021_MODEL}
    ctx = _megatron(f"t2-{gpus}", gpus=gpus, model=model, gbs=gbs)
    zero3 = [ctx.estimate(Candidate(dp=gpus, zero=3, zero_impl="deepspeed", mbs=mbs, recompute=r))
             for r in ("none", "selective", "full")]
    fit3 = [e.iteration_time_s for e in zero3 if e.fits]
    ptdp_space = ["parallel.tensor_model_parallel_size=8", "parallel.pipeline_model_parallel_size=4,8,16,32",
                  "parallel.virtual_pipeline_model_parallel_size=1,2", "parallel.zero_stage=0,1"]
    fix = [*NO_NEW_KNOBS, "parallel.recompute_granularity=full", "parallel.sequence_parallel=false",
           "training.micro_batch_size=1", "parallel.overlap_grad_reduce=false"]
    cands, _ = enumerate_space(ctx.facts, ctx.model_cfg, parse_knobs(fix, ptdp_space), ctx.base_parallel)
    ptdp = min(e.iteration_time_s for e in map(ctx.estimate, cands) if e.fits)
    assert fit3, "the ZeRO-3 plan does not fit by the screen's memory model, though the published run completed"
    assert ptdp < min(fit3), f"PTD-P {ptdp:.2f} s vs ZeRO-3 {min(fit3):.2f} s"


ZERO3_TFLOPS_TOLERANCE = 0.25
"""Largest relative error of the screen's ZeRO-3 TFLOP/s per GPU on SC'21 Table 2 (the 175B rows are
those ``[deepspeed] host_per_rank_s`` was fitted to: +15 %, +14 %, -10 %; the 530B rows are out of
sample: +19 %, +14 %; the 640-GPU row, which fits by the memory model only since the recompute workspace's
lifetime is modelled, is +24.9 %, just inside: the cost that grows with the micro-batch, +15 % at mbs 4
on 175B, is not modelled)."""
LEFT_OUT_OF_THE_FALL = {"529.6B-640gpu"}
"""The 530B fall compares 1,120 -> 2,240 GPUs (one global batch, 2,240): the 640-GPU row ran a global batch
of 2,560 at micro-batch 4, whose per-micro-batch cost is the known gap above."""
ZERO3_FALL_TOLERANCE = 0.35
"""Largest relative error of the fall in TFLOP/s per GPU from the fewest to the most GPUs (175B: 4.2x
against 3.27x measured; 530B 1,120 -> 2,240: 2.1x against 2.04x)."""


def _sc21_tflops(row: dict[str, str], iteration_s: float) -> float:
    """SC'21's model FLOPs per GPU and second (the paper's formula, full recomputation)."""
    b, s, l, h, v = (int(row[k].rstrip("*")) for k in ("global_batch_size", "seq_len", "layers", "hidden_size",
                                                        "vocab"))
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    return flops / int(row["num_gpus"]) / iteration_s / 1e12


def _zero3_tflops(row: dict[str, str]) -> tuple[float, float]:
    """(the screen's, the measured) TFLOP/s per GPU of a ZeRO-3 row of SC'21 Table 2."""
    gpus, gbs, mbs = int(row["num_gpus"]), int(row["global_batch_size"].rstrip("*")), int(row["micro_batch_size"])
    model = {"name": "gpt3-175b" if row["model_params_B"].startswith("174") else "gpt-530b", **MEGATRON_2021_MODEL}
    ctx = _megatron(f"t2-{gpus}", gpus=gpus, model=model, gbs=gbs)
    e = ctx.estimate(Candidate(dp=gpus, zero=3, zero_impl="deepspeed", mbs=mbs, recompute="full"))
    assert e.fits, _row_id(row)
    return _sc21_tflops(row, e.iteration_time_s), float(row["tflops_per_gpu"])


def test_sc21_table2_zero3_530b_640_gpus_throughput():
    """The 640-GPU 530B row, left out of the fall: within ZERO3_TFLOPS_TOLERANCE like the others."""
    (row,) = [r for r in _zero3_rows() if _row_id(r) in LEFT_OUT_OF_THE_FALL]
    pred, meas = _zero3_tflops(row)
    assert pred == pytest.approx(meas, rel=ZERO3_TFLOPS_TOLERANCE), (_row_id(row), pred, meas)


def test_sc21_table2_zero3_throughput_falls_as_measured():
    """DeepSpeed ZeRO-3 at a fixed batch, 384 -> 1,536 GPUs (175B) and 1,120 -> 2,240 (530B): the
    screen's TFLOP/s per GPU within ZERO3_TFLOPS_TOLERANCE of each measured row, and its fall within
    ZERO3_FALL_TOLERANCE of the measured fall. Before the host's per-rank loops were modelled the 175B
    fall was 1.8x (201 -> 114) against 3.27x."""
    got: dict[str, list[tuple[float, float]]] = {}
    for row in _zero3_rows():
        if _row_id(row) in ZERO3_XFAIL or _row_id(row) in LEFT_OUT_OF_THE_FALL:
            continue
        pred, meas = _zero3_tflops(row)
        assert pred == pytest.approx(meas, rel=ZERO3_TFLOPS_TOLERANCE), (_row_id(row), pred, meas)
        got.setdefault(row["model_params_B"], []).append((pred, meas))
    assert len(got) == 2
    for pairs in got.values():
        (p0, m0), (p1, m1) = pairs[0], pairs[-1]
        assert p0 / p1 == pytest.approx(m0 / m1, rel=ZERO3_FALL_TOLERANCE), pairs


@pytest.mark.parametrize("model, gpus, recompute", [("llama3-8b", 64, "selective"), ("llama3-70b", 256, "full")])
def test_async_tp_above_vanilla_tp(model, gpus, recompute):
    """torchtitan (asyncTP_llama3_h100_2025-06): TP 8 x FSDP, async TP 1.10x (8B) and 1.09x (70B) over
    vanilla TP. Here on H100 SXM 80 GB (the 96 GB, 500 W part is not in the specs), one micro-batch of 2
    sequences of 8192 per data-parallel rank."""
    dp = gpus // 8
    ctx = ScreenContext(parse_scenario({
        "name": f"async-{model}", "system": {"name": "dgx-h100", "nodes": gpus // 8}, "model": {"name": model},
        "parallel": {}, "training": {"global_batch_size": 2 * dp, "micro_batch_size": 2, "seq_length": 8192,
                                     "compile": True}}))  # torchtitan runs async TP only compiled; so did both rows
    plan = Candidate(tp=8, sp=True, dp=dp, zero=3, mbs=2, recompute=recompute)
    vanilla, fused = ctx.estimate(plan), ctx.estimate(Candidate(**{**plan.to_dict(), "async_tp": True}))
    assert vanilla.fits and fused.fits
    speedup = vanilla.iteration_time_s / fused.iteration_time_s
    assert 1.0 < speedup < 1.3, f"async TP speedup {speedup:.3f} (measured 1.09-1.10)"


@cache
def _bloom() -> tuple[list[dict[str, str]], list[float]]:
    """BLOOM's seven 48-node contenders and the screen's time of each (full recomputation, bf16). The
    Megatron-DeepSpeed of February 2022 had no FlashAttention (baddbmm, the fused masked softmax -- the
    tr11 script asks for it, ``--abort-on-unmet-fused-kernel-constraints`` -- and bmm) and kept Megatron's
    default dropout of 0.1, which the tr11 script does not override."""
    rows = _rows(DATA / "bloom_tr11_48node_contenders.csv")
    r0 = rows[0]
    ctx = ScreenContext(parse_scenario({
        "name": "bloom-181b-48-nodes", "system": {"name": "dgx-a100", "nodes": int(r0["nodes"])},
        "model": {"name": "gpt3-175b", "num_layers": int(r0["layers"]), "hidden_size": int(r0["hidden_size"]),
                  "ffn_hidden_size": 4 * int(r0["hidden_size"]), "num_attention_heads": int(r0["attention_heads"]),
                  "vocab_size": int(r0["vocab"]), "seq_length": int(r0["seq_len"]), **MEGATRON_2021_MODEL},
        "parallel": {}, "training": {"dtype": "bf16", "global_batch_size": int(r0["global_batch_size"])}}))
    predicted = []
    for r in rows:
        c = Candidate(tp=int(r["TP"]), pp=int(r["PP"]), dp=int(r["DP"]), mbs=int(r["micro_batch_size"]),
                      zero=int(r["zero_stage"]), recompute="full")
        e = ctx.estimate(c)
        assert e.fits, f"{c.short()}: {e.oom_reason} (measured {r['max_mem_GB']} GB)"
        predicted.append(e.iteration_time_s)
    return rows, predicted


def test_bloom_pipeline_depth_order():
    """At every micro-batch size both were measured at, PP 6 x DP 8 was faster than PP 12 x DP 4; so is
    the screen's estimate."""
    rows, predicted = _bloom()
    by = {(int(r["PP"]), int(r["micro_batch_size"])): (t, float(r["sec_per_iteration"]))
          for r, t in zip(rows, predicted, strict=True)}
    for mbs in (1, 2, 4):
        assert by[(6, mbs)][1] < by[(12, mbs)][1]  # the measurement, as the CSV has it
        assert by[(6, mbs)][0] < by[(12, mbs)][0], (mbs, by[(6, mbs)], by[(12, mbs)])


@pytest.mark.xfail(strict=True, reason=(
    "Kendall tau -0.05: the measured runs get 12-14 % faster from micro-batch 1 to 4; the screen sees only "
    "the larger bubble of fewer micro-batches and the kernels' small gain (6.36 -> 6.05 ms per sample-layer "
    "forward). tau 0.4 needs >= 3.5 ms per layer and micro-batch that does not grow with the micro-batch. "
    "DeepSpeed 0.6's pipeline engine puts every p2p on the critical path (blocking send/recv, TP-sliced "
    "tensors + meta, the fp16 attention mask) and syncs the host ~4 times per micro-batch: ~1 s of 100 s, "
    "tau unchanged. The rows ran under CUDA_LAUNCH_BLOCKING=1 (tr11 prequel: async hangs at >= 320 GPUs), whose "
    "cost the authors measured at +6.8 %, 0 % and 0 %; BF16_Optimizer's per-micro-batch fp32 accumulation "
    "(~3 ms per layer, tau 0.24) came a week after these rows (docs/DESIGN.md, 'BLOOM's micro-batch sweep')"))
def test_bloom_topology_search_order():
    """The screen orders BLOOM's seven plans as measured: Kendall tau >= the floor."""
    rows, predicted = _bloom()
    measured = [float(r["sec_per_iteration"]) for r in rows]
    tau = kendall_tau(predicted, measured)
    assert not math.isnan(tau) and tau >= BLOOM_TAU_FLOOR, (tau, predicted, measured)
