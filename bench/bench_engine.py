"""Engine speed: fluid-network events per second and kernels per second (prints figures).

* Fabric: transfers between random GPU pairs of a 128-GPU (16 x DGX A100) rail-optimised fat tree,
  ``N`` kept in flight (each completion starts a new one), for N = 10, 100, 1000; the pairs and sizes
  are drawn before the clock starts. An *event* is an activity start or finish; each may trigger an
  incremental max-min re-solve of the activities it can affect ("activities per solve": how many a
  solve re-rates on average).
* Kernels: 8 CUDA streams on one GPU, each 5,000 small kernels, no host launch overhead.

Run (from the repository root, so that this checkout is what gets imported): ``PYTHONPATH=. python
bench/bench_engine.py``. Not a test: figures depend on the machine (and its load; run it twice).
"""

from __future__ import annotations

import random
import resource
import time

from hwmodel.cluster import Cluster
from hwmodel.ir import Compute, Program
from hwmodel.runtime import Runtime
from hwmodel.topology import build_system


def fabric(concurrent: int, total: int = 20_000, seed: int = 0) -> tuple[float, float, float]:
    topo = build_system("dgx-a100", 16)
    cluster = Cluster(topo, record=False)
    gpus = topo.gpus()
    rng = random.Random(seed)
    for a in gpus[:64]:  # warm the route cache so routing is not timed
        for b in gpus[::9]:
            if a != b:
                cluster.path(a, b)
    plan = []  # (src, dst, bytes) drawn before the clock starts, among the warmed routes
    while len(plan) < total + concurrent:
        a, b = rng.sample(gpus, 2)
        if (a, b) in cluster._route_res:
            plan.append((a, b, rng.uniform(1e6, 64e6)))
    started = 0

    def launch() -> None:
        nonlocal started
        a, b, size = plan[started]
        started += 1
        act = cluster.transfer(a, b, size)
        if started < total:
            act.done.callbacks.append(lambda _ev: launch())

    for _ in range(concurrent):
        launch()
    t0 = time.perf_counter()
    cluster.env.run()
    wall = time.perf_counter() - t0
    fs = cluster.fs
    return 2 * started / wall, fs.solved_activities / max(fs.solves, 1), wall


def kernels(streams: int = 8, per_stream: int = 5_000) -> tuple[float, float]:
    cluster = Cluster(build_system("dgx-a100", 1), record=False)
    p = Program(0)
    for i in range(per_stream):
        for s in range(streams):
            p.add(Compute(f"k{i}", "elementwise", 0.0, 1e6 * (1 + (i + s) % 7)), f"s{s}")
    t0 = time.perf_counter()
    Runtime(cluster, [p], host_launch_overhead_s=0.0).run()
    wall = time.perf_counter() - t0
    return streams * per_stream / wall, wall


def main() -> None:
    print("fabric: 128-GPU rail-optimised DGX A100 fat tree, random GPU-pair transfers")
    print(f"{'in flight':>10} {'events/s':>10} {'activities per solve':>22} {'wall s':>8}")
    for n in (10, 100, 1000):
        rate, comp, wall = fabric(n, total=max(4 * n, 4000))
        print(f"{n:>10d} {rate:>10,.0f} {comp:>22.1f} {wall:>8.2f}")
    rate, wall = kernels()
    print(f"kernels: 8 streams x 5,000 kernels on one GPU: {rate:,.0f} kernels/s ({wall:.2f} s)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
