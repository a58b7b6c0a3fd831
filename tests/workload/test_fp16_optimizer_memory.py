"""Megatron-LM's fp16 optimizer step: fp32 copies of the gradients beside the fp16 ones
(``workload.zoo.family.fp16_optimizer_grad_copies``), and the memory verdict at that moment."""

import pytest

import hwmodel.specs as specs
from scenarios.metrics import memory_dict
from workload import allocator
from workload.parallel.config import ParallelConfig
from workload.zoo import get_model_config
from workload.zoo.family import transformer_memory

GPU = specs.get_gpu("A100-SXM4-80GB")
GPT_3_6B = get_model_config("gpt-3.6b")


def _memory(dtype: str, **kw):
    p = ParallelConfig(micro_batch_size=1, global_batch_size=512, recompute_granularity="full", **kw).resolve(64)
    return allocator.with_framework(transformer_memory(GPT_3_6B, p, dtype), p, GPU)


def test_fp16_step_holds_20_bytes_per_parameter():
    """SC'21's 3.6B model on one GPU per replica (TP 1, DP 64, full recomputation): fp16 parameters and
    gradients (2 + 2), fp32 master weights and Adam moments (12), and at the step the fp32 gradient
    copies (4): 20 bytes per parameter, above the backward's 16 bytes + activations."""
    mem = _memory("fp16")
    n = mem.params_per_gpu
    assert mem.optimizer_step_grads == pytest.approx(4 * n)
    assert mem.backward_peak == pytest.approx(16 * n + mem.activations + mem.workspace)
    assert mem.total == pytest.approx(20 * n) and mem.total > mem.backward_peak
    # the caching allocator releases its cached blocks at the step: no fragmentation then
    assert mem.reserved == pytest.approx(20 * n + mem.cublas_workspace)
    assert "fp32 gradient copies at the optimizer step" in mem.verdict(GPU)
    assert memory_dict(mem, GPU)["optimizer_step_grads_bytes"] == pytest.approx(4 * n)


def test_bf16_main_gradients_are_not_copied():
    """bf16: Megatron's main gradients are fp32 already (``.float()`` returns them), 18 bytes per parameter."""
    mem = _memory("bf16")
    assert mem.optimizer_step_grads == 0.0 and mem.total == mem.backward_peak
    assert mem.model_states == pytest.approx(18 * mem.params_per_gpu)
    assert "optimizer_step_grads_bytes" not in memory_dict(mem, GPU)


def test_distributed_optimizer_copies_its_shard():
    """With the distributed optimizer (ZeRO-1) each rank copies only its shard of the fp32 gradients."""
    mem = _memory("fp16", tensor_model_parallel_size=2, use_distributed_optimizer=True)
    assert mem.optimizer_step_grads == pytest.approx(4 * mem.params_per_gpu / 32)
    assert mem.total == mem.backward_peak  # 2 + 2 + 16/32 bytes per parameter, activations on top
