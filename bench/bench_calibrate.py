"""Benchmark: ``trainsim calibrate --kineto`` on a 100 MB trace.

The trace is synthesised for the benchmark only, by replicating the events of the real ResNet-50 V100
excerpt (``tests/data/kineto_resnet50_v100_2steps.json.gz``, from HTA's test data) as further profiler
steps: times shifted by the excerpt's span, ``External id`` and ``correlation`` offset, steps renamed.
Target: <= 60 s wall and <= 2 GB peak RSS on 2 cores for the whole command (read, pair, fit, and the
three simulations of its report). Prints wall time per phase and peak RSS (``resource.getrusage``).

    .venv/bin/python bench/bench_calibrate.py [target_MB]
"""

from __future__ import annotations

import gzip
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install


def synthesise(target_bytes: int, out: Path) -> int:
    """Write a ``.json.gz`` trace of about ``target_bytes`` (uncompressed); returns its size."""
    src = json.loads(gzip.decompress((ROOT / "tests/data/kineto_resnet50_v100_2steps.json.gz").read_bytes()))
    events = [e for e in src["traceEvents"] if e.get("ph") == "X"]
    other = [e for e in src["traceEvents"] if e.get("ph") != "X"]
    t0 = min(float(e["ts"]) for e in events)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events) - t0 + 1000.0
    one = len(json.dumps(events))
    copies = max(1, target_bytes // one)
    out_events = list(other)
    for c in range(copies):
        for e in events:
            e2 = dict(e)
            e2["ts"] = float(e["ts"]) + c * span
            args = e.get("args")
            if isinstance(args, dict):
                args = dict(args)
                for key in ("External id", "correlation"):
                    if isinstance(args.get(key), int):
                        args[key] += c * 10_000_000
                e2["args"] = args
            if str(e2.get("name", "")).startswith("ProfilerStep#"):
                e2["name"] = f"{e2['name']}.{c}"
            out_events.append(e2)
    text = json.dumps({**{k: v for k, v in src.items() if k != "traceEvents"}, "traceEvents": out_events})
    out.write_bytes(gzip.compress(text.encode(), compresslevel=1))
    return len(text)


def main(target_mb: float = 100.0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "big.json.gz"
        size = synthesise(int(target_mb * 1e6), trace)
        print(f"trace           {size / 1e6:7.1f} MB uncompressed ({trace.stat().st_size / 1e6:.1f} MB gz)")
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        t0 = time.perf_counter()
        from scenarios.calibrate.kineto import read_kineto

        tr = read_kineto(trace)
        t1 = time.perf_counter()
        print(f"read_kineto     {t1 - t0:7.2f} s   ({len(tr.steps)} steps, steady {tr.step_name})")
        from scenarios.cli import main as cli

        rc = cli(["calibrate", "--kineto", str(trace), "--scenario", str(ROOT / "tests/data/resnet50_v100_1gpu.toml"),
                  "--output", str(Path(tmp) / "p.toml")])
        t2 = time.perf_counter()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0
        print(f"calibrate       {t2 - t1:7.2f} s   (exit {rc}; read, pair, fit, three simulations; target <= 60 s)")
        print(f"CPU time        {cpu:7.2f} s   (read_kineto and calibrate, user; wall exceeds it on a shared machine)")
        print(f"peak RSS        {rss / 2**20:7.2f} GiB (before reading: {rss0 / 2**20:.2f}; target <= 2 GB)")


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:2]))
