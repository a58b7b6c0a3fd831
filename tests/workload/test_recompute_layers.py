"""Megatron-LM's ``--recompute-method uniform|block --recompute-num-layers N``: config checks, the builder's
re-run forwards (closed-form times on fixed-duration kernels), the memory model's closed forms, FLOPs."""

import pytest

from hwmodel.cluster import Cluster
from hwmodel.ir import Compute
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system
from tests.workload.test_builder import _synthetic
from workload.memory import activation_bytes_per_layer, memory_per_gpu
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.placement import Layout
from workload.zoo import get_model_config, with_overrides

FWD_S, BWD_S = 10e-3, 20e-3


def _cfg(**kw):
    return ParallelConfig(recompute_granularity="full", global_batch_size=kw.pop("gbs", 4), **kw)


def _time(cfg: ParallelConfig, layers: int = 8) -> float:
    cfg = cfg.resolve(cfg.tp * cfg.pp)
    trace = _synthetic(layers, FWD_S, BWD_S)
    res = build_programs(trace, cfg)
    topo = build_system("dgx-a100", 1)
    gpus = topo.gpus()
    rt = Runtime(Cluster(topo), res.programs, placement={r: gpus[r] for r in range(cfg.world_size)},
                 host_launch_overhead_s=0.0, mirror=Layout(cfg).mirror)
    return rt.run().end_time_s


# -- the builder: forwards re-run before their backward -----------------------------------------------

@pytest.mark.parametrize(("method", "n", "rerun"), [
    (None, None, 8), ("uniform", 2, 8), ("uniform", 8, 8), ("block", 0, 0), ("block", 3, 3), ("block", 8, 8)])
def test_time_adds_one_forward_per_recomputed_layer(method, n, rerun):
    """One rank, 4 micro-batches of 8 layers: T = m (L (fwd + bwd) + recomputed x fwd), exactly."""
    cfg = _cfg(recompute_method=method, recompute_num_layers=n, micro_batch_size=1)
    assert _time(cfg) == pytest.approx(4 * (8 * (FWD_S + BWD_S) + rerun * FWD_S), rel=1e-9)


def test_block_counts_layers_per_virtual_chunk():
    """Interleaved, 2 stages x 2 chunks of 2 layers: block 1 re-runs one layer of each chunk, so stage 0's
    per micro-batch work is 4 (fwd + bwd) + 2 fwd; 1F1B's bubble adds (p - 1) / v of it."""
    full = _time(_cfg(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, gbs=4))
    block = _time(_cfg(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, gbs=4,
                       recompute_method="block", recompute_num_layers=1))
    none = _time(ParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                global_batch_size=4))
    assert none < block < full
    assert (block - none) == pytest.approx((full - none) / 2, rel=0.02)


def test_uniform_group_is_rerun_before_its_last_layers_backward():
    cfg = _cfg(recompute_method="uniform", recompute_num_layers=2, gbs=1).resolve(1)
    prog = build_programs(_synthetic(4, FWD_S, BWD_S), cfg).programs[0]
    names = [t.op.name for t in prog.tasks if isinstance(t.op, Compute) and t.op.kind == "macro"]
    assert names[4:] == ["L2_fwd", "L3_fwd", "L3_bwd", "L2_bwd", "L0_fwd", "L1_fwd", "L1_bwd", "L0_bwd"]


# -- memory: Korthikanti et al. 2022 Table 2 per checkpointed group ----------------------------------

GPT = with_overrides(get_model_config("gpt3-175b"), num_layers=16)


def _mem(**kw):
    stage_layers = kw.pop("stage_layers", [8, 8])
    return memory_per_gpu(GPT, tp=8, pp=2, dp=1, micro_batch_size=1, sequence_parallel=True, stage=0,
                          stage_layers=stage_layers, flash_attention=True, **kw)


def _per_layer(mode):
    return activation_bytes_per_layer(GPT.seq_length, 1, GPT.hidden_size, GPT.num_attention_heads, tp=8,
                                      sequence_parallel=True, recompute=mode, flash_attention=True,
                                      hidden_dropout=GPT.hidden_dropout, attention_dropout=GPT.attention_dropout)


def test_block_over_every_layer_equals_full_and_over_none_equals_none():
    full, none = _mem(recompute="full"), _mem(recompute="none")
    every = _mem(recompute="full", recompute_method="block", recompute_num_layers=8)
    zero = _mem(recompute="full", recompute_method="block", recompute_num_layers=0)
    assert (every.activations, every.workspace, every.total) == pytest.approx(
        (full.activations, full.workspace, full.total), rel=1e-12)
    assert (zero.activations, zero.workspace, zero.total) == pytest.approx(
        (none.activations, none.workspace, none.total), rel=1e-12)
    assert none.activations > 3 * full.activations  # what the closed forms below are about


def test_block_and_uniform_closed_forms():
    """Stage 0 holds p = 2 micro-batches of 8 layers. Block k: k layer inputs (2sbh/t) and 8 - k whole
    layers stored, one layer re-materialised; uniform N: 8 / N group inputs, N layers re-materialised."""
    a_in, a_all = _per_layer("full"), _per_layer("none")
    assert a_in == pytest.approx(2 * GPT.seq_length * GPT.hidden_size / 8)
    extra = _mem(recompute="none").activations - 2 * 8 * a_all  # embedding dropout mask etc., as for none
    for k in (1, 3, 5):
        m = _mem(recompute="full", recompute_method="block", recompute_num_layers=k)
        assert m.activations - extra == pytest.approx(2 * (k * a_in + (8 - k) * a_all), rel=1e-12)
        assert m.workspace == pytest.approx(a_all - a_in, rel=1e-12)
    for n in (2, 4, 8):
        m = _mem(recompute="full", recompute_method="uniform", recompute_num_layers=n)
        assert m.activations - extra == pytest.approx(2 * (8 // n) * a_in, rel=1e-12)
        assert m.workspace == pytest.approx(n * a_all - a_in, rel=1e-12)


def test_block_memory_falls_with_layers_and_per_chunk_when_interleaved():
    totals = [_mem(recompute="full", recompute_method="block", recompute_num_layers=k).total for k in range(9)]
    assert all(a > b for a, b in zip(totals[1:], totals[2:], strict=False))
    # 2 chunks of 4 layers per stage: block 4 checkpoints both chunks entirely = full recomputation
    four = _mem(recompute="full", recompute_method="block", recompute_num_layers=4, stage_layers=[4] * 4,
                virtual_pipeline_size=2)
    full = _mem(recompute="full", stage_layers=[4] * 4, virtual_pipeline_size=2)
    assert four.activations == pytest.approx(full.activations, rel=1e-12)


# -- FLOPs: hardware FLOPs count the re-run forwards ---------------------------------------------------

def test_hardware_flops_scale_with_recomputed_layers():
    from workload.zoo.registry import family_of

    fam = family_of(GPT)
    base = ParallelConfig(tensor_model_parallel_size=8, global_batch_size=8).resolve(8)
    full = fam.flops(GPT, ParallelConfig(tensor_model_parallel_size=8, recompute_granularity="full",
                                         global_batch_size=8).resolve(8), None)
    k4 = fam.flops(GPT, ParallelConfig(tensor_model_parallel_size=8, recompute_granularity="full",
                                       recompute_method="block", recompute_num_layers=4,
                                       global_batch_size=8).resolve(8), None)
    none = fam.flops(GPT, base, None)
    assert k4.model == none.model == full.model
    assert k4.hardware - none.hardware == pytest.approx((full.hardware - none.hardware) * 4 / 16, rel=1e-12)


# -- checks: one line, naming the key ------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "words"), [
    ({"recompute_method": "block", "recompute_num_layers": 1}, "need recompute_granularity = 'full'"),
    ({"recompute_granularity": "selective", "recompute_method": "block", "recompute_num_layers": 1},
     "got recompute_granularity = 'selective'"),
    ({"recompute_granularity": "full", "recompute_method": "layer", "recompute_num_layers": 1},
     "allowed: uniform, block"),
    ({"recompute_granularity": "full", "recompute_method": "block"}, "recompute_num_layers is not set"),
    ({"recompute_granularity": "full", "recompute_num_layers": 2}, "recompute_method (uniform or block) is not set"),
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 0}, ">= 1"),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": -1}, ">= 0"),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": "2"}, "an integer"),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 2, "zero_stage": 3,
      "zero_impl": "deepspeed"}, "not modelled with zero_impl = 'deepspeed'"),
])
def test_bad_keys_are_one_line_errors(kw, words):
    with pytest.raises(ValueError, match=None) as exc:
        ParallelConfig(**kw)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_layer_counts_are_checked_against_the_stages():
    model = with_overrides(GPT, num_layers=12)
    ok = _cfg(pipeline_model_parallel_size=2, recompute_method="uniform", recompute_num_layers=3, gbs=2).resolve(2)
    ok.validate_model(model)
    with pytest.raises(ValueError, match="must divide the layers of every pipeline stage .* 6 is not a multiple"):
        _cfg(pipeline_model_parallel_size=2, recompute_method="uniform", recompute_num_layers=4,
             gbs=2).resolve(2).validate_model(model)
    with pytest.raises(ValueError, match="at most 3 layers; allowed: 0 to 3"):
        _cfg(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, recompute_method="block",
             recompute_num_layers=4, gbs=2).resolve(2).validate_model(model)
