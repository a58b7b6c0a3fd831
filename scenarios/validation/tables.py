"""The published tables ``trainsim validate`` compares with, as :class:`Row` objects (not yet predicted).

Every table is a CSV in ``scenarios/data/`` copied, with its source columns, from the project's
validation set. A row either names a catalog scenario, carries a scenario dict built from the CSV
columns (``scenario``), or says why no scenario can express it (``not_expressible``): such rows are
listed, never silently skipped or run with a config the measurement did not use.

Assumptions shared by the rows built here (no per-row knob): mixed precision, Megatron's unfused
attention with dropout 0.1 for Megatron runs, micro-batch 1 where the source does not state it, and an
interleaving depth equal to the smallest chunk count above 1 dividing a stage's layers (the catalog's
choice for SC'21 Table 1).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "data"
SC21_MODELS = {"1.7": "gpt-1.7b", "3.6": "gpt-3.6b", "7.5": "gpt-7.5b", "18.4": "gpt-18b", "39.1": "gpt-39b",
               "76.1": "gpt-76b", "145.6": "gpt-145b", "310.1": "gpt-310b", "529.6": "gpt-530b", "1008.0": "gpt-1t"}
KORTHIKANTI_MODELS = {"22B": "22b", "175B (GPT-3)": "175b", "530B (MT-NLG)": "530b", "1T": "1t"}
TABLE4 = {"Baseline no recompute": {}, "Sequence Parallelism": {"sequence_parallel": True},
          "Baseline with (full) recompute": {"recompute_granularity": "full"},
          "Selective Recompute": {"recompute_granularity": "selective"},
          "Selective + Sequence": {"recompute_granularity": "selective", "sequence_parallel": True}}
MEGATRON_2021_MODEL = {"attention_backend": "unfused", "hidden_dropout": 0.1, "attention_dropout": 0.1}
GPUS_PER_DGX = 8


@dataclass
class Row:
    """One published measurement and, once predicted, the model's value.

    ``error`` is signed: predicted / measured - 1 (a fraction). ``group`` names the model (and, where
    a table holds several, the metric or the strong-scaling series: MegaScale's global batch) of a row,
    for ranking plans within a table; ``gpus`` is the run's GPU count.
    """

    table: str
    name: str
    metric: str
    unit: str
    measured: float
    predicted: float = float("nan")
    wall_s: float = 0.0
    key: str = ""
    scenario: dict[str, Any] | None = None
    not_expressible: str | None = None
    group: str = ""
    gpus: int = 0
    in_sample: bool = False
    curve: tuple[float, float] | None = field(default=None, repr=False)
    """``(a, b)`` with time(f) = a + b / f in the row's unit of time, f the sustained clock fraction
    (filled for in-sample rows by the leave-one-source-out refit)."""
    measured_memory_gib: float | None = None
    """Published peak memory per GPU where the source gives one (torchtitan: reserved, GiB)."""
    predicted_memory_gib: float = float("nan")
    """The model's reserved memory per GPU for such a row (GiB), once predicted."""

    @property
    def microbatches(self) -> int | None:
        """Micro-batches per pipeline per iteration, global batch / (data-parallel size x micro-batch), of a
        built scenario that states all three (``None`` otherwise, e.g. catalog rows)."""
        sc = self.scenario or {}
        par, tr = sc.get("parallel", {}), sc.get("training", {})
        try:
            return int(tr["global_batch_size"]) // (int(par["data_parallel_size"]) * int(tr["micro_batch_size"]))
        except (KeyError, TypeError, ZeroDivisionError):
            return None

    @property
    def row_id(self) -> str:
        """``"<table key>:<row name>"``, the form ``fitted_to`` lists in calibration.toml."""
        return f"{self.key}:{self.name}"

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def is_rate(self) -> bool:
        """Whether the metric is a rate (inversely proportional to the iteration time)."""
        return self.unit in ("TFLOP/s", "tokens/s")

    @property
    def expressible(self) -> bool:
        return self.not_expressible is None


def _csv(name: str) -> list[dict[str, str]]:
    with (DATA / name).open(newline="") as f:
        return list(csv.DictReader(f))


def interleave_depth(layers_per_stage: int) -> int | None:
    """Smallest chunk count above 1 dividing ``layers_per_stage`` (``None``: one layer, no interleaving)."""
    return next((v for v in range(2, layers_per_stage + 1) if layers_per_stage % v == 0), None)


def _megatron_scenario(name: str, *, nodes: int, model: dict, tp: int, pp: int, dp: int, gbs: int, mbs: int,
                       recompute: str, sequence_parallel: bool = False, layers: int,
                       system: dict | None = None) -> dict[str, Any]:
    """A Megatron-LM run of 2020-2023 on DGX A100 (fp16, 2021 Megatron's model settings): interleaved where
    the stage's layers allow, and pipeline exchanges batched and synchronised (``overlap_p2p_comm = false``:
    Megatron-LM added the overlapped exchanges in May 2023, after every run built here)."""
    par: dict[str, Any] = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                           "data_parallel_size": dp, "recompute_granularity": recompute}
    if sequence_parallel:
        par["sequence_parallel"] = True
    if pp > 1 and (vp := interleave_depth(layers // pp)) is not None:
        par["virtual_pipeline_model_parallel_size"] = vp
    if pp > 1:  # Megatron-LM before 2023-05 (every table built here): exchanges batched and synchronised
        par["overlap_p2p_comm"] = False
    return {"name": name, "system": {"name": "dgx-a100", "nodes": nodes, **(system or {})},
            "model": {**MEGATRON_2021_MODEL, **model}, "parallel": par,
            "training": {"dtype": "fp16", "global_batch_size": gbs, "micro_batch_size": mbs},
            "simulation": {"mode": "auto"}}


def sc21_table1() -> list[Row]:
    """SC'21 Table 1: TFLOP/s per GPU, catalog scenarios ``sc21-gpt-*``."""
    return [Row("SC'21 Table 1", f"sc21-{SC21_MODELS[r['model_params_B']]}", "TFLOP/s per GPU", "TFLOP/s",
                float(r["tflops_per_gpu"]), key="sc21", group="GPT 1.7B-1T weak scaling", gpus=int(r["num_gpus"]))
            for r in _csv("megatron_sc21_table1.csv")]


def korthikanti_table5() -> list[Row]:
    """Korthikanti Table 5: iteration time, catalog scenarios ``korthikanti-*``."""
    out = []
    for r in _csv("korthikanti2022.csv"):
        if r["subtable"].startswith("Table 3"):
            size = KORTHIKANTI_MODELS[r["model"]]
            for variant, col in (("full-recompute", "iter_time_full_recompute_s"),
                                 ("sp-selective", "iter_time_present_work_s")):
                out.append(Row("Korthikanti Table 5", f"korthikanti-{size}-{variant}", "iteration time", "s",
                               float(r[col]), key="t5", group=size, gpus=int(r["num_gpus"])))
    return out


def korthikanti_table4() -> list[Row]:
    """Korthikanti Table 4: forward and backward ms of one 22B layer, simulated directly."""
    out = []
    for r in _csv("korthikanti2022.csv"):
        if r["subtable"].startswith("Table 4"):
            for metric, col in (("layer forward", "forward_ms"), ("layer backward", "backward_ms")):
                out.append(Row("Korthikanti Table 4", r["configuration"], metric, "ms", float(r[col]),
                               key="t4", group=f"22B {metric}", gpus=8))
    return out


def megascale_table2() -> list[Row]:
    """MegaScale (NSDI'24) Table 2, Megatron-LM baseline: 175B (128 heads, vocabulary 64,000) strong
    scaling on 256-12,288 GPUs, TP 8 x PP 8 with 6 interleaved chunks, iteration time.

    The cluster is the paper's (system ``megascale-ampere``, its sec. 5: eight 200G NICs per 8-GPU
    server on eight rails, 64 servers under one set of ToRs, three Clos tiers at 1:1). Not stated,
    assumed: A100 80 GB GPUs (the paper's "Ampere GPUs"), micro-batch 1, sequence parallel + selective
    recomputation (Megatron's 2023 default for this size), the distributed optimizer (the paper's
    "ZeRO-2 style" data parallelism). From the baseline's code (Megatron-LM commit 285068c8, January
    2023): pipeline exchanges batched and synchronised (``overlap_p2p_comm = false``, the only mode then).
    """
    out = []
    for r in _csv("megascale_table2_megatron.csv"):
        gpus, tp, pp, dp = (int(r[k]) for k in ("num_gpus", "TP", "PP", "DP"))
        name = f"megascale-175b-{gpus}gpu"
        sc = _megatron_scenario(
            name, nodes=gpus // GPUS_PER_DGX, tp=tp, pp=pp, dp=dp, gbs=int(r["global_batch"]), mbs=1,
            model={"name": "gpt3-175b", "num_attention_heads": int(r["heads"]), "vocab_size": int(r["vocab"]),
                   "seq_length": int(r["seq_len"])},
            recompute="selective", sequence_parallel=True, layers=int(r["layers"]),
            system={"name": "megascale-ampere"})
        sc["parallel"]["virtual_pipeline_model_parallel_size"] = int(r["VP"])
        sc["parallel"]["use_distributed_optimizer"] = True
        out.append(Row("MegaScale Table 2", name, "iteration time", "s", float(r["iteration_time_s"]),
                       key="megascale", scenario=sc, group=f"GPT 175B, TP 8 x PP 8, global batch {r['global_batch']}",
                       gpus=gpus))
    return out


def sc21_table2(zero3: bool = False) -> list[Row]:
    """SC'21 Table 2: ZeRO-3 (DeepSpeed) vs PTD-P on 175B and 530B, TFLOP/s per GPU; the PTD-P rows, or
    with ``zero3`` the ZeRO-3 rows. PTD-P rows are simulated with the SC'21 Table 1 settings (TP 8 assumed
    by the source file, full recomputation); ZeRO-3 rows as DeepSpeed ran them (``zero_stage = 3``,
    ``zero_impl = "deepspeed"``, data parallelism only, the table's micro-batch), with the same model
    settings and full recomputation. The ZeRO-3 rows are a table key of their own (``sc21t2-zero3``,
    opt-in): each gathers every weight over 384-2,240 GPUs several times per layer, minutes to an hour
    of simulation per row."""
    out = []
    for r in _csv("megatron_sc21_table2.csv"):
        if ("(ZeRO-3" in r["subtable"]) != zero3:
            continue
        tp, pp, dp, gpus = (int(r[k]) for k in ("TP", "PP", "DP", "num_gpus"))
        size = "175b" if r["model_params_B"].startswith("174") else "530b"
        name = f"sc21t2-{size}-{'zero3' if zero3 else 'ptdp'}-{gpus}gpu"
        row = Row("SC'21 Table 2", name, "TFLOP/s per GPU", "TFLOP/s", float(r["tflops_per_gpu"]),
                  key="sc21t2-zero3" if zero3 else "sc21t2", group=f"GPT {size.upper()}", gpus=gpus)
        gbs = int(r["global_batch_size"].rstrip("*"))
        model = "gpt3-175b" if size == "175b" else "gpt-530b"
        row.scenario = _megatron_scenario(name, nodes=gpus // GPUS_PER_DGX, model={"name": model}, tp=tp,
                                          pp=pp, dp=dp, gbs=gbs, mbs=int(r["micro_batch_size"]),
                                          recompute="full", layers=int(r["layers"]))
        if zero3:
            row.scenario["parallel"].update(zero_stage=3, zero_impl="deepspeed")
        out.append(row)
    return out


def megatron_readme_2020() -> list[Row]:
    """Megatron-LM README (2020): GPT 1.2B-8.3B, TP 1-8, on one DGX A100 (global batch 16) and with
    128-way data parallelism (global batch 2048), iteration time. Per-GPU batch 16 as one micro-batch
    (2020 Megatron's ``--batch-size`` was per GPU), full recomputation (``--checkpoint-activations`` in
    its example scripts), A100 40 GB (presumed by the source)."""
    out = []
    for r in _csv("megatron_readme_2020_a100.csv"):
        tp, dp, gpus = int(r["TP"]), int(r["DP"]), int(r["num_gpus"])
        name = f"readme2020-{r['model_params_B']}b-{gpus}gpu"
        model = {"name": "gpt-1.7b", "num_layers": int(r["layers"]), "hidden_size": int(r["hidden_size"]),
                 "num_attention_heads": int(r["attention_heads"]), "seq_length": int(r["seq_len"]),
                 "vocab_size": int(r["vocab"])}
        gbs = int(r["global_batch_size"])
        # a run on 1, 2 or 4 GPUs of a DGX: a node of that many GPUs on the same NVSwitch fabric
        shape = {"gpus_per_node": gpus} if gpus < GPUS_PER_DGX else {}
        sc = _megatron_scenario(name, nodes=max(1, gpus // GPUS_PER_DGX), model=model, tp=tp, pp=1, dp=dp,
                                gbs=gbs, mbs=gbs // dp, recompute="full", layers=int(r["layers"]),
                                system={"gpu": "A100-SXM4-40GB", **shape})
        out.append(Row("Megatron README 2020", name, "iteration time", "s", float(r["iteration_time_s"]),
                       key="readme2020", scenario=sc, group="weak scaling" if dp == 1 else "128-way DP", gpus=gpus))
    return out


TORCHTITAN_MODELS = {"Llama 3.1 8B": "llama3-8b", "Llama 3 8B": "llama3-8b", "Llama 3 70B": "llama3-70b"}
TORCHTITAN_RECOMPUTE = {"selective (op)": "selective_op", "per-op SAC": "selective_op", "full": "full"}


def torchtitan_dtype(precision: str) -> str:
    """The training dtype of a torchtitan CSV row's ``precision`` cell: ``BF16``, or torchtitan's Float8
    setting as its benchmark tables print it, ``None (bfloat16)`` (no Float8: BF16 mixed precision).

    Raises:
        ValueError: any other cell (a Float8 row would need its recipe), naming the allowed ones.
    """
    cell = precision.strip().lower()
    if cell in ("bf16", "none (bfloat16)"):
        return "bf16"
    raise ValueError(f"torchtitan_llama3_h100_bf16.csv: precision {precision!r} not read; allowed: BF16, "
                     f"None (bfloat16)")


def _torchtitan_scenario(name: str, r: dict[str, str], *, compile_: bool, async_tp: bool) -> dict[str, Any]:
    """A torchtitan run (FSDP2, optionally TP) on Grand Teton nodes: 8 H100 SXM5 96 GB at 500 W per node on
    NVLink, one 400 Gb/s NIC per GPU (dgx-h100's node with the 500 W part), BF16, PyTorch SDPA (its flash
    kernel is FlashAttention-2), one micro-batch of the local batch per step (torchtitan has no gradient
    accumulation by default)."""
    gpus, tp, local_batch = int(r["num_gpus"]), int(r["TP"] or 1), int(r["micro_batch"])
    dp = gpus // tp
    par: dict[str, Any] = {"tensor_model_parallel_size": tp, "data_parallel_size": dp, "fsdp": True,
                           "recompute_granularity": TORCHTITAN_RECOMPUTE[r["recompute"]]}
    if tp > 1:  # torchtitan's TP plan shards the norms' sequence: Megatron's sequence parallelism
        par["sequence_parallel"] = True
        par["async_tp"] = async_tp
    return {"name": name, "system": {"name": "dgx-h100", "nodes": gpus // GPUS_PER_DGX, "gpu": "H100-SXM5-96GB-500W"},
            "model": {"name": TORCHTITAN_MODELS[r["model"]], "seq_length": 8192, "attention_backend": "flash2"},
            "parallel": par,
            "training": {"dtype": torchtitan_dtype(r["precision"]), "global_batch_size": local_batch * dp,
                         "micro_batch_size": local_batch,
                         "compile": compile_},
            "simulation": {"mode": "auto"}}


def torchtitan_h100() -> list[Row]:
    """torchtitan Llama 3 on H100 SXM5 96 GB at 500 W (Grand Teton), BF16, tokens/s per GPU. The async-TP
    rows (both with torch.compile, per their commands) give two rows each: vanilla TP and async TP. The
    sequence is torchtitan's default config's 8192 (not stated in the tables). Reserved memory, where
    published ('mem 82.4 GiB'), is kept on the row (``measured_memory_gib``) for the memory comparison."""
    out = []
    for r in _csv("torchtitan_llama3_h100_bf16.csv"):
        # the async-TP rows' run names repeat their precision cell, "(None (bfloat16))": said once, by dtype
        run = r["run"].split("torchtitan ")[-1].removesuffix(f" ({r['precision']})")
        compile_ = "torch.compile" in run or "async-TP" in run
        other = r["other_metric"]
        mem = other.removeprefix("mem ").removesuffix(" GiB") if other.startswith("mem ") else ""
        variants = [("", r["tokens_per_s_per_gpu"], False)]
        if "async-TP" in run:
            vanilla, async_ = (v.split()[0] for v in r["tokens_per_s_per_gpu"].split(" / "))
            variants = [(" vanilla TP", vanilla, False), (" async TP", async_, True)]
        for suffix, tokens, async_tp in variants:
            name = f"torchtitan-{run}{suffix}"
            out.append(Row("torchtitan H100 BF16", name, "tokens/s per GPU", "tokens/s", float(tokens),
                           key="torchtitan", scenario=_torchtitan_scenario(name, r, compile_=compile_,
                                                                           async_tp=async_tp),
                           group=r["model"], gpus=int(r["num_gpus"]), measured_memory_gib=float(mem) if mem else None))
    return out


TABLES: dict[str, tuple[str, Callable[[], list[Row]]]] = {
    "sc21": ("SC'21 Table 1", sc21_table1),
    "t5": ("Korthikanti Table 5", korthikanti_table5),
    "t4": ("Korthikanti Table 4", korthikanti_table4),
    "sc21t2": ("SC'21 Table 2 (PTD-P)", sc21_table2),
    "sc21t2-zero3": ("SC'21 Table 2 (ZeRO-3, DeepSpeed)", lambda: sc21_table2(zero3=True)),
    "megascale": ("MegaScale Table 2", megascale_table2),
    "readme2020": ("Megatron README 2020", megatron_readme_2020),
    "torchtitan": ("torchtitan H100 BF16", torchtitan_h100),
}
"""``--tables`` key -> (title, loader)."""


def rows(tables: tuple[str, ...] = tuple(TABLES)) -> list[Row]:
    """The published rows of ``tables`` (``TABLES`` keys), in table order, not yet predicted.

    Raises:
        ValueError: an unknown table key (one line with the allowed keys).
    """
    bad = [t for t in tables if t not in TABLES]
    if bad:
        raise ValueError(f"--tables: unknown {bad}; allowed: {', '.join(TABLES)}")
    return [r for key in TABLES if key in tables for r in TABLES[key][1]()]
