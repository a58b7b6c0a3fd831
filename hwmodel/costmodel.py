"""The kernel cost model: how long one kernel runs alone on a GPU, and what it demands when sharing.

Hardware-parametric, so what-if studies work for any :class:`~hwmodel.specs.GPUSpec` (more SMs, more
FLOP/s, more HBM bandwidth), with efficiencies calibrated against measurements
(``hwmodel/data/calibration.toml``, fitted to ``tests/data/kernels.csv``):

- **GEMM** (``kind="gemm"``, shape ``(batch, m, n, k)``): the output is cut into tiles
  (128x128, 128x256 or 256x128, whichever finishes first, as cuBLAS' heuristics pick a tile per shape);
  ``tiles = batch * ceil(m/tm) * ceil(n/tn)``; one tile runs on one SM, so the kernel runs in
  ``waves = ceil(tiles / sm_count)`` waves, each taking one tile's time at the calibrated efficiency::

      t_tile  = 2 * tm * tn * k / (peak_flops(dtype) * eff_gemm / sm_count)        # s
      t_gemm  = max(waves * t_tile, bytes / (hbm_bandwidth * eff_hbm)) + launch    # s

  Partial tiles cost a full tile (tile quantisation); a partly filled last wave costs a full wave
  (wave quantisation; both as in NVIDIA's *Matrix Multiplication Background User's Guide*,
  DU-09799-001, §2.3 "Typical Tile Dimensions In cuBLAS And Performance" and §3 "Dimension
  Quantization Effects"). Under-filled GEMMs
  (tiles <= sm_count/2) may split K across SMs (split-K). ``sms_used = min(tiles x split-K pieces,
  sm_count)``, and the kernel's grid is ``ctas = tiles x split-K pieces`` thread blocks: when a
  communication kernel holds SMs, the GPU re-quantises the waves over the SMs left
  (:func:`hwmodel.gpu.wave_rate_bound`).
- **Attention** (``kind="attention"``, shape ``(batch, heads, seq_q, seq_kv, head_dim)``): FlashAttention-2
  style, one CTA per (batch, head, 128-row query block), each looping over 128-column key blocks. A CTA
  costs ``(iterations + c)`` block times, where ``c`` (fitted, per head dim) is the per-CTA prologue and
  epilogue (load Q, rescale, write O) -- this is what makes short sequences slow. At long sequences the
  rate tends to ``peak * eff_fwd`` or ``peak * eff_bwd``. The backward pass does 2.5x the forward FLOPs.
  The efficiencies are per kernel (:attr:`~hwmodel.ir.Compute.attention_kernel`: FlashAttention-2 or -3,
  cuDNN, PyTorch's memory-efficient kernel) and architecture, by head dim; an unnamed kernel is the
  framework's default flash kernel for the generation (calibration ``[default.attention]``).
- **Memory-bound kinds** (elementwise, norm, softmax, embedding, loss, optimizer, copy, reduction, other):
  ``max(bytes / (hbm_bandwidth * eff_hbm), flops / (fp32_flops * eff_vector)) + launch``;
  they spread over every SM unless tiny (one SM per 4 KiB moved, at least one).
- Every kernel pays a **launch overhead** (a few microseconds; see the calibration file for why this number
  is uncertain).

**Causal attention, FLOP conventions.** FLOP registries (``torch.utils.flop_counter``, Megatron's formula)
count the full ``seq_q x seq_kv`` score matrix, causal or not: ``4*b*h*sq*skv*d`` forward, 2.5x that
backward. FlashAttention-2 skips the masked blocks and its published causal TFLOP/s (kernels.csv) divide
*half* those FLOPs by the time. This model prices the work a kernel actually executes, from its shape:
all key blocks, or for causal kernels (:attr:`hwmodel.ir.Compute.causal`, which ``workload.trace``
sets from the attention op's ``is_causal``) only the blocks on and below the diagonal (about half). A
shaped attention task's ``flops`` do not enter its price (``workload.trace`` hands over the executed
count, the full count halved for causal); only a shapeless one is priced by its ``flops``.

**Measured overrides.** :class:`ProfileOverrides` reads a PyTorch profiler (Kineto) Chrome trace and
replaces the modelled duration of matching ops by the measured one (``KernelCostModel.with_profile``):
profile one GPU, simulate at scale.

All quantities are SI: seconds, bytes, FLOP, FLOP/s, bytes/s.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwmodel.dtypes import ELEMENT_BYTES
from hwmodel.ir import Compute

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CALIBRATION_PATH = Path(__file__).with_name("data") / "calibration.toml"
"""The calibration shipped with trainsim."""

DTYPE_BYTES = ELEMENT_BYTES
"""Bytes per element of each math dtype (:data:`hwmodel.dtypes.ELEMENT_BYTES`; tf32 is stored as fp32)."""

MEMORY_BOUND_KINDS = frozenset(
    {"elementwise", "norm", "softmax", "embedding", "loss", "optimizer", "copy", "reduction", "other"})
"""Kernel kinds priced by the bytes they move (plus a vector-FLOP floor)."""

ATTENTION_BWD_FLOP_FACTOR = 2.5
"""Backward/forward FLOP ratio of flash attention (5 matmuls backward vs 2 forward; FA2 paper §4.1)."""


def normalise_dtype(dtype: str) -> str:
    """``"fp8 e4m3"`` -> ``"fp8"``, ``"BF16"`` -> ``"bf16"``, ``"float32"`` -> ``"fp32"``."""
    d = dtype.strip().lower().split()[0] if dtype.strip() else "bf16"
    aliases = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
               "bfloat16": "bf16", "e4m3": "fp8", "e5m2": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
    return aliases.get(d, d)


def _is_backward(task: Compute) -> bool:
    n = task.name.lower()
    return task.phase == "bwd" or "bwd" in n or "backward" in n


def attention_flops(batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, *,
                    backward: bool = False, causal: bool = False) -> float:
    """FLOPs of one flash-attention pass.

    Full count (``causal=False``): ``4*b*h*sq*skv*d`` forward (QK^T and PV), 2.5x that backward.
    With ``causal=True`` the FlashAttention-2 convention of kernels.csv: half the full count.
    """
    f = 4.0 * batch * heads * seq_q * seq_kv * head_dim
    if backward:
        f *= ATTENTION_BWD_FLOP_FACTOR
    return f / 2 if causal else f


# --------------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArchCalibration:
    """Efficiencies for one GPU (merged: defaults < architecture < GPU name). Fractions of peak."""

    gemm_efficiency: Mapping[str, float]
    """dtype -> achieved/peak tensor FLOP/s of a full wave of large tiles."""
    gemm_tiles: tuple[tuple[int, int], ...]
    """Candidate output tiles (rows, cols)."""
    attention_fwd_efficiency: Mapping[int, float]
    """head_dim -> long-sequence flash-attention forward FLOP/s / peak."""
    attention_bwd_efficiency: Mapping[int, float]
    """head_dim -> long-sequence flash-attention backward FLOP/s / peak."""
    attention_cta_overhead_blocks: Mapping[int, float]
    """head_dim -> fixed cost of one attention CTA, in key-block iterations."""
    attention_block: int
    """Query and key block size (rows) of the attention kernel."""
    hbm_efficiency: float
    """Achievable / datasheet HBM bandwidth for streaming kernels."""
    vector_efficiency: float
    """Achievable / peak non-tensor (CUDA-core) FP32 FLOP/s for memory-bound kinds' arithmetic."""
    launch_overhead_s: float
    """Added to every kernel's solo time (s)."""
    memory_bytes_per_sm: float
    """A memory-bound kernel occupies one SM per this many bytes moved (up to all SMs)."""
    attention_kernels: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Attention kernel (:attr:`hwmodel.ir.Compute.attention_kernel`) -> its tables
    (``fwd_efficiency``, ``bwd_efficiency``, ``cta_overhead_blocks``; missing ones are the default
    flash kernel's) and ``architectures``, where it runs (absent: everywhere)."""
    architecture: str = ""
    """The GPU's architecture (lower case), ``""`` if unknown."""
    sustained_clock_fraction: float = 1.0
    """Tensor-core throughput under sustained training load / in a short benchmark: whole-node
    training holds the GPUs at their power limit, below the boost clock the microbenchmarks of
    kernels.csv run at. Applied to GEMM and attention rates when the model is built for training."""
    name: str = "default"
    """Which sections were merged, e.g. ``default+ampere``."""

    def gemm_eff(self, dtype: str) -> float:
        """GEMM efficiency for ``dtype`` (falls back to the ``default`` key)."""
        e = self.gemm_efficiency
        return float(e.get(dtype, e.get("default", 0.8)))

    def attention_params(self, head_dim: int, kernel: str = "") -> tuple[float, float, float]:
        """(fwd efficiency, bwd efficiency, CTA overhead) of attention ``kernel`` (``""``: the default
        flash kernel) at ``head_dim``, linearly interpolated between calibrated head dims and clamped
        outside them.

        Raises:
            ValueError: an unknown kernel, or one that does not run on this architecture.
        """
        tables = {"fwd_efficiency": self.attention_fwd_efficiency, "bwd_efficiency": self.attention_bwd_efficiency,
                  "cta_overhead_blocks": self.attention_cta_overhead_blocks}
        if kernel:
            own = self.attention_kernels.get(kernel)
            if own is None:
                raise ValueError(f"attention kernel {kernel!r}: no calibration; known: "
                                 f"{', '.join(sorted(self.attention_kernels))}")
            archs = own.get("architectures")
            if archs is not None and self.architecture not in archs:
                raise ValueError(f"attention_backend {kernel!r} runs on {', '.join(archs)} GPUs only, "
                                 f"not {self.architecture or 'this GPU'}")
            tables = {k: {int(d): float(e) for d, e in own[k].items()} if k in own else v
                      for k, v in tables.items()}
        return (_interp(tables["fwd_efficiency"], head_dim), _interp(tables["bwd_efficiency"], head_dim),
                _interp(tables["cta_overhead_blocks"], head_dim))


def _interp(table: Mapping[int, float], x: float) -> float:
    keys = sorted(table)
    if x <= keys[0]:
        return float(table[keys[0]])
    if x >= keys[-1]:
        return float(table[keys[-1]])
    for lo, hi in zip(keys, keys[1:], strict=False):
        if lo <= x <= hi:
            w = (x - lo) / (hi - lo)
            return float(table[lo]) * (1 - w) + float(table[hi]) * w
    raise AssertionError("unreachable")


def _merge(base: dict, over: Mapping) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


_CC_TO_ARCH = {"7.0": "volta", "7.5": "turing", "8.0": "ampere", "8.6": "ampere", "8.9": "ada",
               "9.0": "hopper", "10.0": "blackwell"}


class Calibration:
    """Calibrated efficiencies, read from a TOML file (default ``hwmodel/data/calibration.toml``).

    The file has a ``[default]`` section, ``[architecture.<name>]`` sections and optional
    ``[gpu."<name>"]`` sections; :meth:`for_gpu` merges them in that order. Keys other than the fields
    of :class:`ArchCalibration` (``source``, ``sources``, ``fitted``) are documentation.

    Raises:
        ValueError: the file lacks a ``[default]`` section or a required key.
    """

    def __init__(self, data: Mapping[str, Any], path: str | Path | None = None) -> None:
        if "default" not in data:
            raise ValueError(f"calibration {path or ''}: no [default] section")
        self.data = data
        """The parsed TOML."""
        self.path = path
        """Where it came from, if a file."""

    @classmethod
    def load(cls, path: str | Path | None = None) -> Calibration:
        """Read a calibration TOML file; ``None`` reads the shipped one."""
        p = Path(path) if path is not None else DEFAULT_CALIBRATION_PATH
        with p.open("rb") as f:
            return cls(tomllib.load(f), p)

    @staticmethod
    def architecture_of(gpu: Any) -> str:
        """Lower-case architecture name of a GPU spec (``architecture`` field, else from the compute
        capability), ``""`` if unknown."""
        arch = str(getattr(gpu, "architecture", "") or "").strip().lower()
        if arch:
            return arch
        cc = getattr(gpu, "compute_capability", None)
        if cc is None:
            return ""
        if isinstance(cc, tuple | list):
            cc = ".".join(str(x) for x in cc)
        return _CC_TO_ARCH.get(str(cc), "")

    def for_gpu(self, gpu: Any) -> ArchCalibration:
        """The merged calibration for ``gpu`` (a GPUSpec): default, then its architecture, then its name.

        Unknown architectures and names get the ``[default]`` values.
        """
        merged = dict(self.data["default"])
        parts = ["default"]
        arch = self.architecture_of(gpu)
        archs = {k.lower(): v for k, v in self.data.get("architecture", {}).items()}
        if arch in archs:
            merged = _merge(merged, archs[arch])
            parts.append(arch)
        gpus = self.data.get("gpu", {})
        name = str(getattr(gpu, "name", ""))
        if name in gpus:
            merged = _merge(merged, gpus[name])
            parts.append(name)
        try:
            att = merged["attention"]
            return ArchCalibration(
                gemm_efficiency={normalise_dtype(k): float(v) for k, v in merged["gemm_efficiency"].items()
                                 if not isinstance(v, str)},
                gemm_tiles=tuple((int(a), int(b)) for a, b in merged["gemm_tiles"]),
                attention_fwd_efficiency={int(k): float(v) for k, v in att["fwd_efficiency"].items()},
                attention_bwd_efficiency={int(k): float(v) for k, v in att["bwd_efficiency"].items()},
                attention_cta_overhead_blocks={int(k): float(v)
                                               for k, v in att["cta_overhead_blocks"].items()},
                attention_block=int(att["block"]),
                attention_kernels={str(k): dict(v) for k, v in att.get("kernels", {}).items()},
                architecture=arch,
                hbm_efficiency=float(merged["hbm_efficiency"]),
                vector_efficiency=float(merged["vector_efficiency"]),
                launch_overhead_s=float(merged["launch_overhead_s"]),
                memory_bytes_per_sm=float(merged["memory_bytes_per_sm"]),
                sustained_clock_fraction=float(merged.get("sustained_clock_fraction", 1.0)),
                name="+".join(parts),
            )
        except KeyError as e:
            raise ValueError(f"calibration {self.path or ''}: missing key {e} for {'+'.join(parts)}") from e


# --------------------------------------------------------------------------------------------------
# Measured overrides (PyTorch profiler / Kineto Chrome trace)
# --------------------------------------------------------------------------------------------------

def normalise_op_name(name: str) -> str:
    """``aten::mm`` and ``aten.mm.default`` -> ``aten.mm``; other names unchanged (stripped)."""
    n = name.strip().replace("::", ".")
    parts = n.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        n = ".".join(parts[:2])
    return n


def _prod(xs: Any) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def gemm_shape_from_dims(op: str, dims: list) -> tuple[int, ...] | None:
    """The IR GEMM shape ``(batch, m, n, k)`` from a profiler's ``Input Dims`` for matmul-like aten ops,
    ``None`` if ``op`` is not one or the dims do not fit."""
    try:
        d = [list(x) for x in dims]
        if op == "aten.mm":
            (m, k), (_, n) = d[0], d[1]
            return (1, m, n, k)
        if op == "aten.addmm":
            (m, k), (_, n) = d[1], d[2]
            return (1, m, n, k)
        if op in ("aten.bmm", "aten.baddbmm"):
            a, b = (d[0], d[1]) if op == "aten.bmm" else (d[1], d[2])
            return (a[0], a[1], b[2], a[2])
        if op == "aten.linear":
            x, w = d[0], d[1]
            return (1, _prod(x[:-1]), w[0], x[-1])
        if op == "aten.matmul" and len(d[0]) >= 2 and len(d[1]) == 2:
            x, w = d[0], d[1]
            return (1, _prod(x[:-1]), w[1], x[-1])
    except (IndexError, TypeError, ValueError):
        return None
    return None


class ProfileOverrides:
    """Measured kernel durations from a PyTorch profiler (Kineto) Chrome-trace JSON.

    Reads ``traceEvents``: events with ``cat == "kernel"`` are GPU kernels (``dur`` in microseconds).
    Each is attributed to the aten op that launched it through ``args["External id"]`` (matched to a
    ``cat == "cpu_op"`` event with the same ``External id``) or, failing that, through
    ``args["correlation"]`` and the ``cuda_runtime`` launch event carrying the same correlation id.
    When an op instance launches several kernels their durations are summed. Repeated instances of the
    same (op, shape) are reduced to their median.

    Keys: ``(op, shape)`` where ``op`` is normalised (``aten::mm`` -> ``aten.mm``) and ``shape`` is the
    IR GEMM shape ``(batch, m, n, k)`` for matmul ops, else the flattened ``Input Dims``; and ``(op,
    None)`` for the op over all shapes. Kernels with no op are keyed by their own kernel name.

    :meth:`lookup` matches a task by (name, shape) exactly; a task with no shape, or an op recorded
    without shapes, matches by name alone. A shaped task whose shape was not profiled is *not* matched
    (durations depend on shape too much to borrow another shape's).
    """

    def __init__(self, durations: Mapping[tuple[str, tuple | None], float]) -> None:
        self.durations: dict[tuple[str, tuple | None], float] = dict(durations)
        """(op, shape or None) -> measured duration in seconds."""
        self._shaped_ops = {op for op, shape in self.durations if shape is not None}

    @classmethod
    def from_chrome_trace(cls, path: str | Path) -> ProfileOverrides:
        """Parse a Kineto Chrome-trace JSON file (``torch.profiler`` ``export_chrome_trace``)."""
        with Path(path).open(encoding="utf-8") as f:
            data = json.load(f)
        events = data["traceEvents"] if isinstance(data, Mapping) else data
        ops: dict[Any, tuple[str, tuple | None]] = {}
        corr_to_ext: dict[Any, Any] = {}
        kernels: list[dict] = []
        for ev in events:
            cat = str(ev.get("cat", "")).lower()
            args = ev.get("args") or {}
            if cat == "cpu_op":
                ext = args.get("External id")
                if ext is not None:
                    op = normalise_op_name(str(ev.get("name", "")))
                    dims = args.get("Input Dims")
                    shape = None
                    if dims:
                        shape = gemm_shape_from_dims(op, dims)
                        if shape is None:
                            shape = tuple(int(x) for dim in dims if isinstance(dim, list) for x in dim
                                          if isinstance(x, int))
                    ops[ext] = (op, shape)
            elif cat in ("cuda_runtime", "cuda_driver"):
                if args.get("correlation") is not None and args.get("External id") is not None:
                    corr_to_ext[args["correlation"]] = args["External id"]
            elif cat == "kernel":
                kernels.append(ev)
        # sum kernel time per op instance (External id), then median per key
        per_instance: dict[Any, float] = defaultdict(float)
        instance_key: dict[Any, tuple[str, tuple | None]] = {}
        for ev in kernels:
            args = ev.get("args") or {}
            ext = args.get("External id")
            if ext not in ops:
                ext = corr_to_ext.get(args.get("correlation"))
            dur_s = float(ev.get("dur", 0.0)) * 1e-6
            if ext in ops:
                inst = ("op", ext)
                instance_key[inst] = ops[ext]
            else:  # unattributed kernel: key by its own name, each launch an instance
                inst = ("kernel", id(ev))
                instance_key[inst] = (str(ev.get("name", "")), None)
            per_instance[inst] += dur_s
        samples: dict[tuple[str, tuple | None], list[float]] = defaultdict(list)
        for inst, dur in per_instance.items():
            op, shape = instance_key[inst]
            samples[(op, shape)].append(dur)
            if shape is not None:
                samples[(op, None)].append(dur)
        return cls({k: statistics.median(v) for k, v in samples.items()})

    def lookup(self, task: Compute) -> float | None:
        """Measured duration (s) for ``task``, or ``None`` if the profile has no match."""
        op = normalise_op_name(task.name)
        if task.shape and op in self._shaped_ops:
            return self.durations.get((op, tuple(task.shape)))
        return self.durations.get((op, None))

    def __len__(self) -> int:
        return len(self.durations)


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelCost:
    """What a kernel costs alone, and what it demands when sharing the GPU."""

    solo_time_s: float
    """Duration when alone on the GPU, launch overhead included (s)."""
    sms_used: int
    """SMs it occupies (its weight on the GPU's SM pool)."""
    hbm_bytes: float
    """Bytes it moves through HBM (its HBM demand is ``hbm_bytes / solo_time_s`` bytes/s)."""
    detail: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)
    """Intermediate figures for reports (waves, tiles, efficiency, ...)."""
    ctas: int = 0
    """Thread blocks (CTAs) the kernel launches, each holding one SM until it is done, so it runs in
    ``ceil(ctas / sm_count)`` waves: output tiles x split-K pieces for GEMM, (batch, head, query block)
    for attention. 0 where the grid is not modelled (memory-bound kinds, fixed-time and shapeless
    kernels): no wave quantisation is applied to them (see :func:`hwmodel.gpu.wave_rate_bound`)."""


class KernelCostModel:
    """Prices :class:`~hwmodel.ir.Compute` kernels on one GPU (see the module docstring for the model).

    Args:
        gpu: the GPU's spec (``sm_count``, ``peak_flops(dtype)``, ``fp32_flops``, ``hbm_bandwidth_Bps``,
            ``architecture``, ``name``).
        calibration: efficiencies; the shipped ``hwmodel/data/calibration.toml`` if ``None``.
        overrides: measured durations that replace the model for matching ops.
        speed_scale: tensor-core throughput multiplier on top of the clock, in (0, 1]: a run's
            straggler factor (1 / :func:`hwmodel.variation.straggler_slowdown`).

    Raises:
        ValueError: ``speed_scale`` outside (0, 1].
    """

    def __init__(self, gpu: Any, calibration: Calibration | None = None,
                 overrides: ProfileOverrides | None = None, *, sustained: bool = False,
                 speed_scale: float = 1.0) -> None:
        if not 0 < speed_scale <= 1:
            raise ValueError(f"speed_scale must be in (0, 1], got {speed_scale!r}")
        self.gpu = gpu
        self.speed_scale = speed_scale
        """Tensor-core throughput multiplier (the slowest synchronised GPU's share, 1: none)."""
        self.sustained = sustained
        """Price tensor-core work at the sustained (power-limited) clock, as in a training run, rather
        than the microbenchmark clock (see :attr:`ArchCalibration.sustained_clock_fraction`)."""
        self.calibration = calibration or _default_calibration()
        self.cal: ArchCalibration = self.calibration.for_gpu(gpu)
        """The merged efficiencies for this GPU."""
        self.overrides = overrides
        self.sm_count = int(gpu.sm_count)
        self._cache: dict[Compute, KernelCost] = {}

    @property
    def hbm_efficiency(self) -> float:
        """Achievable / datasheet HBM bandwidth on this GPU."""
        return self.cal.hbm_efficiency

    @property
    def launch_overhead_s(self) -> float:
        """Per-kernel launch overhead (s)."""
        return self.cal.launch_overhead_s

    def with_profile(self, path: str | Path) -> KernelCostModel:
        """A copy of this model whose durations are overridden by a Kineto Chrome trace at ``path``."""
        return KernelCostModel(self.gpu, self.calibration, ProfileOverrides.from_chrome_trace(path),
                               sustained=self.sustained, speed_scale=self.speed_scale)

    # -- public ---------------------------------------------------------------------------------
    def cost(self, task: Compute) -> KernelCost:
        """Solo time, SMs used and HBM bytes of ``task`` on this GPU.

        Results are cached per task (tasks are frozen and hashable).

        Raises:
            ValueError: unknown kernel kind or a malformed shape.
        """
        cached = self._cache.get(task)
        if cached is None:
            cached = self._cache[task] = self._cost(task)
        return cached

    def _cost(self, task: Compute) -> KernelCost:
        if task.fixed_time_s is not None:
            if task.fixed_time_s < 0:
                raise ValueError(f"kernel {task.name!r}: fixed_time_s must be >= 0, got {task.fixed_time_s}")
            # A given duration: the kernel (or macro task) uses the whole GPU while it runs.
            return KernelCost(task.fixed_time_s, self.gpu.sm_count, task.bytes_accessed, {"fixed": 1.0})
        if task.kind == "gemm":
            c = self._gemm(task)
        elif task.kind == "attention":
            c = self._attention(task)
        elif task.kind in MEMORY_BOUND_KINDS:
            c = self._memory_bound(task)
        else:
            raise ValueError(f"kernel {task.name!r}: unknown kind {task.kind!r}")
        if self.overrides is not None:
            measured = self.overrides.lookup(task)
            if measured is not None:
                return KernelCost(measured, c.sms_used, c.hbm_bytes, {**c.detail, "measured": 1.0}, c.ctas)
        return c

    def achieved_flops(self, task: Compute) -> float:
        """``task.flops / solo_time_s`` (FLOP/s), for comparison with published TFLOP/s."""
        return task.flops / self.cost(task).solo_time_s

    # -- pieces -----------------------------------------------------------------------------------
    def _peak(self, dtype: str) -> float:
        clock = self.cal.sustained_clock_fraction if self.sustained else 1.0
        return float(self.gpu.peak_flops(dtype)) * clock * self.speed_scale

    def _hbm_time(self, nbytes: float) -> float:
        return nbytes / (self.gpu.hbm_bandwidth_Bps * self.cal.hbm_efficiency)

    def _gemm(self, task: Compute) -> KernelCost:
        dtype = normalise_dtype(task.dtype)
        eff = self.cal.gemm_eff(dtype)
        peak = self._peak(dtype)
        launch = self.cal.launch_overhead_s
        if not task.shape:  # no shape: plain FLOPs at the calibrated efficiency, whole GPU
            t = max(task.flops / (peak * eff), self._hbm_time(task.bytes_accessed))
            return KernelCost(t + launch, self.sm_count, task.bytes_accessed, {"efficiency": eff})
        if len(task.shape) != 4:
            raise ValueError(f"gemm {task.name!r}: shape must be (batch, m, n, k), got {task.shape}")
        b, m, n, k = (int(x) for x in task.shape)
        nbytes = task.bytes_accessed or b * (m * k + k * n + m * n) * DTYPE_BYTES.get(dtype, 2)
        per_sm = peak * eff / self.sm_count  # FLOP/s of one SM at calibrated efficiency
        best: tuple[float, int, int, int, int] | None = None  # (time, tiles, waves, split, tile index)
        for i, (tm, tn) in enumerate(self.cal.gemm_tiles):
            tiles = b * math.ceil(m / tm) * math.ceil(n / tn)
            splits = [1]
            if tiles <= self.sm_count // 2:  # split-K only when clearly under-filled
                splits = [s for s in range(1, self.sm_count // tiles + 1) if s == 1 or k / s >= 256]
            for s in splits:
                pieces = tiles * s
                waves = math.ceil(pieces / self.sm_count)
                t = waves * 2.0 * tm * tn * math.ceil(k / s) / per_sm
                if best is None or t < best[0] * (1 - 1e-9):
                    best = (t, tiles, waves, s, i)
        assert best is not None
        t_compute, tiles, waves, split, i = best
        if split > 1:  # partial sums written and read back in fp32
            nbytes += 2 * 4 * b * m * n * split
        t_mem = self._hbm_time(nbytes)
        t = max(t_compute, t_mem) + launch
        tm, tn = self.cal.gemm_tiles[i]
        return KernelCost(t, min(tiles * split, self.sm_count), float(nbytes),
                          {"tiles": tiles, "waves": waves, "split_k": split, "tile_m": tm, "tile_n": tn,
                           "efficiency": eff, "compute_s": t_compute, "memory_s": t_mem},
                          ctas=tiles * split)

    def _attention(self, task: Compute) -> KernelCost:
        dtype = normalise_dtype(task.dtype)
        peak = self._peak(dtype)
        launch = self.cal.launch_overhead_s
        backward = _is_backward(task)
        causal = task.causal
        kernel = task.attention_kernel
        if not task.shape:
            eff_f, eff_b, _ = self.cal.attention_params(128, kernel)
            eff = eff_b if backward else eff_f
            t = max(task.flops / (peak * eff), self._hbm_time(task.bytes_accessed))
            return KernelCost(t + launch, self.sm_count, task.bytes_accessed, {"efficiency": eff})
        if len(task.shape) != 5:
            raise ValueError(
                f"attention {task.name!r}: shape must be (batch, heads, seq_q, seq_kv, head_dim), "
                f"got {task.shape}")
        b, h, sq, skv, d = (int(x) for x in task.shape)
        eff_f, eff_b, overhead = self.cal.attention_params(d, kernel)
        eff = eff_b if backward else eff_f
        blk = self.cal.attention_block
        n_q, n_kv = math.ceil(sq / blk), math.ceil(skv / blk)
        # key-block iterations summed over the query blocks of one (batch, head)
        if causal:  # bottom-right aligned mask: query block i sees n_kv - n_q + i + 1 key blocks
            iters = sum(max(min(n_kv, n_kv - n_q + i + 1), 1) for i in range(n_q))
        else:
            iters = n_q * n_kv
        ctas = b * h * n_q
        block_flops = 4.0 * blk * blk * d * (ATTENTION_BWD_FLOP_FACTOR if backward else 1.0)
        per_sm = peak * eff / self.sm_count
        cta_time_total = b * h * (iters + n_q * overhead) * block_flops / per_sm  # summed over CTAs
        waves = math.ceil(ctas / self.sm_count)
        t_compute = waves * cta_time_total / ctas
        dbytes = DTYPE_BYTES.get(dtype, 2)
        # Q, K, V, O (+ dO, dQ, dK, dV backward), all in the math dtype
        nbytes = task.bytes_accessed or b * h * d * dbytes * (2 * sq + 2 * skv) * (2 if backward else 1)
        t_mem = self._hbm_time(nbytes)
        t = max(t_compute, t_mem) + launch
        return KernelCost(t, min(ctas, self.sm_count), float(nbytes),
                          {"ctas": ctas, "waves": waves, "efficiency": eff, "causal": float(causal),
                           "executed_flops": attention_flops(b, h, sq, skv, d, backward=backward,
                                                             causal=causal),
                           "compute_s": t_compute, "memory_s": t_mem},
                          ctas=ctas)

    def _memory_bound(self, task: Compute) -> KernelCost:
        nbytes = float(task.bytes_accessed)
        t_mem = self._hbm_time(nbytes)
        t_vec = task.flops / (float(self.gpu.fp32_flops) * self.cal.vector_efficiency) if task.flops else 0.0
        sms = min(self.sm_count, max(1, math.ceil(nbytes / self.cal.memory_bytes_per_sm)))
        return KernelCost(max(t_mem, t_vec) + self.cal.launch_overhead_s, sms, nbytes,
                          {"memory_s": t_mem, "vector_s": t_vec})


_DEFAULT_CAL: Calibration | None = None


def _default_calibration() -> Calibration:
    global _DEFAULT_CAL
    if _DEFAULT_CAL is None:
        _DEFAULT_CAL = Calibration.load()
    return _DEFAULT_CAL
