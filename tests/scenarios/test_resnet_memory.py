"""ResNet-50 memory: model states by ZeRO stage and the saved tensors of the traced forward."""

import pytest

from scenarios.runner import memory_for, prepare, scenario_path
from scenarios.scenario import load_scenario

RESNET50_PARAMS = 25_557_032  # torchvision resnet50 (He et al. 2016, Table 1: 25.6 M)


def _memory(*overrides):
    return memory_for(prepare(load_scenario(scenario_path("resnet50-dp"), list(overrides))))


def test_model_states_are_the_closed_form():
    m = _memory()  # fp16 DDP: 2 B parameters, 2 B gradients, 12 B fp32 master weights + Adam moments
    assert m.params_per_gpu == RESNET50_PARAMS
    assert m.parameters == pytest.approx(2 * RESNET50_PARAMS)
    assert m.gradients == pytest.approx(2 * RESNET50_PARAMS)
    assert m.optimizer_states == pytest.approx(12 * RESNET50_PARAMS)
    z1 = _memory("parallel.zero_stage=1")
    assert z1.optimizer_states == pytest.approx(12 * RESNET50_PARAMS / 8)


def test_activations_scale_with_the_micro_batch_and_oom_is_reported():
    a256 = _memory().activations
    a128 = _memory("training.micro_batch_size=128", "training.global_batch_size=1024").activations
    # linear in the batch up to a small batch-independent part (BatchNorm's saved per-channel statistics)
    const = 2 * a128 - a256
    assert 0 <= const < 1e6
    assert a256 == pytest.approx(2 * a128, rel=1e-4)
    # fp16 activations of ResNet-50 at 224 x 224: ~44 MB per image (each conv/bn/relu output saved)
    assert 35e6 < a256 / 256 < 55e6
    big = _memory("training.micro_batch_size=2048", "training.global_batch_size=16384")
    assert big.total > 80e9
