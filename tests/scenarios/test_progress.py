"""Progress reporting (runtime callback, the tqdm bar of ``trainsim run``) and one ``prepare`` per run.

The default scenario is simulated twice (about 2 s each)."""

import contextlib
import io

import pytest

import scenarios.runner as runner
from hwmodel.cluster import Cluster
from hwmodel.ir import Compute, Program
from hwmodel.runtime import PROGRESS_EVERY_TASKS, KernelInfo, Runtime
from hwmodel.topology import build_system
from scenarios.cli import main


def test_runtime_reports_tasks_done_and_records_typed_kernel_info():
    n = 2 * PROGRESS_EVERY_TASKS + 5
    prog = Program(0)
    for i in range(n):
        prog.add(Compute(f"k{i}", "elementwise", 0.0, 1e6, fixed_time_s=1e-6), "compute")
    calls = []
    res = Runtime(Cluster(build_system("dgx-a100", 1)), [prog], host_launch_overhead_s=0.0).run(
        progress=lambda done, total: calls.append((done, total)))
    assert calls == [(PROGRESS_EVERY_TASKS, n), (2 * PROGRESS_EVERY_TASKS, n), (n, n)]
    assert len(res.events) == n and all(isinstance(e.info, KernelInfo) for e in res.events)
    assert res.events[0].info.solo_time_s == pytest.approx(1e-6)
    assert res.end_time_s == pytest.approx(n * 1e-6, rel=1e-6)  # back to back, nothing shares the GPU


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_run_prepares_once_and_shows_a_bar_only_on_a_terminal(tmp_path, monkeypatch):
    counts = {"prepare": 0, "memory_for": 0}
    for name in counts:
        real = getattr(runner, name)

        def counted(*a, _real=real, _name=name, **kw):
            counts[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(runner, name, counted)
    outs = []
    for path, err in ((tmp_path / "tty.json", _Terminal()), (tmp_path / "pipe.json", io.StringIO())):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert main(["run", "--json", str(path)]) == 0
        outs.append((out.getvalue(), err.getvalue()))
    assert counts == {"prepare": 2, "memory_for": 2}  # once per run
    (tty_out, tty_err), (pipe_out, pipe_err) = outs
    assert "simulating default" in tty_err and "task" in tty_err
    assert pipe_err == ""
    assert (tmp_path / "tty.json").read_bytes() == (tmp_path / "pipe.json").read_bytes()

    def strip_wall(text):
        return [ln for ln in text.splitlines() if "wall time" not in ln and not ln.startswith("Wrote ")]

    assert strip_wall(tty_out) == strip_wall(pipe_out)  # the bar goes to stderr only
