"""The search space: parallel plans (candidates) for one model on one cluster, and why some are invalid.

A :class:`Candidate` is one parallel plan in Megatron-LM's terms. :func:`enumerate_space` walks the
cartesian product of the knob values (defaults from the model and the cluster, restricted by
``--space`` and pinned by ``--fix``), normalises knobs that have no effect in a plan (overlap of a
parameter gather without a distributed optimizer, ...) so each distinct plan appears once, and checks
each plan with :class:`workload.parallel.config.ParallelConfig` itself (``resolve`` and
``validate_model``): a rejected plan carries the config's own one-line reason (heads, layers, batch or
sequence not divisible, EP on a dense model, ...). Memory is not checked here (the screen does).

Knobs, named as scenario keys (``section.key``):

=============================================  ===============================================
``parallel.tensor_model_parallel_size``        TP: powers of two up to the GPUs of one node
``parallel.sequence_parallel``                 SP with TP > 1: true, false
``parallel.context_parallel_size``             CP: 1, 2, 4 (seq_length >= 8k: up to 8)
``parallel.expert_model_parallel_size``        EP (MoE only): powers of two dividing the experts
``parallel.pipeline_model_parallel_size``      PP: powers of two up to the layers
``parallel.virtual_pipeline_model_parallel_size``  interleaved depth: 1 (plain 1F1B), 2, 4
``parallel.zero_stage``                        0 (DDP), 1 (distributed optimizer), 2, 3 (FSDP)
``parallel.zero_impl``                         megatron (PyTorch FSDP-like ZeRO-3); deepspeed (DeepSpeed's
                                               ZeRO-3, PP 1 only; named alone, only ZeRO-3 plans); default:
                                               the scenario's
``parallel.recompute_granularity``             none, selective, full, selective_op (torchtitan's per-op SAC)
``parallel.overlap_grad_reduce``               true, false
``parallel.overlap_param_gather``              true, false (ZeRO 1 with overlap_grad_reduce only)
``parallel.tp_comm_overlap``                   true, false (SP only; Megatron-Core ``--tp-comm-overlap``)
``parallel.async_tp``                          true, false (SP only; torchtitan's async TP, which torchtitan
                                               runs only compiled: a plan with it sets ``training.compile``)
``parallel.rank_order``                        tp-cp-ep-dp-pp (Megatron's default), tp-cp-ep-pp-dp
                                               (``--use-tp-pp-dp-mapping``); only when DP and PP > 1
``parallel.num_layers_in_first_pipeline_stage``  uneven stages: by default the balanced splits
``parallel.num_layers_in_last_pipeline_stage``   (:func:`scenarios.search.stages.end_splits`), ends smaller
                                               or larger than the middle stages; ``none`` = even
``training.micro_batch_size``                  1, 2, 4
``training.fp8_recipe``                        dtype fp8 only (else bad input): delayed, tensorwise, rowwise,
                                               mxfp8 (those the GPU runs); default: the scenario's
``training.recompute_method``                  with full recomputation: uniform, block (Megatron-LM's
                                               ``--recompute-method``); default: block where it helps, below
``training.recompute_num_layers``              its ``--recompute-num-layers`` (block: 0 = none)
=============================================  ===============================================

Full recomputation of ``k`` layers per stage (``--recompute-method block --recompute-num-layers k``)
is between none and full in both time and memory, so by default the search adds, per plan shape whose
plan without recomputation does not fit but whose full-recompute plan does, the block plan with the
fewest layers that fits (:func:`scenarios.search.driver.add_block_recompute`). Naming
``training.recompute_num_layers`` with ``--space``/``--fix`` replaces that with the values given (method
block unless ``training.recompute_method`` says uniform).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from dataclasses import field as dc_field
from typing import Any

from scenarios.search.flags import plan_flags
from scenarios.search.stages import end_splits
from workload.fp8 import DEFAULT_RECIPE, RECIPES
from workload.parallel.config import AXES, RECOMPUTE_ALL, ZERO_IMPLS, ParallelConfig
from workload.parallel.recompute import RECOMPUTE_METHODS

KNOBS: dict[str, str] = {
    "parallel.tensor_model_parallel_size": "tp",
    "parallel.sequence_parallel": "sp",
    "parallel.context_parallel_size": "cp",
    "parallel.expert_model_parallel_size": "ep",
    "parallel.pipeline_model_parallel_size": "pp",
    "parallel.virtual_pipeline_model_parallel_size": "vpp",
    "parallel.zero_stage": "zero",
    "parallel.recompute_granularity": "recompute",
    "parallel.overlap_grad_reduce": "overlap_grad_reduce",
    "parallel.overlap_param_gather": "overlap_param_gather",
    "parallel.tp_comm_overlap": "tp_comm_overlap",
    "parallel.async_tp": "async_tp",
    "parallel.rank_order": "rank_order",
    "parallel.num_layers_in_first_pipeline_stage": "first_layers",
    "parallel.num_layers_in_last_pipeline_stage": "last_layers",
    "training.micro_batch_size": "mbs",
    "parallel.zero_impl": "zero_impl",
    "training.fp8_recipe": "fp8_recipe",
    "training.recompute_method": "recompute_method",
    "training.recompute_num_layers": "recompute_num_layers",
}
"""``--fix``/``--space`` key -> :class:`Candidate` field."""

BOOL_KNOBS = ("sp", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "async_tp")
INT_KNOBS = ("tp", "cp", "ep", "pp", "vpp", "zero", "mbs", "recompute_num_layers")
STAGE_KNOBS = ("first_layers", "last_layers")
"""Layers on the first / last pipeline stage; 0 (``none`` on the command line) = an even split."""
DEFAULT_RANK_ORDER = ParallelConfig().rank_order
RANK_ORDERS = (DEFAULT_RANK_ORDER, "tp-cp-ep-pp-dp")
"""Megatron-LM's two mappings: the default, and ``--use-tp-pp-dp-mapping`` (pipeline stages inner to
data-parallel replicas: a stage's p2p peers nearer, the gradient all-reduce across more nodes)."""
VPP_DEPTHS = (1, 2, 4)
"""Model chunks per stage in the default space: plain 1F1B, and interleaving 2 or 4 deep (Megatron-LM's
published runs use 2-6 chunks per stage; ``--space`` opens others)."""
MICRO_BATCH_SIZES = (1, 2, 4)


@dataclass(frozen=True, order=True)
class Candidate:
    """One parallel plan. ``dp`` is derived: world / (tp x cp x pp)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    sp: bool = False
    zero: int = 0
    """0 DDP, 1 distributed optimizer, 2 + sharded gradients, 3 FSDP (ZeRO-3)."""
    mbs: int = 1
    recompute: str = "none"
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    async_tp: bool = False
    rank_order: str = DEFAULT_RANK_ORDER
    first_layers: int = 0
    """Layers on the first pipeline stage (0: an even split)."""
    last_layers: int = 0
    """Layers on the last pipeline stage (0: an even split)."""
    zero_impl: str = "megatron"
    """Which ZeRO-3 runs (``ParallelConfig.zero_impl``): ``deepspeed`` only with ``zero = 3``."""
    fp8_recipe: str = ""
    """``[training] fp8_recipe`` of an FP8 run; ``""``: the scenario's (or not FP8 training)."""
    recompute_method: str = ""
    """With ``recompute = "full"``: Megatron's ``uniform`` or ``block``; ``""``: every layer."""
    recompute_num_layers: int = 0
    """With ``recompute_method``: Megatron's ``--recompute-num-layers``."""

    @property
    def schedule(self) -> str:
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"

    def training_section(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The scenario's ``[training]`` table for this plan: ``base`` with the plan's micro-batch, its
        FP8 recipe, ``compile = true`` under async TP (torchtitan runs async TP only compiled) and its
        recompute method (``base``'s is the scenario's plan's, not this one's)."""
        out: dict[str, Any] = {k: v for k, v in (base or {}).items() if k not in ("recompute_method",
                                                                                 "recompute_num_layers")}
        out["micro_batch_size"] = self.mbs
        if self.fp8_recipe and self.fp8_recipe != out.get("fp8_recipe", DEFAULT_RECIPE):
            out["fp8_recipe"] = self.fp8_recipe
        if self.async_tp:
            out["compile"] = True
        if self.recompute_method:
            out.update(recompute_method=self.recompute_method, recompute_num_layers=self.recompute_num_layers)
        return out

    def parallel_section(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The scenario's ``[parallel]`` table for this plan; ``base``'s keys the search does not vary
        (grad_bucket_size_bytes, moe_tokens_per_expert, overlap_p2p_comm: properties of the framework the
        scenario runs, which the screen does not price) are kept."""
        keep = ("grad_bucket_size_bytes", "moe_tokens_per_expert", "overlap_p2p_comm")
        out: dict[str, Any] = {k: v for k, v in (base or {}).items() if k in keep}
        out.update(tensor_model_parallel_size=self.tp, pipeline_model_parallel_size=self.pp)
        if self.cp > 1:
            out["context_parallel_size"] = self.cp
        if self.ep > 1:
            out["expert_model_parallel_size"] = self.ep
        if self.vpp > 1:
            out["virtual_pipeline_model_parallel_size"] = self.vpp
        if self.sp:
            out["sequence_parallel"] = True
        if self.zero == 1:
            out["use_distributed_optimizer"] = True
        elif self.zero == 3 and self.zero_impl == "deepspeed":
            out.update(zero_stage=3, zero_impl="deepspeed")
        elif self.zero == 3:
            out["fsdp"] = True
        elif self.zero:
            out["zero_stage"] = self.zero
        if self.recompute != "none":
            out["recompute_granularity"] = self.recompute
        out.update({k: True for k in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "async_tp")
                    if getattr(self, k)})
        if self.rank_order != DEFAULT_RANK_ORDER:
            out["rank_order"] = self.rank_order
        if self.first_layers:
            out["num_layers_in_first_pipeline_stage"] = self.first_layers
        if self.last_layers:
            out["num_layers_in_last_pipeline_stage"] = self.last_layers
        return out

    def config(self, global_batch_size: int, base: Mapping[str, Any] | None = None) -> ParallelConfig:
        """The resolved :class:`ParallelConfig` (raises its ``ValueError`` when the plan is invalid)."""
        kw = self.parallel_section(base)
        return ParallelConfig(**kw, micro_batch_size=self.mbs, global_batch_size=global_batch_size,
                              recompute_method=self.recompute_method or None,
                              recompute_num_layers=self.recompute_num_layers if self.recompute_method else None
                              ).resolve(self.tp * self.cp * self.pp * self.dp)

    def flags(self, global_batch_size: int | None = None, num_layers: int | None = None) -> str:
        """The plan as the command line of the framework that runs it (:func:`scenarios.search.flags.plan_flags`:
        Megatron-LM's flags, or torchtitan's for an async-TP plan, whose batch and stage-split flags take the
        scenario's ``global_batch_size`` and ``num_layers``)."""
        return plan_flags(self, global_batch_size, num_layers)

    def short(self) -> str:
        """Compact label, e.g. ``TP8 SP PP4x2 DP2 Z1 mbs1 sel ogr``."""
        parts = [f"TP{self.tp}" + (" SP" if self.sp else "")]
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        parts.append(f"PP{self.pp}" + (f"x{self.vpp}" if self.vpp > 1 else "")
                     + (f"({self.first_layers or '-'}/{self.last_layers or '-'})" if self.first_layers or
                        self.last_layers else ""))
        parts.append(f"DP{self.dp}")
        parts.append(("DSZ3" if self.zero_impl == "deepspeed" else "FSDP") if self.zero == 3 else f"Z{self.zero}")
        parts.append(f"mbs{self.mbs}")
        parts.append({"none": "norc", "selective": "sel", "full": "full", "selective_op": "sac"}[self.recompute]
                     + (f"-{self.recompute_method}{self.recompute_num_layers}" if self.recompute_method else ""))
        if self.overlap_grad_reduce:
            parts.append("ogr")
        if self.overlap_param_gather:
            parts.append("opg")
        if self.tp_comm_overlap:
            parts.append("tpo")
        if self.async_tp:
            parts.append("atp")
        if self.rank_order != DEFAULT_RANK_ORDER:
            parts.append(self.rank_order)
        if self.fp8_recipe:
            parts.append(f"fp8-{self.fp8_recipe}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rejection:
    """A family of invalid plans: the reason (one line, naming the fields) and how many plans."""

    reason: str
    count: int
    example: Candidate


@dataclass(frozen=True)
class ModelFacts:
    """What the space needs to know about the model and the cluster."""

    num_layers: int
    num_attention_heads: int
    seq_length: int
    num_experts: int
    world_size: int
    gpus_per_node: int
    global_batch_size: int
    training: Mapping[str, Any] = dc_field(default_factory=dict, compare=False)
    """The scenario's ``[training]`` (dtype, fp8_recipe, compile, ...): what ``run`` checks a plan against."""
    gpu: Any = dc_field(default=None, compare=False)
    """The GPU (:class:`hwmodel.specs.GPUSpec`), for ``run``'s checks of the FP8 keys; ``None``: unchecked."""
    zero_impl: str = "megatron"
    """The scenario's ``[parallel] zero_impl``: the default value of that knob."""


def _powers_of_two(upto: int) -> list[int]:
    return [1 << i for i in range(int(math.log2(max(upto, 1))) + 1)]


def default_values(f: ModelFacts) -> dict[str, list[Any]]:
    """The default value list of every knob for this model and cluster."""
    cps = [c for c in (1, 2, 4, 8) if c <= (8 if f.seq_length >= 8192 else 4)]
    return {
        "tp": [t for t in _powers_of_two(f.gpus_per_node) if t <= f.world_size],
        "sp": [False, True],
        "cp": [c for c in cps if c <= f.world_size],
        "ep": [e for e in _powers_of_two(f.num_experts) if f.num_experts % e == 0] if f.num_experts > 1 else [1],
        "pp": [p for p in _powers_of_two(f.num_layers) if p <= f.world_size],
        "vpp": list(VPP_DEPTHS),
        "zero": [0, 1, 2, 3],
        "recompute": list(RECOMPUTE_ALL),
        "overlap_grad_reduce": [False, True],
        "overlap_param_gather": [False, True],
        "tp_comm_overlap": [False, True],
        "async_tp": [False, True],
        "rank_order": list(RANK_ORDERS),
        "first_layers": [0],
        "last_layers": [0],
        "mbs": list(MICRO_BATCH_SIZES),
        "zero_impl": [f.zero_impl],
        "fp8_recipe": [f.training.get("fp8_recipe", DEFAULT_RECIPE)] if f.training.get("dtype") == "fp8" else [""],
        "recompute_method": [""],
        "recompute_num_layers": [0],
    }


def _unquoted(field: str, raw: str, key: str) -> str:
    """``raw`` without the quotes of a TOML string, as ``run --set`` takes it; as there, a quoted number or
    boolean is a string, not the value it spells (ValueError naming ``key``)."""
    raw = raw.strip()
    if not (len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'"):
        return raw
    raw = raw[1:-1].strip()
    if field in BOOL_KNOBS or field in INT_KNOBS or field in STAGE_KNOBS and raw.lower() != "none":
        kind = "a boolean" if field in BOOL_KNOBS else "an integer"
        raise ValueError(f"{key}: {raw!r} is quoted, a TOML string, not {kind}; write it without quotes")
    return raw


def _parse_value(field: str, raw: str, key: str) -> Any:
    raw = _unquoted(field, raw, key)
    if field in BOOL_KNOBS:
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{key}: {raw!r} is not a boolean; allowed: true, false")
        return raw.lower() == "true"
    if field in INT_KNOBS:
        try:
            v = int(raw)
        except ValueError:
            raise ValueError(f"{key}: {raw!r} is not an integer") from None
        if field == "zero" and v not in (0, 1, 2, 3):
            raise ValueError(f"{key}: {v} is not a ZeRO stage; allowed: 0, 1, 2, 3")
        if v < 0 or v < 1 and field not in ("zero", "recompute_num_layers"):
            raise ValueError(f"{key}: {v} must be a " + ("non-negative integer (0: block recomputes no layer)"
                             if field == "recompute_num_layers" else "positive integer"))
        return v
    if field in STAGE_KNOBS:
        if raw.lower() == "none":
            return 0
        try:
            v = int(raw)
        except ValueError:
            raise ValueError(f"{key}: {raw!r} is not a layer count; allowed: a positive integer or none") from None
        if v < 1:  # the same refusal as run's (ParallelConfig): 0 is not an even split, "none" is
            raise ValueError(f"{key}: {v} must be a positive integer (or none for an even split)")
        return v
    if field == "rank_order":
        if sorted(raw.split("-")) != sorted(AXES):
            raise ValueError(f"{key}: {raw!r} is not an order of the axes; allowed: a permutation of "
                             f"{'-'.join(AXES)}, e.g. {', '.join(RANK_ORDERS)}")
        return raw
    allowed = {"recompute": RECOMPUTE_ALL, "zero_impl": ZERO_IMPLS, "fp8_recipe": tuple(RECIPES),
               "recompute_method": RECOMPUTE_METHODS}[field]
    if raw not in allowed:
        raise ValueError(f"{key}: unknown value {raw!r}; allowed: {', '.join(allowed)}")
    return raw


def parse_knobs(fix: Sequence[str] = (), space: Sequence[str] = ()) -> dict[str, list[Any]]:
    """``--fix section.key=value`` and ``--space section.key=v1,v2`` as ``{field: [values]}``.

    Raises:
        ValueError: one line naming an unknown key (with the allowed ones), a bad value, or a key given
            twice (by two ``--fix``, two ``--space``, or one of each).
    """
    out: dict[str, list[Any]] = {}
    given: dict[str, str] = {}  # knob field -> the flag that gave it
    for flag, items in (("--fix", fix), ("--space", space)):
        for item in items:
            if "=" not in item:
                raise ValueError(f"{flag} {item!r}: expected section.key=value")
            key, raw = (s.strip() for s in item.split("=", 1))
            if key not in KNOBS:
                raise ValueError(f"{flag} {key}: unknown key; allowed: {', '.join(KNOBS)}")
            field = KNOBS[key]
            if field in given:  # one knob, one set of values: a second one would silently replace the first
                raise ValueError(f"{flag} {key}: already given by {given[field]}; give each key once")
            given[field] = flag
            parts = [raw] if flag == "--fix" else [p for p in raw.split(",") if p.strip()]
            if not parts:
                raise ValueError(f"{flag} {key}: no values given")
            values = [_parse_value(field, p, key) for p in parts]
            out[field] = list(dict.fromkeys(values))
    return out


def satisfies(c: Candidate, knobs: Mapping[str, list[Any]]) -> bool:
    """Whether ``c`` takes one of the allowed values of every knob that ``--fix``/``--space`` names (a rank
    order that lays every rank out alike counts as the same)."""
    for f, vals in knobs.items():
        if f in ("recompute_method", "recompute_num_layers"):
            if not recompute_wanted(c, knobs):
                return False
        elif f == "rank_order":
            if not any(_effective_order(c, o) == _effective_order(c, c.rank_order) for o in vals):
                return False
        elif getattr(c, f) not in vals:
            return False
    return True


def empty_space_reason(facts: ModelFacts, knobs: Mapping[str, list[Any]]) -> str:
    """Why the TP/CP/PP values given leave no factorisation of the cluster: one line naming each value."""
    names = {"tp": "parallel.tensor_model_parallel_size", "cp": "parallel.context_parallel_size",
             "pp": "parallel.pipeline_model_parallel_size"}
    why = []
    for field, key in names.items():
        for v in knobs.get(field, []):
            bad = [f"the {facts.world_size} GPUs"] if facts.world_size % v else []
            if field == "tp" and facts.num_attention_heads % v:
                bad.append(f"the {facts.num_attention_heads} attention heads")
            if len(bad) == 2:
                why.append(f"{key}={v} divides neither {bad[0]} nor {bad[1]}")
            elif bad:
                why.append(f"{key}={v} does not divide {bad[0]}")
    if not why:
        why.append(f"no product TP x CP x PP of the values given divides the {facts.world_size} GPUs")
    return "the space is empty: " + "; ".join(why)


def normalise(c: Candidate, keep_rank_order: bool = False) -> Candidate:
    """Knobs without effect in this plan set to their neutral value, so equal plans compare equal
    (``keep_rank_order``: the rank order is left as given)."""
    if c.tp == 1 and c.sp:
        return c  # left for the config's reason (sequence_parallel needs TP > 1)
    if c.dp * c.cp == 1 and (c.overlap_grad_reduce or c.zero):  # no data-parallel group to reduce over
        c = replace(c, overlap_grad_reduce=False, zero=0)
    if c.overlap_param_gather and (c.zero != 1 or not c.overlap_grad_reduce):  # Megatron-LM's rule (ParallelConfig)
        c = replace(c, overlap_param_gather=False)
    if c.zero == 3 and c.overlap_grad_reduce:  # FSDP reduce-scatters each unit as its backward ends
        c = replace(c, overlap_grad_reduce=False)
    if c.zero != 3 and c.zero_impl != "megatron":  # zero_impl says only how ZeRO-3 runs
        c = replace(c, zero_impl="megatron")
    if c.recompute_method and c.recompute != "full":  # the method applies to full recomputation only
        c = replace(c, recompute_method="", recompute_num_layers=0)
    elif c.recompute_method == "block" and c.recompute_num_layers == 0:  # no layer checkpointed
        c = replace(c, recompute="none", recompute_method="", recompute_num_layers=0)
    elif c.recompute_method == "uniform" and c.recompute_num_layers == 1:  # every layer: the default
        c = replace(c, recompute_method="", recompute_num_layers=0)
    if not c.sp and (c.tp_comm_overlap or c.async_tp):
        return c  # left for the config's reason (TP overlap needs sequence parallelism)
    if not keep_rank_order and c.rank_order != DEFAULT_RANK_ORDER and _effective_order(
            c, c.rank_order) == _effective_order(c, DEFAULT_RANK_ORDER):
        c = replace(c, rank_order=DEFAULT_RANK_ORDER)
    return c


def _effective_order(c: Candidate, order: str) -> list[str]:
    """The axes of ``order`` that have more than one rank (EP is carved out of DP): two orders with the
    same list lay every rank out alike."""
    sizes = {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp, "ep": 1}
    return [a for a in order.split("-") if sizes[a] > 1]


def _shape_options(shape: Mapping[str, Any], dp: int, values: Mapping[str, list[Any]],
                   asked: Any) -> dict[str, list[Any]]:
    """The inner knobs' values for one shape: knobs without effect in it (normalise would fold them), or
    plans no framework runs, are not expanded unless ``--fix``/``--space`` asks for them."""
    options = dict(values)
    if not shape["sp"] and not (asked("tp_comm_overlap") or asked("async_tp")):
        options["tp_comm_overlap"] = options["async_tp"] = [False]
    if (shape["zero"] in (1, 2) or shape["zero"] == 3 and shape["zero_impl"] == "deepspeed") and not asked(
            "async_tp"):  # torchtitan's async TP beside Megatron's or DeepSpeed's ZeRO: no stack runs it
        options["async_tp"] = [False]
    if (shape["pp"] == 1 or dp * shape["cp"] == 1) and not asked("rank_order"):
        options["rank_order"] = [DEFAULT_RANK_ORDER]
    if (shape["zero"] == 3 or dp * shape["cp"] == 1) and False in values["overlap_grad_reduce"]:
        options["overlap_grad_reduce"] = [False]
    return options


def enumerate_space(facts: ModelFacts, model_cfg: Any, knobs: Mapping[str, list[Any]] | None = None,
                    base_parallel: Mapping[str, Any] | None = None,
                    ) -> tuple[list[Candidate], list[Rejection]]:
    """Every distinct valid plan, and the invalid ones grouped by reason (most plans first).

    ``knobs`` replaces the default value list of the fields it names (:func:`parse_knobs`).
    """
    check_knobs(facts, knobs or {})
    values = default_values(facts)
    values.update(knobs or {})
    if facts.num_experts <= 1 and "ep" not in (knobs or {}):
        values["ep"] = [1]
    _recompute_values(values, knobs or {})
    outer = ("tp", "sp", "cp", "ep", "pp", "vpp", "zero", "mbs", "overlap_param_gather", "first_layers", "last_layers",
             "zero_impl", "fp8_recipe")
    inner = ("recompute", "overlap_grad_reduce", "tp_comm_overlap", "async_tp", "rank_order", "recompute_method",
             "recompute_num_layers")
    # a rank order pinned by --fix is kept where it lays ranks out like the default, so it is emitted and shown
    pinned_order = "rank_order" in (knobs or {}) and len(values["rank_order"]) == 1
    seen: set[Candidate] = set()
    valid: list[Candidate] = []
    reasons: dict[str, list[Any]] = {}
    check_cache: dict[tuple, str | None] = {}

    def asked(field: str) -> bool:
        return field in (knobs or {})

    for combo in itertools.product(*(values[k] for k in outer)):
        shape = dict(zip(outer, combo, strict=True))
        model_par = shape["tp"] * shape["cp"] * shape["pp"]
        if facts.world_size % model_par:
            continue  # not a factorisation of the cluster: no plan at all
        dp = facts.world_size // model_par
        if _folded_shape(shape, dp, values, asked("zero_impl")):
            continue
        splits = [(shape["first_layers"], shape["last_layers"])]
        if not (asked("first_layers") or asked("last_layers")):
            splits = end_splits(facts.num_layers, shape["pp"], shape["vpp"])
        options = _shape_options(shape, dp, values, asked)
        for (first, last), rest in itertools.product(splits, itertools.product(*(options[k] for k in inner))):
            kw = {**shape, "first_layers": first, "last_layers": last, **dict(zip(inner, rest, strict=True))}
            if _not_a_plan_of_its_own(kw, asked):
                continue
            c = normalise(Candidate(dp=dp, **kw), keep_rank_order=pinned_order)
            if c in seen or asked("zero_impl") and c.zero_impl not in values["zero_impl"]:
                continue
            if asked("zero") and c.zero not in values["zero"]:  # ZeRO folded away (no data parallelism):
                continue  # not the sharding --fix/--space asked for

            seen.add(c)
            # what validity depends on (a rank order, checked when parsed, makes only a torchtitan plan invalid)
            key = (c.tp, c.sp, c.cp, c.ep, c.pp, c.vpp, c.dp, c.zero, c.mbs, c.overlap_param_gather,
                   c.tp_comm_overlap, c.async_tp, c.first_layers, c.last_layers, c.zero_impl, c.fp8_recipe,
                   c.recompute_method, c.recompute_num_layers,
                   # torchtitan's knobs (ParallelConfig._check_one_stack): the rank order and recompute count too
                   (c.rank_order, c.recompute) if c.async_tp or c.recompute == "selective_op" else None)
            if key not in check_cache:
                check_cache[key] = check_plan(c, facts, model_cfg, base_parallel)
            why = check_cache[key]
            if why is None:
                valid.append(c)
            else:
                reasons.setdefault(why, [0, c])[0] += 1
    rejections = sorted((Rejection(r, n, ex) for r, (n, ex) in reasons.items()), key=lambda r: (-r.count, r.reason))
    return valid, rejections


def _recompute_values(values: dict[str, list[Any]], knobs: Mapping[str, list[Any]]) -> None:
    """The recompute knobs' values to enumerate: a method or layer count asked for implies full
    recomputation, a layer count alone the block method; without a layer count every full plan
    checkpoints every layer (the driver adds the block plans, :func:`scenarios.search.driver.add_block_recompute`)."""
    if ("recompute_method" in knobs or "recompute_num_layers" in knobs) and "recompute" not in knobs:
        values["recompute"] = ["full"]
    if "recompute_num_layers" not in knobs:
        values["recompute_method"] = [""]
    elif "recompute_method" not in knobs:
        values["recompute_method"] = ["block"]


def recompute_wanted(c: Candidate, knobs: Mapping[str, list[Any]]) -> bool:
    """Whether ``c`` takes the recompute method and layer count ``--fix``/``--space`` name (block over 0
    layers is the plan without recomputation)."""
    methods, layers = knobs.get("recompute_method"), knobs.get("recompute_num_layers")
    if c.recompute == "none" and layers is not None and 0 in layers and "block" in (methods or ["block"]):
        return True
    return (methods is None or c.recompute_method in methods) and (
        layers is None or bool(c.recompute_method) and c.recompute_num_layers in layers)


def _folded_shape(shape: Mapping[str, Any], dp: int, values: Mapping[str, list[Any]], impl_asked: bool) -> bool:
    """A shape :func:`normalise` folds onto another one that the enumeration also visits (ZeRO without
    a data-parallel group, a parameter-gather overlap without the distributed optimizer), or one outside
    a ``zero_impl`` that ``--fix``/``--space`` name (``impl_asked``: DeepSpeed's is ZeRO-3 only): skipped
    before any candidate is built."""
    if dp * shape["cp"] == 1 and shape["zero"] and 0 in values["zero"] and not (shape["tp"] == 1 and shape["sp"]):
        return True
    if shape["zero_impl"] != "megatron" and shape["zero"] != 3 and ("megatron" in values["zero_impl"] or impl_asked):
        return True
    return bool(shape["overlap_param_gather"] and shape["zero"] != 1
                and False in values["overlap_param_gather"])


def check_knobs(facts: ModelFacts, knobs: Mapping[str, list[Any]]) -> None:
    """``--fix``/``--space`` values that no plan of this scenario can take, as ``run`` would refuse them.

    Raises:
        ValueError: one line naming the keys: EP on a dense model, an FP8 recipe on a scenario that does not
            train in FP8, a ``zero_impl`` of DeepSpeed without ZeRO stage 3, or async TP and TP overlap pinned
            together.
    """
    dtype = facts.training.get("dtype", "bf16")
    if facts.num_experts <= 1 and any(e > 1 for e in knobs.get("ep", ())):
        raise ValueError(f"parallel.expert_model_parallel_size={','.join(map(str, knobs['ep']))}: expert parallelism "
                         f"needs a mixture-of-experts model; this one is dense (allowed: 1)")
    if "fp8_recipe" in knobs and dtype != "fp8":
        raise ValueError(f"training.fp8_recipe applies to training.dtype = 'fp8' (this scenario: {dtype})")
    impls, stages = knobs.get("zero_impl", ()), knobs.get("zero", (3,))
    if impls and "megatron" not in impls and 3 not in stages:
        raise ValueError(f"parallel.zero_impl={','.join(impls)} is DeepSpeed's ZeRO stage 3: it needs "
                         f"parallel.zero_stage=3, got {','.join(map(str, stages))}")
    methods = knobs.get("recompute_method", ())
    if (methods or "recompute_num_layers" in knobs) and "full" not in knobs.get("recompute", ["full"]):
        raise ValueError("training.recompute_method / training.recompute_num_layers need "
                         "parallel.recompute_granularity=full (Megatron-LM's --recompute-method)")
    if "uniform" in methods and "recompute_num_layers" not in knobs:
        raise ValueError("training.recompute_method=uniform needs training.recompute_num_layers (--fix or --space): "
                         "its group size")
    if knobs.get("async_tp") == [True] and knobs.get("tp_comm_overlap") == [True]:
        raise ValueError("parallel.async_tp=true (torchtitan) conflicts with parallel.tp_comm_overlap=true "
                         "(Megatron-Core); choose one")


def _not_a_plan_of_its_own(kw: Mapping[str, Any], asked) -> bool:
    """A knob of an axis the plan does not use (SP without TP, interleaving without PP, TP overlap
    without SP, both TP overlaps at once, torchtitan's knobs beside another stack's): not a plan of its own
    unless asked for with ``--space``."""
    if not asked("sp") and kw["tp"] == 1 and kw["sp"] or not asked("vpp") and kw["pp"] == 1 and kw["vpp"] > 1:
        return True
    overlap = kw["tp_comm_overlap"] or kw["async_tp"]
    if overlap and not kw["sp"] and not (asked("tp_comm_overlap") or asked("async_tp")):
        return True
    titan, other = _mixed_stacks(kw)
    if titan and other and not all(asked(f) for f in (*titan, *other)):
        return True  # left for ParallelConfig's reason only where --fix/--space asks for both stacks' knobs
    return bool(kw["tp_comm_overlap"] and kw["async_tp"] and not (asked("tp_comm_overlap") and asked("async_tp")))


def _mixed_stacks(kw: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(torchtitan's knobs the plan uses: async TP, per-op SAC; the Megatron-LM or DeepSpeed knobs beside them:
    the distributed optimizer, DeepSpeed's ZeRO-3, TP comm overlap, another rank order, Megatron's selective
    recompute, TP without sequence parallelism): both non-empty is a plan no stack runs
    (``ParallelConfig._check_one_stack``)."""
    titan = [f for f, on in (("async_tp", kw["async_tp"]), ("recompute", kw["recompute"] == "selective_op"),
                             ("pp", kw["zero"] == 3 and kw["zero_impl"] != "deepspeed" and kw["pp"] > 1)) if on]
    if not titan:
        return [], []
    other = [f for f, on in (("zero", kw["zero"] in (1, 2)),
                             ("zero_impl", kw["zero"] == 3 and kw["zero_impl"] == "deepspeed"),
                             ("tp_comm_overlap", kw["tp_comm_overlap"]),
                             ("rank_order", kw["rank_order"] != DEFAULT_RANK_ORDER),
                             ("recompute", kw["recompute"] == "selective"), ("sp", kw["tp"] > 1 and not kw["sp"]))
             if on]
    return titan, other


def check_plan(c: Candidate, facts: ModelFacts, model_cfg: Any, base_parallel: Mapping[str, Any] | None) -> str | None:
    """``None`` if the plan is valid, else the one-line reason (the parallel config's own words)."""
    if c.overlap_param_gather and (c.zero != 1 or not c.overlap_grad_reduce):
        return "overlap_param_gather needs the distributed optimizer (zero_stage 1) and overlap_grad_reduce"
    try:
        cfg = c.config(facts.global_batch_size, base_parallel)
        cfg.validate_model(model_cfg)
        if facts.training or facts.gpu is not None:  # what run checks beyond the parallel config
            from scenarios.runner import check_async_tp_compile, check_fp8_keys
            training = c.training_section(facts.training)
            if facts.gpu is not None:
                check_fp8_keys(training, cfg, facts.gpu)
            check_async_tp_compile(training, cfg)
    except ValueError as exc:
        return str(exc)
    return None


def families(cands: Iterable[Candidate]) -> int:
    """Distinct (TP, CP, EP, PP, VPP) shapes among ``cands``."""
    return len({(c.tp, c.cp, c.ep, c.pp, c.vpp) for c in cands})
