"""Simulation speed and memory at scale (prints figures; not a test).

1. GPT-3 175B (TP 8, PP 8, sequence parallel, 8 micro-batches per pipeline) at 64, 128 and 1,024
   A100: wall time per simulated iteration and peak RSS with the full simulation, symmetry mode and
   the hierarchical engine (the full simulation is skipped at 1,024 GPUs: about 1,000 programs).
2. The issue's targets: one iteration of GPT-3 175B on 128 A100 (16 DGX, global batch 1536 as SC'21's
   175B-class runs) and of the 1T model on 3,072 A100 (SC'21 Table 1), in auto mode.

Run: ``python bench/bench_scale.py [--quick]``. Each case runs in a fresh process so RSS is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys

CASE = r"""
import json, resource, sys, time
from scenarios.runner import run_scenario, scenario_path
from scenarios.scenario import load_scenario
name, overrides = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
rep = run_scenario(load_scenario(None if name == "-" else scenario_path(name), overrides))
wall = time.perf_counter() - t0
m = rep.metrics
print(json.dumps({"wall_s": wall, "rss_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "iteration_s": m["iteration_time_s"], "mode": m["simulation"]["mode"],
                  "tasks": m["simulation"]["tasks"], "ranks": m["simulation"]["simulated_ranks"]}))
"""


def run(name: str, overrides: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", CASE, name, *overrides], capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(label: str, r: dict) -> None:
    if "error" in r:
        print(f"  {label:44s} error: {r['error']}")
        return
    print(f"  {label:44s} {r['wall_s']:7.1f} s wall  {r['rss_GB']:5.2f} GB RSS  iteration {r['iteration_s']:8.3f} s"
          f"  ({r['mode']}, {r['ranks']} ranks, {r['tasks']:,} tasks)")


def main() -> None:
    quick = "--quick" in sys.argv
    base = ['model.name="gpt3-175b"', "model.num_layers=96", "parallel.tensor_model_parallel_size=8",
            "parallel.pipeline_model_parallel_size=8", "parallel.sequence_parallel=true",
            "parallel.overlap_grad_reduce=true"]
    print("GPT-3 175B, TP 8 x PP 8, 8 micro-batches per pipeline (2 cores)")
    for gpus in (64, 128) if quick else (64, 128, 1024):
        dp = gpus // 64
        ov = [*base, f"system.nodes={gpus // 8}", f"training.global_batch_size={8 * dp}"]
        for mode in ("full", "symmetric", "hierarchical"):
            if mode == "full" and gpus > 128:
                print(f"  {gpus:5d} GPUs, full                           skipped (one program per GPU)")
                continue
            show(f"{gpus:5d} GPUs, {mode}", run("-", [*ov, f'simulation.mode="{mode}"']))
    print("Targets")
    show("GPT-3 175B, 128 A100, global batch 1536", run("gpt3-175b-16x-dgx-a100", ["training.global_batch_size=1536"]))
    if not quick:
        show("1T (SC'21 Table 1), 3,072 A100", run("sc21-gpt-1t", []))


if __name__ == "__main__":
    main()
