"""The report names a collective whose time is mostly NCCL's latency term (scenarios.analysis.latency_bound):
a data-parallel ring of many ranks over a small gradient buffer moves chunks too small for the bandwidth
to matter, each of its ``2 (n - 1)`` steps paying the per-step latency."""

from hwmodel.events import CollectiveInfo, TraceEvent
from scenarios.analysis import latency_bound
from scenarios.cmd_run import load
from scenarios.report import format_report
from scenarios.runner import run_scenario

TINY_DP_128 = ['system.name="dgx-h100"', "system.nodes=16", 'model.name="llama3-8b"', "model.num_layers=2",
               "model.hidden_size=256", "model.num_attention_heads=8", "model.num_query_groups=8",
               "model.ffn_hidden_size=512", "model.vocab_size=1024", "parallel.tensor_model_parallel_size=1",
               "parallel.pipeline_model_parallel_size=1", "training.global_batch_size=128",
               "training.micro_batch_size=1", "training.seq_length=1024", 'simulation.nccl_algo="ring"']


def _ev(name, start, xfer, end, latency_s, rank=0):
    return TraceEvent(rank, "comm", 0, name, "nccl:all_reduce", start, end,
                      info=CollectiveInfo("ring", "ll128", 16, 1 << 20, latency_s, 128), xfer_start_s=xfer)


def test_shares_are_of_the_moving_time_and_buckets_of_one_shape_add_up():
    events = [_ev("b0", 0.0, 0.1, 0.3, 0.15), _ev("b1", 0.3, 0.3, 0.5, 0.3),  # latency capped at the 0.2 s moving
              _ev("b0", 0.0, 0.0, 1.0, 0.9, rank=1)]  # another rank: not counted
    (lb,) = latency_bound(events, 0, 1.0)
    assert (lb.names, lb.count, lb.moving_s, lb.latency_s) == (("b0", "b1"), 2, 0.4, 0.35)
    assert latency_bound(events, 0, 8.1) == []  # 0.4 s is under 5 % of 8.1 s
    assert latency_bound([_ev("b0", 0.0, 0.0, 1.0, 0.49)], 0, 1.0) == []  # under half: bandwidth-bound


def test_a_data_parallel_ring_of_128_ranks_over_7_mb_is_named_latency_bound():
    rep = run_scenario(load(None, TINY_DP_128))
    (ev,) = [e for e in rep.result.events if e.rank == 0 and e.name.startswith("dp_grad")]
    share = ev.info.latency_s / (ev.end_s - ev.xfer_start_s)
    assert ev.info.ranks == 128 and share > 0.5  # NCCL's ring latency: 2 x 127 steps
    (line,) = [ln for ln in format_report(rep).splitlines() if "latency-bound" in ln]
    assert line.startswith("  latency-bound: dp_grad_bucket0 (1 x all_reduce over 128 ranks, ring ll128, 7.3 MB): "
                           f"{100 * share:.0f} % of its")
    assert not any("latency-bound" in ln for ln in format_report(run_scenario(load(None, []))).splitlines())
