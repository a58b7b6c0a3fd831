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
- **FP8 scaling variants** (:attr:`~hwmodel.ir.Compute.fp8_scaling`): a row-wise scaled FP8 GEMM (the
  CUTLASS kernel PyTorch's ``_scaled_mm`` runs for per-row scales) takes ``fp8_gemm_time_factor.rowwise``
  times the per-tensor cuBLAS GEMM's compute time (fitted to FBGEMM PR #2764's H100 timings, see the
  calibration file); MXFP8 block-scaled GEMMs run at the FP8 rate (factor 1: Blackwell's tensor cores
  apply the block scales).
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
A causal sliding window (:attr:`~hwmodel.ir.Compute.attention_window`, with attention sinks) skips the
key blocks wholly outside it, at the kernel's block granularity (128: a partly masked block costs a
full one); ALiBi adds one FP32 multiply-add per computed score on the CUDA cores
(:mod:`hwmodel.attention_masks`).

**Measured overrides.** :class:`ProfileOverrides` reads a PyTorch profiler (Kineto) Chrome trace and
replaces the modelled duration of matching ops by the measured one (``KernelCostModel.with_profile``):
profile one GPU, simulate at scale.

All quantities are SI: seconds, bytes, FLOP, FLOP/s, bytes/s.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwmodel import calibration_overlay
from hwmodel.attention_masks import ALIBI_FLOPS_PER_SCORE, attended_keys, attention_key_blocks
from hwmodel.dtypes import ELEMENT_BYTES
from hwmodel.ir import Compute
from hwmodel.power import sustained_clock_fraction
from hwmodel.profile_overrides import ProfileOverrides

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
    fp8_gemm_time_factor: Mapping[str, float] = field(default_factory=dict)
    """FP8 scaling (:attr:`hwmodel.ir.Compute.fp8_scaling`) -> its GEMM's compute time over the
    per-tensor-scaled FP8 GEMM's (absent: 1)."""
    name: str = "default"
    """Which sections were merged, e.g. ``default+ampere``."""
    gemm_class_efficiency: Mapping[str, float] = field(default_factory=dict)
    """GEMM shape class (:func:`gemm_class`) -> efficiency replacing the dtype's; empty in the shipped
    calibration, set by a user's fitted profile (``trainsim calibrate``)."""
    hbm_efficiency_by_kind: Mapping[str, float] = field(default_factory=dict)
    """Memory-bound kind -> HBM efficiency replacing :attr:`hbm_efficiency` for that kind; empty in the
    shipped calibration, set by a user's fitted profile."""

    def gemm_eff(self, dtype: str, *shape_classes: str) -> float:
        """GEMM efficiency for ``dtype`` (falls back to the ``default`` key), or the fitted one of the
        first of ``shape_classes`` (finest first, :func:`gemm_classes`) a
        profile gives."""
        for shape_class in shape_classes:
            if shape_class and shape_class in self.gemm_class_efficiency:
                return float(self.gemm_class_efficiency[shape_class])
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


def gemm_class(task: Compute) -> str:
    """The shape class a profile may fit a GEMM efficiency to, and ``fwd`` or ``bwd``: ``matmul``, or for
    a convolution's implicit GEMM (``K = C_in x kh x kw``) ``conv1x1`` or ``conv3x3`` -- a ``K`` that is a
    multiple of 9 is taken for a filter of 9 taps or more, the shapes cuDNN runs with Winograd or FFT
    algorithms (fewer multiplies than the implicit GEMM), a 1x1 filter is a plain GEMM -- with ``s<stride>``
    for a strided one (:attr:`~hwmodel.ir.Compute.conv_stride`): Winograd and FFT need a unit stride
    (cuDNN API reference, ``cudnnConvolutionFwdAlgo_t``), so cuDNN runs ResNet's strided 3x3s with implicit
    GEMM where the unstrided ones get Winograd (``conv3x3_fwd``, ``conv3x3s2_bwd``, ``matmul_bwd``, ...)."""
    return f"{gemm_op(task)}_{'bwd' if _is_backward(task) else 'fwd'}"


def gemm_op(task: Compute) -> str:
    """:func:`gemm_class` without the pass: ``matmul``, ``conv1x1``, ``conv3x3``, ``conv3x3s2``, ..."""
    if "convolution" not in task.name:
        return "matmul"
    k = int(task.shape[3]) if len(task.shape) == 4 else 0
    op = "conv3x3" if k and k % 9 == 0 else "conv1x1"
    return op if task.conv_stride <= 1 else f"{op}s{task.conv_stride}"


def gemm_classes(task: Compute) -> tuple[str, ...]:
    """The classes a profile may fit a GEMM efficiency to, finest first:

    - ``<class>@m<b>n<c>k<d>``: the shape band of :func:`gemm_class`, each of the implicit GEMM's (m, n, k)
      rounded to a power of two; repeated layers of one shape share it;
    - ``<op>@m<b>n<c>k<d>``: the same shape band in either pass (``conv3x3@m13n8k11``): cuDNN runs a
      layer's forward and backward with the same algorithm family where it can (Winograd's saving in
      multiplies is the same in both), so one pass's rows speak for the other's;
    - ``<class>`` (:func:`gemm_class`);
    - ``<op>``: the class in either pass (:func:`gemm_op`), for a class whose own rows are too few.

    cuDNN and cuBLAS choose their algorithm by such features (kernel names in a trace are its families),
    so rows of one band ran alike. Only a profile sets these; a task takes the first one the profile
    fitted, then the dtype's efficiency. A task without a (batch, m, n, k) shape has its class and op only.
    """
    parent, op = gemm_class(task), gemm_op(task)
    if len(task.shape) != 4 or task.flops <= 0:
        return parent, op
    _, m, n, k = (max(int(x), 1) for x in task.shape)
    band = f"m{round(math.log2(m))}n{round(math.log2(n))}k{round(math.log2(k))}"
    return f"{parent}@{band}", f"{op}@{band}", parent, op


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
        """Read a calibration TOML file; ``None`` reads the shipped one, with the active user profile
        (:mod:`hwmodel.calibration_overlay`) merged in if there is one."""
        if path is None:
            return cls(calibration_overlay.overlaid(_shipped_data()), DEFAULT_CALIBRATION_PATH)
        p = Path(path)
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
                fp8_gemm_time_factor={str(k): float(v) for k, v in merged.get("fp8_gemm_time_factor", {}).items()},
                name="+".join(parts),
                gemm_class_efficiency={str(k): float(v)
                                       for k, v in merged.get("gemm_class_efficiency", {}).items()},
                hbm_efficiency_by_kind={str(k): float(v)
                                        for k, v in merged.get("hbm_efficiency_by_kind", {}).items()},
            )
        except KeyError as e:
            raise ValueError(f"calibration {self.path or ''}: missing key {e} for {'+'.join(parts)}") from e


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
        self.power_clock = sustained_clock_fraction(gpu)
        """SM clock at the GPU's configured power limit / at its rated power (1 unless a what-if lowers the
        limit: :func:`hwmodel.power.sustained_clock_fraction`); scales tensor-core and FP32 throughput of
        training and microbenchmark pricing alike."""
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
        return float(self.gpu.peak_flops(dtype)) * clock * self.power_clock * self.speed_scale

    def _hbm_time(self, nbytes: float, kind: str = "") -> float:
        eff = self.cal.hbm_efficiency_by_kind.get(kind, self.cal.hbm_efficiency) if kind else self.cal.hbm_efficiency
        return nbytes / (self.gpu.hbm_bandwidth_Bps * eff)

    def _gemm(self, task: Compute) -> KernelCost:
        dtype = normalise_dtype(task.dtype)
        classes = gemm_classes(task) if self.cal.gemm_class_efficiency else ()
        eff = self.cal.gemm_eff(dtype, *classes)
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
        if task.fp8_scaling:  # a scaled-GEMM variant slower than cuBLAS' per-tensor FP8 GEMM (calibration)
            t_compute *= self.cal.fp8_gemm_time_factor.get(task.fp8_scaling, 1.0)
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
        n_q = math.ceil(sq / blk)
        window, sinks = task.attention_window, task.attention_sinks
        # key-block iterations summed over the query blocks of one (batch, head)
        iters = attention_key_blocks(sq, skv, blk, causal=causal, window=window, sinks=sinks)
        ctas = b * h * n_q
        block_flops = 4.0 * blk * blk * d * (ATTENTION_BWD_FLOP_FACTOR if backward else 1.0)
        per_sm = peak * eff / self.sm_count
        cta_time_total = b * h * (iters + n_q * overhead) * block_flops / per_sm  # summed over CTAs
        if task.attention_alibi:  # the bias FMA per computed score, on the CUDA cores of the CTA's SM
            vector_per_sm = float(self.gpu.fp32_flops) * self.power_clock * self.cal.vector_efficiency / self.sm_count
            cta_time_total += b * h * iters * blk * blk * ALIBI_FLOPS_PER_SCORE / vector_per_sm
        waves = math.ceil(ctas / self.sm_count)
        t_compute = waves * cta_time_total / ctas
        dbytes = DTYPE_BYTES.get(dtype, 2)
        # Q, K, V, O (+ dO, dQ, dK, dV backward), all in the math dtype
        nbytes = task.bytes_accessed or b * h * d * dbytes * (2 * sq + 2 * skv) * (2 if backward else 1)
        t_mem = self._hbm_time(nbytes)
        t = max(t_compute, t_mem) + launch
        return KernelCost(t, min(ctas, self.sm_count), float(nbytes),
                          {"ctas": ctas, "waves": waves, "efficiency": eff, "causal": float(causal),
                           "executed_flops": self._useful_attention_flops(task, backward),
                           "compute_s": t_compute, "memory_s": t_mem},
                          ctas=ctas)

    @staticmethod
    def _useful_attention_flops(task: Compute, backward: bool) -> float:
        """:func:`attention_flops` of the task's shape; with a window, the full count scaled by the
        scored fraction :func:`~hwmodel.attention_masks.attended_keys` / (seq_q x seq_kv)."""
        b, h, sq, skv, d = (int(x) for x in task.shape)
        if not task.attention_window:
            return attention_flops(b, h, sq, skv, d, backward=backward, causal=task.causal)
        keys = attended_keys(sq, skv, causal=task.causal, window=task.attention_window,
                             sinks=task.attention_sinks)
        return attention_flops(b, h, sq, skv, d, backward=backward) * keys / (sq * skv)

    def _memory_bound(self, task: Compute) -> KernelCost:
        nbytes = float(task.bytes_accessed)
        t_mem = self._hbm_time(nbytes, task.kind)
        vector_flops = float(self.gpu.fp32_flops) * self.power_clock * self.cal.vector_efficiency
        t_vec = task.flops / vector_flops if task.flops else 0.0
        if task.launches != 1:  # several equal kernels in a row: one kernel's SMs, every kernel's launch
            if task.launches < 1:
                raise ValueError(f"kernel {task.name!r}: launches must be >= 1, got {task.launches}")
            sms = min(self.sm_count, max(1, math.ceil(nbytes / task.launches / self.cal.memory_bytes_per_sm)))
            return KernelCost(max(t_mem, t_vec) + task.launches * self.cal.launch_overhead_s, sms, nbytes,
                              {"memory_s": t_mem, "vector_s": t_vec})
        sms = min(self.sm_count, max(1, math.ceil(nbytes / self.cal.memory_bytes_per_sm)))
        return KernelCost(max(t_mem, t_vec) + self.cal.launch_overhead_s, sms, nbytes,
                          {"memory_s": t_mem, "vector_s": t_vec})


_DEFAULT_CAL: tuple[object, Calibration] | Calibration | None = None
"""(active profile, calibration built for it); a plain :class:`Calibration` installed here by a caller
(``scenarios.validation.provenance.clock_fraction``) is used as is."""
_SHIPPED: dict[str, Any] | None = None


def _shipped_data() -> dict[str, Any]:
    global _SHIPPED
    if _SHIPPED is None:
        with DEFAULT_CALIBRATION_PATH.open("rb") as f:
            _SHIPPED = tomllib.load(f)
    return _SHIPPED


def _default_calibration() -> Calibration:
    """The shipped calibration with the active profile, rebuilt when the active profile changes."""
    global _DEFAULT_CAL
    if isinstance(_DEFAULT_CAL, Calibration):
        return _DEFAULT_CAL
    token = calibration_overlay.active()
    if _DEFAULT_CAL is None or _DEFAULT_CAL[0] is not token:
        _DEFAULT_CAL = (token, Calibration.load())
    return _DEFAULT_CAL[1]
