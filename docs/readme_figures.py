"""README figures, regenerated from what the commands print (as SimPy checks its examples' ``.out``).

Every number README.md quotes from a command's output sits between ``<!-- figure: NAME -->`` and
``<!-- /figure -->`` and is produced here from that command's text or ``--json`` output:

- *live* figures run their command now (the default scenario, about 4 s; a 3-size nccl-tests sweep);
- *golden* figures are formatted from a REGRESSION GOLDEN in ``tests/docs/golden/``: the verbatim output
  of a slow command (``trainsim validate``, about 4 min; the sweeps) at the last refresh. They pin the
  README to the golden, not to the code; refresh the goldens after a change that moves these numbers.

Usage (from the repository root)::

    python docs/readme_figures.py --check            # what tests/docs/test_readme.py does; exit 1 on drift
    python docs/readme_figures.py --write            # rewrite README.md's figure blocks
    python docs/readme_figures.py --refresh-golden   # re-run the slow commands into tests/docs/golden/ (minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GOLDEN = ROOT / "tests" / "docs" / "golden"
MARKER = re.compile(r"<!-- figure: (?P<name>[\w-]+) -->(?P<body>.*?)<!-- /figure -->", re.DOTALL)
LINE_WIDTH = 100
"""Report lines longer than this are cut at a word and end in `` ...`` (the README's code width)."""


def trainsim(*argv: str) -> str:
    """stdout of ``trainsim ARGV`` run in this process (this checkout's code); RuntimeError on failure."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from scenarios.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    if rc != 0:
        raise RuntimeError(f"trainsim {' '.join(argv)} exited {rc}: {err.getvalue().strip()}")
    return out.getvalue()


def _cut(line: str) -> str:
    return line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH].rsplit(" ", 1)[0] + " ..."


# ----------------------------------------------------------------------------------------------------
# Figures: each returns the text between its markers, without the surrounding newlines.


def default_report() -> str:
    """The default scenario's headline metrics and breakdown, from ``trainsim run``'s report."""
    lines = trainsim("run").splitlines()
    keep = ("Iteration time", "Throughput", "TFLOP/s per GPU", "MFU", "FLOP formula")
    head = [_cut(ln) for ln in lines if ln.startswith(keep)]
    i = next(i for i, ln in enumerate(lines) if ln.startswith("Breakdown"))
    return "\n".join(["```", *head, "", *lines[i:i + 5], "```"])


NCCL_ARGS = ("all_reduce", "-b", "1M", "-e", "1G", "-f", "32", "-g", "8")


def nccl_tests_table() -> str:
    """``trainsim nccl-tests`` on one DGX A100: the column headers and one row per size."""
    lines = trainsim("nccl-tests", *NCCL_ARGS).splitlines()
    table = [ln for ln in lines if ln.startswith(("#       size", "#        (B)")) or ln[:1] == " "]
    return "\n".join(["```", f"$ trainsim nccl-tests {' '.join(NCCL_ARGS)}", *table, "```"])


NVLS_ARGS = ("all_reduce", "-b", "1M", "-e", "4G", "-f", "4", "-g", "8", "--nodes", "4", "--system", "dgx-h100")
_ALGO_NAMES = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "nvls_tree": "NVLSTree",
               "collnet_direct": "CollNetDirect", "collnet_chain": "CollNetChain", "pat": "PAT"}
_PROTO_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes} B"


def nvls_tree_choices() -> str:
    """The algorithm/protocol NCCL's tuning model picks per size for all-reduce on 4 DGX H100
    (``trainsim nccl-tests`` with :data:`NVLS_ARGS`), as a phrase: consecutive sizes with the same
    choice form one range."""
    runs: list[list] = []  # [algo/proto, first size, last size]
    for ln in trainsim("nccl-tests", *NVLS_ARGS).splitlines():
        cols = ln.split()
        if ln[:1] != " " or len(cols) < 10:
            continue
        choice = f"{_ALGO_NAMES.get(cols[-2], cols[-2])}/{_PROTO_NAMES.get(cols[-1], cols[-1])}"
        if runs and runs[-1][0] == choice:
            runs[-1][2] = int(cols[0])
        else:
            runs.append([choice, int(cols[0]), int(cols[0])])
    parts = [f"{c} up to {_size(last)}" if i == 0 else f"{c} from {_size(first)}"
             + ("" if i == len(runs) - 1 else f" to {_size(last)}") for i, (c, first, last) in enumerate(runs)]
    phrase = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f"`trainsim nccl-tests {' '.join(NVLS_ARGS)}` picks {phrase}"


def sweep_oversubscription() -> str:
    """The ``whatif-oversubscription`` sweep table (regression golden: its stdout)."""
    lines = (GOLDEN / "sweep_whatif-oversubscription.txt").read_text(encoding="utf-8").splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("system.oversubscription"))
    table = [ln for ln in lines[i:] if ln.strip() and not ln.startswith("Wrote ")]
    return "\n".join(["```", "$ trainsim sweep whatif-oversubscription", *table, "```"])


def _fp8_rows() -> tuple[dict, dict]:
    rows = json.loads((GOLDEN / "sweep_whatif-fp8-llama3-70b-dgx-h100.json").read_text(encoding="utf-8"))["rows"]
    by_dtype = {r["values"]["training.dtype"]: r for r in rows}
    return by_dtype["bf16"], by_dtype["fp8"]


def fp8_speedup() -> str:
    """BF16 over FP8 iteration time in the FP8 sweep (regression golden: its ``--json``)."""
    bf16, fp8 = _fp8_rows()
    return f"{bf16['iteration_time_s'] / fp8['iteration_time_s']:.2f}x"


def fp8_extra_memory() -> str:
    """FP8's extra device memory per GPU over BF16 in the FP8 sweep (GB = 1e9 bytes): the difference of
    the two rows' memory column as the sweep prints it (``verdict_need_bytes``, one decimal each), and of
    the allocator's peak (``peak_allocated_bytes``)."""
    bf16, fp8 = _fp8_rows()
    need = {k: round(r["verdict_need_bytes"] / 1e9, 1) for k, r in (("bf16", bf16), ("fp8", fp8))}
    allocated = (fp8["peak_allocated_bytes"] - bf16["peak_allocated_bytes"]) / 1e9
    return (f"{need['fp8'] - need['bf16']:.1f} GB more device memory per GPU ({need['bf16']:.1f} -> "
            f"{need['fp8']:.1f} GB, the sweep's memory column; peak allocated +{allocated:.1f} GB)")


def _validate() -> dict:
    return json.loads((GOLDEN / "validate.json").read_text(encoding="utf-8"))


VALIDATION_KEYS = ("sc21", "t5", "t4")
"""``trainsim validate --tables`` keys of the tables below: what the golden holds."""
VALIDATION_TABLES = {  # validate's table name -> (README label, what is compared)
    "SC'21 Table 1": ("Narayanan et al. SC'21 Table 1", "TFLOP/s per GPU, GPT 1.7B-1T on 32-3,072 A100"),
    "Korthikanti Table 5": ("Korthikanti et al. 2022 Table 5",
                            "iteration time, 22B-1T, full recompute / SP + selective"),
    "Korthikanti Table 4": ("Korthikanti et al. 2022 Table 4", "forward / backward time of one 22B layer, 5 settings"),
}


def validation_summary() -> str:
    """Rows and mean / max absolute error per table of ``trainsim validate`` (regression golden)."""
    data = _validate()
    lines = ["| table | what | rows | mean abs. error | max error (row) |", "|---|---|---|---|---|"]
    for table, (label, what) in VALIDATION_TABLES.items():
        s, rows = data["summary"][table], [r for r in data["rows"] if r["table"] == table]
        worst = max(rows, key=lambda r: abs(r["error"]))
        name = worst["row"] if len({r["metric"] for r in rows}) == 1 else f"{worst['row']}, {worst['metric']}"
        lines.append(f"| {label} | {what} | {s['rows']} | {100 * s['mape']:.1f} % | "
                     f"{100 * s['max_abs_error']:.1f} % ({name}) |")
    lines.append("| nccl-tests, 8 x A100 (tests) | all-reduce busbw, 32 KiB-16 GiB | 20 | see below | |")
    return "\n".join(lines)


def validation_sc21() -> str:
    """SC'21 Table 1 as ``trainsim validate --tables sc21`` prints it (regression golden)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from scenarios.cmd_validate import Row, format_table

    rows = [Row(r["table"], r["row"], r["metric"], r["unit"], r["measured"], r["predicted"],
                key="sc21", in_sample=r.get("in_sample", False),
                curve=tuple(r["clock_curve_a_b"]) if r.get("clock_curve_a_b") else None)
            for r in _validate()["rows"] if r["table"] == "SC'21 Table 1"]
    return "\n".join(["```", "$ trainsim validate --tables sc21", *format_table(rows).splitlines(), "```"])


def validation_loso() -> str:
    """Leave-one-source-out error of the tables the sustained clock was fitted on (regression golden):
    each table predicted with the clock refitted on the other tables' rows only."""
    data = _validate()["leave_one_source_out"]
    lines = ["| held-out table | rows | clock refitted on the others | MAPE | max |", "|---|---|---|---|---|"]
    for table, (label, _) in VALIDATION_TABLES.items():
        d = data[table]
        refit = f"{d['refit']:.3f}" if d.get("refit") else "-"
        lines.append(f"| {label} | {d['rows']} | {refit} | {100 * d['mape']:.1f} % | "
                     f"{100 * d['max_abs_error']:.1f} % |")
    return "\n".join(lines)


class Figure(NamedTuple):
    """A README figure: its marker name and the function giving its text."""

    name: str
    make: Callable[[], str]
    inline: bool = False
    """Inline figures sit inside a sentence; blocks get a newline after and before the markers."""


FIGURES: tuple[Figure, ...] = (
    Figure("default-report", default_report),
    Figure("sweep-oversubscription", sweep_oversubscription),
    Figure("fp8-speedup", fp8_speedup, inline=True),
    Figure("fp8-extra-memory", fp8_extra_memory, inline=True),
    Figure("nccl-tests-table", nccl_tests_table),
    Figure("nvls-tree-choices", nvls_tree_choices, inline=True),
    Figure("validation-summary", validation_summary),
    Figure("validation-sc21", validation_sc21),
    Figure("validation-loso", validation_loso),
)


def body(fig: Figure) -> str:
    """What sits between ``fig``'s markers in README.md."""
    text = fig.make()
    return text if fig.inline else f"\n{text}\n"


def readme_bodies(text: str) -> dict[str, str]:
    """Figure name -> the text between its markers in ``text``; ValueError on a repeated name."""
    out: dict[str, str] = {}
    for m in MARKER.finditer(text):
        if m["name"] in out:
            raise ValueError(f"README figure {m['name']!r} appears twice")
        out[m["name"]] = m["body"]
    return out


def drift(text: str, figures: tuple[Figure, ...] = FIGURES) -> list[str]:
    """One message per figure of ``figures`` that is missing from ``text`` or differs from what the code
    (or its golden) gives now, with a diff; figures in ``text`` that nothing produces are reported too."""
    found = readme_bodies(text)
    known = {f.name for f in FIGURES}
    problems = [f"README figure {n!r} is not produced by docs/readme_figures.py" for n in found if n not in known]
    for fig in figures:
        if fig.name not in found:
            problems.append(f"README figure {fig.name!r} is missing (no <!-- figure: {fig.name} --> block)")
            continue
        if fig.inline and re.search(rf"^<!-- figure: {fig.name} -->", text, re.MULTILINE):
            problems.append(f"README figure {fig.name!r} is inline but its marker starts a line "
                            "(Markdown would take the line for raw HTML)")
        want, have = body(fig), found[fig.name]
        if fig.inline:  # a sentence may wrap anywhere in the README's source
            want, have = " ".join(want.split()), " ".join(have.split())
        if have != want:
            diff = "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(),
                                                  "README.md", "code now", lineterm=""))
            problems.append(f"README figure {fig.name!r} differs from what the code prints now:\n{diff}")
    return problems


def write(text: str) -> str:
    """``text`` with every figure block replaced by what the code gives now."""
    by_name = {f.name: f for f in FIGURES}

    def replace(m: re.Match) -> str:
        fig = by_name.get(m["name"])
        if fig is None or not drift(m[0], (fig,)):  # unknown, or unchanged (an inline figure keeps its wrapping)
            return m[0]
        return f"<!-- figure: {fig.name} -->{body(fig)}<!-- /figure -->"

    return MARKER.sub(replace, text)


def refresh_golden() -> None:
    """Re-run the slow commands and store their verbatim outputs as the regression goldens."""
    GOLDEN.mkdir(parents=True, exist_ok=True)
    (GOLDEN / "sweep_whatif-oversubscription.txt").write_text(
        trainsim("sweep", "whatif-oversubscription"), encoding="utf-8")
    for name, argv in (("sweep_whatif-fp8-llama3-70b-dgx-h100.json", ("sweep", "whatif-fp8-llama3-70b-dgx-h100")),
                       # only the tables the README quotes: the other tables take many more minutes
                       ("validate.json", ("validate", "--tables", ",".join(VALIDATION_KEYS)))):
        trainsim(*argv, "--json", str(GOLDEN / name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="report figures that drifted (exit 1)")
    g.add_argument("--write", action="store_true", help="rewrite README.md's figure blocks")
    g.add_argument("--refresh-golden", action="store_true", help="re-run the slow commands (minutes)")
    args = p.parse_args(argv)
    if args.refresh_golden:
        refresh_golden()
        return 0
    text = README.read_text(encoding="utf-8")
    if args.write:
        README.write_text(write(text), encoding="utf-8")
        return 0
    problems = drift(text)
    print("\n\n".join(problems) or "README figures match the code")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
