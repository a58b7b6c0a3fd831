"""DeepSpeed ZeRO-3's memory (``zero_impl = "deepspeed"``): the transient buffers come from the
coordinator's replay (per-module gathers) and the gradient buckets, in closed form; the FSDP estimate
(whole layers gathered and reduced) stays for ``zero_impl = "megatron"``."""

import pytest

from workload.memory import TransformerShape
from workload.parallel.config import ParallelConfig
from workload.parallel.deepspeed_memory import layer_modules, peak_gradient_elements, transient_elements
from workload.parallel.deepspeed_zero import Stage3Settings
from workload.zoo import get_model_config
from workload.zoo.family import transformer_memory


def _shape(name: str) -> TransformerShape:
    return TransformerShape.of(get_model_config(name))


def test_gpt_block_modules_hold_twelve_h_squared_weights():
    m = _shape("gpt3-175b")
    h = m.hidden_size
    mods = dict(layer_modules(m))
    assert mods["attn.qkv"] == (3 * h * h, 3 * h) and mods["mlp.fc2"] == (4 * h * h, h)
    assert sum(p[0] for name, p in mods.items() if not name.startswith("ln")) == 12 * h * h


def test_530b_gathers_at_most_proj_and_fc1():
    """h = 20480: qkv (3h^2), fc1 and fc2 (4h^2) each exceed stage3_max_live_parameters (1e9), so no hook
    prefetches while one of them is whole; only proj's hook (h^2 = 4.2e8 live) prefetches fc1: at most
    5 h^2 elements are gathered at once, not FSDP's layer and next layer (24 h^2)."""
    m = _shape("gpt-530b")
    gathered, _ = transient_elements(m, True)
    assert gathered == 5 * m.hidden_size ** 2


def test_gradient_peak_is_two_buckets_and_the_next_gradient():
    """Buckets of at most 5 elements over gradients 4, 4, 1, 3: [4], [4, 1], [3]. While [4] is reduced
    (it and its flattened copy), [4, 1] fills and 3 is produced: 2*4 + 5 + 3 = 16."""
    s = Stage3Settings(reduce_bucket_size=5)
    assert peak_gradient_elements([4, 4, 1, 3], s) == 16
    assert peak_gradient_elements([2], s) == 4  # one bucket: itself and its flattened copy
    assert peak_gradient_elements([], s) == 0


def test_530b_gradient_peak_closed_form():
    """530B, 5e8-element buckets: the output layer's gradient (V h + h, V = 2.5 h), fc2 (4h^2 + h) and fc1
    (4h^2 + 4h) are buckets of their own. While the output layer's is reduced (itself and its flattened
    copy) fc2's bucket waits and fc1's gradient is produced: 2(Vh + h) + 8h^2 + 5h + 2h, the peak (a
    layer's fc2 pair gives 12h^2 + ...)."""
    m = _shape("gpt-530b")
    _, grads = transient_elements(m, True)
    h, v = m.hidden_size, m.vocab_size
    assert grads == 2 * (v * h + h) + (4 * h * h + h) + (4 * h * h + 4 * h)


def _cfg(impl: str, dp: int = 640) -> ParallelConfig:
    return ParallelConfig(micro_batch_size=4, global_batch_size=4 * dp, zero_stage=3, zero_impl=impl,
                          recompute_granularity="full").resolve(dp)


def test_deepspeed_replaces_the_fsdp_gather_estimate():
    """The same run under both implementations: model states and activations agree except the gradient
    partitions (fp16 under DeepSpeed, like the parameters); the transient term is DeepSpeed's."""
    cfg = get_model_config("gpt-530b")
    fsdp = transformer_memory(cfg, _cfg("megatron"), "bf16")
    ds = transformer_memory(cfg, _cfg("deepspeed"), "bf16")
    assert ds.activations == fsdp.activations and ds.workspace == fsdp.workspace
    assert ds.optimizer_states == fsdp.optimizer_states and ds.parameters == fsdp.parameters
    assert ds.gradients == pytest.approx(fsdp.gradients / 2)  # bf16 state bytes: fp32 main grads -> 2 B
    gathered, grads = transient_elements(TransformerShape.of(cfg), True)
    assert ds.gather_buffers == (gathered + grads) * 2
    assert ds.gather_buffers < 0.6 * fsdp.gather_buffers
