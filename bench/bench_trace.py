"""Benchmark: trace GPT-3 175B (96 layers, h = 12288) for one micro-batch (B = 1, s = 2048).

Target: <= 10 s wall and <= 2 GiB peak RSS, thanks to the meta device and layer dedup (one block
traced, cloned 96 times). Prints wall time, op count, FLOPs and peak RSS (``resource.getrusage``).

    .venv/bin/python bench/bench_trace.py [model-name]
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install


def main(name: str = "gpt3-175b") -> None:
    t0 = time.perf_counter()
    import torch  # noqa: F401  (import time reported separately: ~1 s)

    from workload.trace import trace_model
    from workload.zoo import build_model

    t1 = time.perf_counter()
    model = build_model(name)
    t2 = time.perf_counter()
    graph = trace_model(model, micro_batch_size=1, optimizer=True, layer_dedup=True)
    t3 = time.perf_counter()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"model           {name} ({graph.num_blocks} blocks, "
          f"{graph.info['num_parameters'] / 1e9:.1f} B parameters)")
    print(f"import torch    {t1 - t0:6.2f} s")
    print(f"build on meta   {t2 - t1:6.2f} s")
    print(f"trace fwd+bwd+opt {t3 - t2:4.2f} s   ({len(graph.ops)} ops; "
          f"{graph.total_flops('fwd') / 1e12:.1f} + {graph.total_flops('bwd') / 1e12:.1f} TFLOP fwd + bwd)")
    print(f"total wall      {t3 - t0:6.2f} s   (target <= 10 s)")
    print(f"peak RSS        {rss_kib / 2**20:6.2f} GiB (target <= 2 GiB)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
