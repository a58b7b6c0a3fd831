"""The dtype table: the math dtypes kernels run in, and the training dtypes a scenario may name.

Every other dtype table derives from this one (the scenario schema's allowed values, the tracer's
torch dtypes, the builder's element and gradient-reduction sizes, the cost model's element sizes,
the peak MFU is taken against), so adding a dtype is one row here.

Sources: element sizes are the IEEE 754 / OCP formats (fp8: both E4M3 and E5M2 are one byte; tf32 is
a tensor-core math mode on fp32 storage, NVIDIA A100 whitepaper). The gradient-reduction sizes follow
Megatron-LM: it forces ``accumulate_allreduce_grads_in_fp32`` for bf16 runs and keeps fp16 runs'
gradients in fp16 (the flag's default). fp8 training is bf16 mixed precision with Transformer Engine's
FP8 Linear GEMMs (``workload.fp8``), which need FP8 tensor cores (Hopper and later).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class MathDtype:
    """A dtype tensors are stored or kernels compute in."""

    name: str
    """Short name used by the IR: ``fp32``, ``bf16``, ..."""
    element_bytes: int
    """Bytes per element (B)."""
    torch_names: tuple[str, ...]
    """``torch.<name>`` dtypes stored in it (``()`` for tf32, a math mode on fp32 storage)."""


MATH_DTYPES: MappingProxyType[str, MathDtype] = MappingProxyType({m.name: m for m in (
    MathDtype("fp64", 8, ("float64",)),
    MathDtype("fp32", 4, ("float32",)),
    MathDtype("tf32", 4, ()),
    MathDtype("bf16", 2, ("bfloat16",)),
    MathDtype("fp16", 2, ("float16",)),
    MathDtype("fp8", 1, ("float8_e4m3fn", "float8_e5m2")),
)})
"""Math dtypes by name."""

ELEMENT_BYTES: MappingProxyType[str, int] = MappingProxyType({n: m.element_bytes for n, m in MATH_DTYPES.items()})
"""Bytes per element of each math dtype (B)."""


@dataclass(frozen=True, slots=True)
class TrainingDtype:
    """A ``[training] dtype``: what the model is traced in and how the run is measured and reduced."""

    name: str
    """The scenario's spelling: ``bf16``, ``fp16``, ``fp32`` or ``fp8``."""
    traced_as: str
    """Math dtype of the parameters and activations as traced (a key of :data:`MATH_DTYPES`); fp8
    training traces the bf16 model and then runs its Linear GEMMs in FP8."""
    mfu_peak_key: str
    """Tensor-core peak (a ``GPUSpec.tensor_flops`` key) MFU is taken against: its own, ``tf32`` for
    fp32, ``bf16`` for fp8 (so that bf16 and fp8 runs of one model stay comparable)."""
    report_peak_key: str
    """Peak the report and its MFU use (``GPUSpec.peak_flops`` key): ``fp32`` (CUDA cores) for fp32,
    whose GEMMs run at that rate (PyTorch's default ``allow_tf32 = False``), else ``mfu_peak_key``."""
    grad_reduce_bytes: int
    """Bytes per gradient element in the data-parallel reduction (B), as Megatron-LM."""
    needs_fp8_tensor_cores: bool
    """Whether the GPU must have FP8 tensor cores (``"fp8" in GPUSpec.tensor_flops``)."""

    @property
    def element_bytes(self) -> int:
        """Bytes per parameter/activation element as traced (B)."""
        return MATH_DTYPES[self.traced_as].element_bytes

    @property
    def torch_name(self) -> str:
        """The ``torch.<name>`` dtype the model is traced in, e.g. ``"bfloat16"``."""
        return MATH_DTYPES[self.traced_as].torch_names[0]


TRAINING_DTYPES: MappingProxyType[str, TrainingDtype] = MappingProxyType({d.name: d for d in (
    TrainingDtype("bf16", "bf16", "bf16", "bf16", 4, False),
    TrainingDtype("fp16", "fp16", "fp16", "fp16", 2, False),
    TrainingDtype("fp32", "fp32", "tf32", "fp32", 4, False),
    TrainingDtype("fp8", "bf16", "bf16", "bf16", 4, True),
)})
"""Training dtypes by name, in the order error messages list them."""


def training_dtype(name: str, field: str = "dtype") -> TrainingDtype:
    """The :class:`TrainingDtype` called ``name``.

    Raises:
        ValueError: one line naming ``field`` and the allowed values, e.g.
            ``dtype: unknown 'int8'; allowed: bf16, fp16, fp32, fp8``.
    """
    if not isinstance(name, str) or name not in TRAINING_DTYPES:
        raise ValueError(f"{field}: unknown {name!r}; allowed: {', '.join(TRAINING_DTYPES)}")
    return TRAINING_DTYPES[name]


def check_gpu_has(name: str, gpu: Any) -> None:
    """Whether ``gpu`` (a :class:`hwmodel.specs.GPUSpec`) has the tensor cores a ``[training] dtype`` runs
    its GEMMs on: bf16 and fp16 their own (a V100 has no bf16), fp8 FP8 ones (Hopper and later) and the
    bf16 ones of its other layers; fp32 runs on the CUDA cores every GPU has. A GPU has a tensor dtype
    when its ``tensor_flops`` lists it and its architecture has it (some shipped GPU of that architecture
    lists it): a what-if H100 described as ``architecture = "Ampere"`` has no FP8, as no A100 has. An
    input error, so the runner checks it before any memory verdict.

    Raises:
        ValueError: one line naming the field, the GPUs that have the tensor cores and the dtypes ``gpu``
            can train in.
    """
    from hwmodel.specs import get_gpu, known_gpus

    dt = training_dtype(name, "[training] dtype")
    needed = ["fp8"] * dt.needs_fp8_tensor_cores + [dt.report_peak_key]
    for key in needed:
        if not _has(gpu, key):
            have = ", ".join(n for n in known_gpus() if _has(get_gpu(n), key))
            can = [d for d, t in TRAINING_DTYPES.items() if _has(gpu, t.report_peak_key)
                   and not (t.needs_fp8_tensor_cores and not _has(gpu, "fp8"))]
            arch = ("" if key not in gpu.supported_dtypes else
                    f" as architecture {gpu.architecture!r} (no shipped {gpu.architecture} GPU lists {key})")
            raise ValueError(f"[training] dtype {name!r} needs {key.upper()} tensor cores ({have}); {gpu.name}"
                             f"{arch} has none; allowed on it: {', '.join(can)}")


def _has(gpu: Any, key: str) -> bool:
    """Whether ``gpu`` has tensor dtype ``key`` (``fp32``: CUDA cores, always): its ``tensor_flops`` lists
    it and so does some shipped GPU of its architecture (an architecture no shipped GPU has: the table
    alone)."""
    if key not in gpu.supported_dtypes:
        return False
    arch = _architecture_dtypes(gpu.architecture)
    return key == "fp32" or arch is None or key in arch


@cache
def _architecture_dtypes(architecture: str) -> frozenset[str] | None:
    """The tensor dtypes the shipped GPUs of ``architecture`` list (``None``: no shipped GPU has it)."""
    from hwmodel.specs import get_gpu, shipped_gpus

    same = [get_gpu(n) for n in shipped_gpus() if get_gpu(n).architecture == architecture]
    return frozenset(d for g in same for d in g.supported_dtypes) if same else None
