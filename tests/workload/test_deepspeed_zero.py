"""DeepSpeed ZeRO-3 (``zero_impl = "deepspeed"``): the coordinator's fetch and prefetch closed forms, the
gradient buckets, the refusals, and the programs the builder emits."""

import math
from collections import Counter

import pytest

from hwmodel.ir import Collective, Compute
from workload.parallel.builder import build_programs
from workload.parallel.config import ParallelConfig
from workload.parallel.deepspeed_zero import (
    DEFAULTS,
    Stage3Settings,
    Use,
    gradient_buckets,
    host_per_rank_s,
    persistent_parameters,
    plan_fetches,
)
from workload.parallel.rank_trace import trace_rank
from workload.zoo import get_model_config, with_overrides

H = 12288  # GPT-3 175B
GPT_LAYER = [("ln1", (H, H)), ("attn.qkv", (3 * H * H, 3 * H)), ("attn.proj", (H * H, H)), ("ln2", (H, H)),
             ("mlp.fc1", (4 * H * H, 4 * H)), ("mlp.fc2", (4 * H * H, H))]


def _forward(layers, modules=GPT_LAYER):
    return [Use((layer, name), params) for layer in range(layers) for name, params in modules]


def test_persistent_parameters_are_never_gathered():
    """Biases (<= 4h = 49,152 elements) and LayerNorm weights are under the 1e5 persistence threshold:
    a 175B layer gathers its four weight matrices only, 12 h^2 elements."""
    assert sum(u.gathered(DEFAULTS) for u in _forward(1)) == 12 * H * H
    assert Use(("x", ""), (100_000,)).gathered(DEFAULTS) == 0
    assert Use(("x", ""), (100_001,)).gathered(DEFAULTS) == 100_001


def test_modules_larger_than_the_prefetch_bucket_are_prefetched_one_ahead():
    """Every 175B weight exceeds the 5e7-element prefetch bucket: each hook with nothing in flight
    prefetches exactly the next weight (the first from ln1's hook, which gathers nothing itself); one
    all-gather per weight, 2 bytes x 12 h^2 per layer, none blocking."""
    layers = 3
    plan = plan_fetches(_forward(layers))
    assert len(plan.gathers) == 4 * layers
    assert all(g.prefetch for g in plan.gathers) and plan.gathers[0].at == 0
    assert all(len(g.keys) == 1 for g in plan.gathers)
    assert sum(g.numel for g in plan.gathers) == 12 * H * H * layers
    # the LayerNorm hooks gather nothing and do not synchronise
    assert [plan.synced[i] for i in range(6)] == [False, True, True, False, True, True]


@pytest.mark.parametrize("module_numel,bucket", [(10_000_000, 50_000_000), (12_000_000, 50_000_000),
                                                 (3_000_000, 20_000_000)])
def test_small_modules_are_prefetched_a_bucket_at_a_time(module_numel, bucket):
    """Modules smaller than the bucket: each prefetch takes ceil(bucket / module) modules (it stops at
    the first module that reaches the bucket), so N modules take 1 fetch + ceil((N-1)/k) prefetches."""
    n = 40
    uses = [Use((i, "w"), (module_numel,)) for i in range(n)]
    plan = plan_fetches(uses, Stage3Settings(prefetch_bucket_size=bucket))
    k = math.ceil(bucket / module_numel)
    assert len(plan.gathers) == 1 + math.ceil((n - 1) / k)
    assert all(len(g.keys) == k for g in plan.gathers[1:-1])
    assert sum(g.numel for g in plan.gathers) == n * module_numel


def test_no_prefetch_while_max_live_parameters_are_gathered():
    """530B: h = 20480, so fc1 (4 h^2 = 1.68e9) alone exceeds stage3_max_live_parameters (1e9): at fc1's
    hook nothing is prefetched and fc2 is fetched blocking at its own hook."""
    h = 20480
    layer = [("attn.qkv", (3 * h * h,)), ("attn.proj", (h * h,)), ("mlp.fc1", (4 * h * h,)),
             ("mlp.fc2", (4 * h * h,))]
    plan = plan_fetches(_forward(2, layer))
    blocking = [plan.gathers[g].keys[0] for g in range(len(plan.gathers)) if not plan.gathers[g].prefetch]
    # qkv (1.26e9), fc1 and fc2 (1.68e9) are above the limit: the modules after them are fetched blocking
    assert blocking == [(0, "attn.qkv"), (0, "attn.proj"), (0, "mlp.fc2"), (1, "attn.qkv"), (1, "attn.proj"),
                        (1, "mlp.fc2")]


def test_parameters_reused_within_the_reuse_distance_stay_gathered():
    """Full recomputation: a layer's recompute forward then its backward. With 175B sizes, fc2 (reused
    right away) stays gathered; fc1 (fc2's 4 h^2 elements counted at both of its uses: 1.2e9 > 1e9),
    proj and qkv are released and gathered again for the backward."""
    fwd = _forward(1)
    bwd = [Use((0, name), params) for name, params in reversed(GPT_LAYER)]
    plan = plan_fetches(fwd + bwd)
    regathered = [k for g in plan.gathers for k in g.keys if plan.gathers.index(g) >= 4]
    assert sorted(regathered) == [(0, "attn.proj"), (0, "attn.qkv"), (0, "mlp.fc1")]


def test_gradient_buckets_flush_before_overflowing():
    """reduce_bucket_size = 5e8: a 175B layer's gradients in backward order (fc2, fc1: 6.04e8 each, over
    the bucket alone; ln2 + proj 1.51e8, + qkv 4.53e8 would be 6.04e8 > 5e8) make four buckets."""
    numels = [4 * H * H + H, 4 * H * H + 4 * H, 2 * H, H * H + H, 3 * H * H + 3 * H, 2 * H]
    assert gradient_buckets(numels) == [[0], [1], [2, 3], [4, 5]]
    assert gradient_buckets([1, 2, 3], Stage3Settings(reduce_bucket_size=3)) == [[0, 1], [2]]


@pytest.mark.parametrize("kw,msg", [
    ({"zero_impl": "deepspeed", "zero_stage": 3, "fsdp": True}, "zero_impl='deepspeed' conflicts with fsdp=true"),
    ({"zero_impl": "deepspeed"}, "needs zero_stage = 3, got zero_stage=0"),
    ({"zero_impl": "deepspeed", "zero_stage": 2}, "needs zero_stage = 3, got zero_stage=2"),
    ({"zero_impl": "deepspeed", "zero_stage": 3, "pipeline_model_parallel_size": 2},
     "needs pipeline_model_parallel_size = 1"),
    ({"zero_impl": "torch"}, "zero_impl: unknown value 'torch'; allowed: megatron, deepspeed"),
])
def test_refusals_are_one_line(kw, msg):
    with pytest.raises(ValueError, match=msg) as e:
        ParallelConfig(**kw)
    assert "\n" not in str(e.value)


MC = with_overrides(get_model_config("gpt3-175b"), num_layers=3, seq_length=256, vocab_size=1024,
                    hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096)


def _program(impl, recompute="full", settings=None):
    cfg = ParallelConfig(zero_stage=3, zero_impl=impl, recompute_granularity=recompute).resolve(4)
    return build_programs(trace_rank(MC, cfg, dtype="fp16"), cfg, ranks=[0]).programs[0]


def test_default_is_the_existing_zero3():
    """zero_impl = "megatron" (the default) builds exactly what zero_stage = 3 built before."""
    a = _program("megatron")
    cfg = ParallelConfig(zero_stage=3, recompute_granularity="full").resolve(4)
    b = build_programs(trace_rank(MC, cfg, dtype="fp16"), cfg, ranks=[0]).programs[0]
    assert [(t.op, t.stream, t.deps) for t in a.tasks] == [(t.op, t.stream, t.deps) for t in b.tasks]


def test_deepspeed_program_gathers_and_reduces_in_fp16():
    """A small GPT (3 layers of 12.6M elements, all under the 1e9 reuse distance): everything is gathered
    once per iteration (kept for reuse), 2 bytes per non-persistent element; the gradients, 2 bytes per
    element of every parameter, are all-reduced (contiguous_gradients off) in one bucket."""
    prog = _program("deepspeed")
    ag = [t.op for t in prog.tasks if t.stream == "fsdp_ag" and isinstance(t.op, Collective)
          and t.op.name != "ds_persistent_gather"]
    rs = [t.op for t in prog.tasks if t.stream == "fsdp_rs"]
    h, f, v, s = 1024, 4096, 1024, 256
    big = 3 * h * h + h * h + 2 * h * f  # the weights above the threshold
    embedding = v * h + s * h
    assert sum(o.size_bytes for o in ag) == 2 * (3 * big + embedding + v * h + 2 * h)  # + ln_f, tied output
    persistent = 3 * h + h + f + h + 4 * h  # a layer's biases and LayerNorm weights and biases
    post_step = [t.op for t in prog.tasks if t.op.name == "ds_persistent_gather"]
    assert [o.size_bytes for o in post_step] == [2 * 3 * persistent]  # once per iteration, 3 layers
    total = 3 * (big + 3 * h + h + f + h + 4 * h) + embedding + 2 * h
    assert [(o.op, o.dtype) for o in rs] == [("all_reduce", "fp16")]
    assert rs[0].size_bytes == 2 * total
    assert not [t for t in prog.tasks if t.stream == "fsdp_ag" and "fsdp_ag" in t.op.name]


def test_each_gather_zero_fills_and_copies_out_per_rank():
    """``_allgather_param``: ``torch.zeros`` of the gathered buffer (its bytes written once), the NCCL
    all-gather, then PyTorch 1.8's list ``all_gather`` copies the flat output into each of the
    data-parallel ranks' partition views (bytes read and written, one copy kernel per rank), in order on
    the gather stream, the module's kernels after the copies."""
    prog = _program("deepspeed")
    dp = len(next(t.op.group for t in prog.tasks if isinstance(t.op, Collective) and t.stream == "fsdp_ag"))
    by_id = {t.id: t for t in prog.tasks}
    ag = [t for t in prog.tasks if t.stream == "fsdp_ag" and t.op.name != "ds_persistent_gather"]
    assert len(ag) % 3 == 0 and len(ag) > 0
    for fill, gather, copy in zip(ag[::3], ag[1::3], ag[2::3], strict=True):
        assert isinstance(gather.op, Collective) and gather.op.op == "all_gather"
        assert fill.op.name.endswith("_zero_fill") and fill.op.bytes_accessed == gather.op.size_bytes
        assert copy.op.name.endswith("_copy_out") and copy.op.bytes_accessed == 2 * gather.op.size_bytes
        host = by_id[gather.deps[1]]
        assert host.stream == "compute" and host.op.name.endswith("_host_issue") and host.deps == (fill.id,)
        assert host.op.fixed_time_s == pytest.approx(dp * fill.op.launches * host_per_rank_s())
        assert copy.op.launches == dp * fill.op.launches and gather.deps == (fill.id, host.id)
        assert copy.deps == (gather.id,)


def test_copy_out_costs_one_launch_per_kernel():
    """A memory-bound task standing for n equal kernels pays n launch overheads and holds one kernel's
    SMs (the HBM time is that of all the bytes)."""
    from hwmodel.costmodel import KernelCostModel
    from hwmodel.specs import get_gpu

    cm = KernelCostModel(get_gpu("A100-SXM4-80GB"))
    one = cm.cost(Compute("c", "copy", 0.0, 1e8))
    many = cm.cost(Compute("c", "copy", 0.0, 1e8, launches=1000))
    launch = cm.launch_overhead_s
    assert many.solo_time_s - one.solo_time_s == pytest.approx(999 * launch)
    assert many.sms_used < one.sms_used


def test_a_module_waits_for_its_gather():
    """Each gathered module's first kernel depends on the all-gather that brought its weight."""
    prog = _program("deepspeed", recompute="none")
    by_id = {t.id: t for t in prog.tasks}
    first_qkv = next(t for t in prog.tasks if t.stream == "compute" and t.op.layer == "layers.0.attn.qkv")
    assert any(by_id[d].stream == "fsdp_ag" for d in first_qkv.deps)
    assert Counter(t.stream for t in prog.tasks)["fsdp_ag"] >= 1


def test_persistent_parameters_of_a_175b_layer():
    """A GPT-3 175B layer keeps 8 parameters whole (two LayerNorms' weight and bias, the four biases):
    2h + 3h + h + 2h + 4h + h = 13h elements; the four weight matrices are partitioned."""
    assert persistent_parameters(GPT_LAYER, 96) == (8 * 96, 13 * H * 96)
    assert persistent_parameters(GPT_LAYER, 1, Stage3Settings(param_persistence_threshold=0)) == (0, 0)


def test_host_per_rank_loop_scales_with_the_data_parallel_size():
    """``_allgather_param``'s per-rank loop (and PyTorch 1.8's per-rank copies) cost the host
    world x modules x host_per_rank_s: doubling the data-parallel group doubles it; the copy kernels'
    launches double too, their bytes do not change."""
    from workload.parallel.deepspeed_zero import Gather, gather_kernels, persistent_gather_host_s

    g = Gather(0, (("a", ""), ("b", "")), 10_000_000, True)
    (f1, h1, c1), (f2, h2, c2) = (gather_kernels(g, w, 2, "fp16", "x") for w in (384, 768))
    assert h1.fixed_time_s == pytest.approx(384 * 2 * host_per_rank_s())
    assert h2.fixed_time_s == pytest.approx(2 * h1.fixed_time_s)
    assert c2.launches == 2 * c1.launches == 2 * 768 and c1.bytes_accessed == c2.bytes_accessed == 4e7
    assert f1 == f2 and f1.launches == 2
    assert persistent_gather_host_s(768, 1536) == pytest.approx(768 * 1536 * host_per_rank_s())
