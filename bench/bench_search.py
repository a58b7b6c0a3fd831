"""Search speed (prints figures; not a test): ``trainsim search`` end to end on a large case.

GPT-3 175B on 1,024 A100 (128 DGX A100, global batch 1536 as SC'21's 175B-class runs): every plan of the
default space is enumerated and screened (the screen's rate is printed, traces excluded), the top K
(default 20) plus the baseline and the scenario's own plan are co-simulated on a local process pool.
Target (2 cores): >= 1,000 plans screened and the top 20 simulated in <= 5 minutes. The screen's fastest
plans are re-priced by the simulator before the top K is picked (``scenarios.search.refine``); the
Kendall tau printed is between that re-priced screen's order and the simulation's.

Run: ``python bench/bench_search.py [--case gpt3-175b|llama3-405b] [--top-k K] [--workers N]
[--top-k-rule shapes|screen] [--max-tasks N] [--nodes N] [--scenario NAME] [--set K=V]``.

``--case llama3-405b``: Llama 3 405B on 16,384 H100 (2,048 DGX H100, global batch 2048; target <= 10
minutes), the same as::

    python bench/bench_search.py --scenario llama3-70b-tp8-pp4-dgx-h100 --nodes 2048 \
        --set model.name=llama3-405b --set training.global_batch_size=2048

On a shared machine the wall time depends on the load: the CPU time of the search process and of its
pool workers (``RUSAGE_CHILDREN``, counted once the pool has been joined) is printed beside it, and
the wall time of an idle 2-core machine estimated from them. Measured figures: docs/DESIGN.md, "Search:
a top K that covers the space".
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install


CASES = {"gpt3-175b": ("gpt3-175b-16x-dgx-a100", 128, [], 300.0),
         "llama3-405b": ("llama3-70b-tp8-pp4-dgx-h100", 2048,
                         ["model.name=llama3-405b", "training.global_batch_size=2048"], 600.0)}
"""case -> (catalog scenario, nodes, overrides, target seconds)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), default="gpt3-175b")
    ap.add_argument("--scenario", default=None, help="instead of the case's")
    ap.add_argument("--nodes", type=int, default=None, help="instead of the case's")
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--top-k-rule", choices=("shapes", "screen"), default="shapes")
    ap.add_argument("--max-tasks", type=float, default=None, help="per simulation (default: trainsim run's)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--cache", default=None)
    args = ap.parse_args()
    name, nodes, overrides, target_s = CASES[args.case]
    if args.scenario is not None:
        name, overrides = args.scenario, []

    from scenarios.runner import scenario_path
    from scenarios.scenario import load_scenario
    from scenarios.search.driver import run_search
    from scenarios.search.report import agreement, format_search, speedups

    t0 = time.perf_counter()
    sc = load_scenario(scenario_path(name), [f"system.nodes={args.nodes or nodes}", *overrides, *args.overrides])
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        res = run_search(sc, top_k=args.top_k, executor=pool, cache=args.cache, top_k_rule=args.top_k_rule,
                         **({} if args.max_tasks is None else {"max_tasks": args.max_tasks}))
    wall = time.perf_counter() - t0
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_main, cpu_workers = own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime  # workers: reaped at exit
    print(format_search(res))
    ag, sp = agreement(res), speedups(res)
    print()
    print(f"plans screened: {len(res.estimates):,} ({res.info['fitting']:,} fit), enumerated in "
          f"{res.info.get('enumerate_s', float('nan')):.1f} s; screen rate "
          f"{res.screen_rate_per_s:,.0f} plans per CPU second (one core, traces excluded); {res.traces} shard traces "
          f"in {res.trace_wall_s:.1f} s; {len(res.simulated)} plans simulated in {res.simulate_wall_s:.1f} s "
          f"({args.workers} workers)")
    tau = ag.get("kendall_tau", float("nan"))
    print(f"wall time: {wall:.1f} s, CPU {cpu_main + cpu_workers:.1f} s (target <= {target_s:.0f} s on 2 cores); "
          f"top-k rule {args.top_k_rule}; Kendall tau {tau:.2f}; "
          f"best is #{ag.get('best_screen_rank')} by the screen; "
          f"{sp.get('speedup_over_baseline', float('nan')):.2f}x over the baseline")
    runs = sorted(((r.get("cpu_s", math.nan), r.get("wall_s", math.nan), c.short()) for c, r in res.simulated.items()
                   if "wall_s" in r), reverse=True)
    if runs:  # where tier 2's time goes (cached results of an earlier run carry their own figures)
        print(f"simulations: {sum(r[0] for r in runs):.1f} s CPU, {sum(r[1] for r in runs):.1f} s wall in all; "
              f"slowest {runs[0][2]}: {runs[0][0]:.1f} s CPU, {runs[0][1]:.1f} s wall; median "
              f"{runs[len(runs) // 2][0]:.1f} s CPU")
    slowest = runs[0][0] if runs else 0.0
    idle_wall = cpu_main + max(cpu_workers / args.workers, slowest)
    print(f"on an idle machine with {args.workers} cores: about {idle_wall:.0f} s (the main process's CPU, then "
          f"the simulations' CPU over the workers, or the slowest one; target <= {target_s:.0f} s)")
    print(f"CPU time: {cpu_main:.1f} s in the main process (enumerate, trace, screen, re-price pipelines), "
          f"{cpu_workers:.1f} s in the workers (the re-pricing's sampled layers, the top K); the re-pricing of the "
          f"screen's {res.info.get('refined', 0)} fastest plans {res.info.get('refine_cpu_s', 0.0):.1f} s CPU (both), "
          f"{res.info.get('refine_wall_s', 0.0):.1f} s wall, in {res.info.get('refine_runs', 0)} short simulations; "
          f"peak RSS {own.ru_maxrss / 1e6:.2f} GB (main), {kids.ru_maxrss / 1e6:.2f} GB (largest "
          f"worker) -- on a shared machine the CPU time is the figure that does not depend on the load")


if __name__ == "__main__":
    main()
