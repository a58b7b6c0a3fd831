"""GPipe's memory for a zoo model: every forward runs before any backward, so the first stage holds the
activations of all m micro-batches, where 1F1B holds p of them (Narayanan et al. SC'21 sec. 2.2). Stage i
of the model holds m - i (workload.memory.memory_per_gpu), and the reported peak is the largest stage's
(the last stage carries the logits), so the ratio to 1F1B lies between (m - p + 1) / p and m."""

import pytest

from scenarios.runner import memory_for, prepare
from scenarios.scenario import parse_scenario


def _activations(schedule: str, global_batch: int) -> float:
    sc = parse_scenario({
        "name": "gpipe-memory", "system": {"name": "dgx-a100", "nodes": 1},
        "model": {"name": "gpt-1.7b", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16},
        "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4,
                     "pipeline_schedule": schedule},
        "training": {"global_batch_size": global_batch, "micro_batch_size": 1}})
    return memory_for(prepare(sc)).activations


@pytest.mark.parametrize("m", [8, 64])
def test_gpipe_holds_all_microbatches_1f1b_holds_p(m):
    p = 4
    gpipe, one_f_one_b = _activations("gpipe", m), _activations("1f1b", m)
    assert (m - p + 1) / p <= gpipe / one_f_one_b <= m, (gpipe, one_f_one_b)
    assert _activations("1f1b", 8) == pytest.approx(_activations("1f1b", 64), rel=1e-12)  # 1F1B: p, not m
