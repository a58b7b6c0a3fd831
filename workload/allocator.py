"""Memory a framework takes beyond the tensors it trains: the CUDA context, NCCL's buffers, cuBLAS's
workspace, and the PyTorch caching allocator's reserved-but-unallocated bytes; and the HBM a process
can use at all.

:func:`workload.memory.memory_per_gpu` counts the tensors (model states, activations, recompute
workspace): the peak PyTorch's ``torch.cuda.max_memory_allocated`` reports. :func:`with_framework`
adds, per GPU:

* **CUDA context** (:data:`CUDA_CONTEXT_BYTES`, per GPU generation): the driver's context with lazily
  loaded kernels (``CUDA_MODULE_LOADING=LAZY``, the default since CUDA 11.7) and the cuBLAS/cuDNN
  handles. "The first CUDA operation will create the CUDA context which uses around 400MB if CUDA >=
  11.7 is used and lazy module loading enabled" (PyTorch maintainer, pytorch/pytorch#109888, 2023;
  ~300 MB in #107667), plus handles and the kernels a training step loads: 512 MiB taken for every
  generation (no generation-specific measurement found; before CUDA 11.7, eager loading took > 1 GB).
  Outside the caching allocator: not in ``reserved``.
* **NCCL buffers** (:func:`nccl_buffer_bytes`): per communicator the GPU belongs to, one receive
  connection per ring channel, each with the three protocols' buffers: Simple ``NCCL_BUFFSIZE`` 4 MiB,
  LL ``8 lines x 512 threads x 8 steps x 16 B`` = 512 KiB, LL128 ``120 x 640 x 8 x 8 B`` = 4.6875 MiB
  (``DEFAULT_*BUFFSIZE`` in NCCL's ``src/init.cc``; NCCL docs, env ``NCCL_BUFFSIZE``). Ring channels:
  ``min(32, 2 x NVLinks)`` (NCCL's P2P channels to an NVLink peer are 2 per link, ``MAXCHANNELS`` 32;
  24 on DGX A100, as :mod:`hwmodel.nccl` finds); pipeline send/recv: two peers, two channels each.
  Tree, NVLS and CollNet buffers are not counted (NCCL >= 2.22 connects an algorithm only when it is
  first used, ``NCCL_RUNTIME_CONNECT``). Outside the caching allocator.
* **cuBLAS workspace** (:data:`CUBLAS_WORKSPACE_BYTES`): PyTorch's default ``CUBLAS_WORKSPACE_CONFIG``,
  ``:4096:8`` on Hopper and later (8 x 4 MiB = 32 MiB) and ``:4096:2:16:8`` before (2 x 4 MiB + 8 x 16
  KiB), per handle and stream (``aten/src/ATen/cuda/CublasHandlePool.cpp``, ``getChosenWorkspaceSize``);
  one stream computes. Allocated through the caching allocator: part of ``allocated``.
* **Fragmentation** (reserved - allocated): the caching allocator rounds requests to 512 B and carves
  large ones from 2 MiB (<= 1 MiB requests) / 20 MiB (<= 10 MiB) segments or a segment of their own
  rounded to 2 MiB, and never returns a segment to the driver during training; activations and
  their gradients are freed in another order than they were taken, so the blocks freed in backward
  are split and stranded. Model states are allocated once, at start, and pack. So the stranded bytes
  scale with the bytes of activation lifetime: ``fragmentation = ALLOCATOR_FRAGMENTATION x
  (activations + recompute workspace)``, the fraction fitted to published allocated/reserved pairs
  (``calibration.toml [memory]``, with its rows).

**Usable HBM** (:func:`usable_hbm_bytes`): datasheet HBM capacities are binary (an "80 GB" H100 has
five 16 GiB HBM3 stacks), and the driver keeps part of it: ``cudaGetDeviceProperties().totalGlobalMem``
is 85,045,477,376 B on an H100 SXM5 80 GB and 85,100,068,864 B on an A100 SXM4 80 GB (deviceQuery,
thamada/nvidia-smi ``nvsim/H100SXMx8_deviceQuery.py``, ``gls/A100SXMx4_deviceQuery.py``), i.e. 80 GiB
less 814 and 762 MiB. Other GPUs: the nominal capacity in GiB less :data:`DRIVER_RESERVE_FRACTION`
(the larger of those two, 0.99 %). The nominal capacity must be the ENABLED one: a B200 is built with
8 x 24 GiB = 192 GiB of HBM3e but enables ~180 (a deviceQuery-style output shows 182,631 MiB, project
hardware reference), and the rule on 180 gives 182,488 MiB, 0.08 % off that measurement, which it was
not fitted to (on 192 it gave 204.1 GB, more than the part has).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import cache
from typing import TYPE_CHECKING, Any

from hwmodel.costmodel import DEFAULT_CALIBRATION_PATH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from workload.memory import MemoryBreakdown

MIB = 1 << 20
GIB = 1 << 30

CUDA_CONTEXT_BYTES = {"Volta": 512 * MIB, "Ampere": 512 * MIB, "Hopper": 512 * MIB, "Blackwell": 512 * MIB}
"""CUDA context + cuBLAS/cuDNN handles per GPU generation, bytes (module docstring: ~400 MB context with
lazy loading, pytorch/pytorch#109888, plus handles; the same figure for every generation until one is
measured)."""

NCCL_SIMPLE_BUFFSIZE = 1 << 22
"""``NCCL_BUFFSIZE`` default, 4 MiB (``DEFAULT_BUFFSIZE``, NCCL ``src/init.cc``)."""
NCCL_LL_BUFFSIZE = 8 * 512 * 8 * 16
"""``NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x sizeof(ncclLLFifoLine)``, 512 KiB."""
NCCL_LL128_BUFFSIZE = 120 * 640 * 8 * 8
"""``NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8``, 4,915,200 B."""
NCCL_CONNECTION_BYTES = NCCL_SIMPLE_BUFFSIZE + NCCL_LL_BUFFSIZE + NCCL_LL128_BUFFSIZE
"""One connection's buffers, all three protocols (9.19 MiB)."""
NCCL_MAX_CHANNELS = 32
"""NCCL's ``MAXCHANNELS`` (collective channels of one communicator)."""
NCCL_P2P_PEERS, NCCL_P2P_CHANNELS_PER_PEER = 2, 2
"""Pipeline send/recv: the previous and the next stage, ``NCCL_NCHANNELS_PER_NET_PEER`` = 2 channels."""

CUBLAS_WORKSPACE_BYTES = {"Volta": 2 * 4 * MIB + 8 * 16 * 1024, "Ampere": 2 * 4 * MIB + 8 * 16 * 1024,
                          "Hopper": 8 * 4 * MIB, "Blackwell": 8 * 4 * MIB}
"""PyTorch's default cuBLAS workspace per handle and stream (``:4096:2:16:8`` before Hopper,
``:4096:8`` from Hopper on)."""

MEASURED_TOTAL_GLOBAL_MEM = {"H100-SXM5": (80, 85_045_477_376), "A100-SXM4-80GB": (80, 85_100_068_864)}
"""``(nominal GB, totalGlobalMem bytes)`` from deviceQuery (module docstring)."""
DRIVER_RESERVE_FRACTION = max(1 - mem / (gb * GIB) for gb, mem in MEASURED_TOTAL_GLOBAL_MEM.values())
"""Share of the nominal (binary) capacity the driver keeps where no deviceQuery is at hand: 0.99 %."""



@cache
def allocator_fragmentation() -> float:
    """``[memory] allocator_fragmentation`` of calibration.toml: reserved-but-unallocated bytes per byte
    of activations (module docstring)."""
    with DEFAULT_CALIBRATION_PATH.open("rb") as f:
        return float(tomllib.load(f)["memory"]["allocator_fragmentation"])


def usable_hbm_bytes(gpu: Any) -> float:
    """HBM a process can allocate on ``gpu`` (a :class:`hwmodel.specs.GPUSpec`), bytes: its nominal
    capacity read in GiB, less the share the driver keeps -- the measured share where
    :data:`MEASURED_TOTAL_GLOBAL_MEM` has the part (so its ``totalGlobalMem`` exactly, and an overridden
    capacity keeps the share), else :data:`DRIVER_RESERVE_FRACTION`."""
    nominal_gib = gpu.hbm_capacity_bytes / 1e9
    if gpu.name in MEASURED_TOTAL_GLOBAL_MEM:
        gb, total = MEASURED_TOTAL_GLOBAL_MEM[gpu.name]
        return float(total) if nominal_gib == gb else nominal_gib * total / gb
    return nominal_gib * GIB * (1 - DRIVER_RESERVE_FRACTION)


def ring_channels(gpu: Any) -> int:
    """Collective channels NCCL opens on ``gpu``'s NVLink: ``min(32, 2 x links)``, 1 without NVLink."""
    return max(1, min(NCCL_MAX_CHANNELS, 2 * int(getattr(gpu, "nvlink_links", 0))))


def communicators(parallel: Any) -> int:
    """Collective communicators a rank belongs to with more than one rank: TP, CP, EP and the data-parallel
    group (gradient reduction, ZeRO/FSDP gathers), each a ring of its own."""
    dp_group = parallel.dp * (parallel.cp if getattr(parallel, "cp", 1) > 1 else 1)
    sizes = (parallel.tp, getattr(parallel, "cp", 1), getattr(parallel, "ep", 1), dp_group)
    return sum(1 for n in sizes if n > 1)


def nccl_buffer_bytes(parallel: Any, gpu: Any) -> float:
    """NCCL's connection buffers on one GPU (module docstring), bytes: rings of :func:`communicators`
    at :func:`ring_channels` channels, plus the pipeline's send/recv peers."""
    rings = communicators(parallel) * ring_channels(gpu)
    p2p = NCCL_P2P_PEERS * NCCL_P2P_CHANNELS_PER_PEER if parallel.pp > 1 else 0
    return float((rings + p2p) * NCCL_CONNECTION_BYTES)


def with_framework(mem: MemoryBreakdown, parallel: Any, gpu: Any) -> MemoryBreakdown:
    """``mem`` with the framework's memory on ``gpu`` under ``parallel`` (a resolved
    :class:`workload.parallel.config.ParallelConfig`): CUDA context, NCCL buffers, cuBLAS workspace and
    the caching allocator's fragmentation (module docstring); the tensors' figures are unchanged.

    Raises:
        KeyError: ``gpu.architecture`` is not one of :data:`CUDA_CONTEXT_BYTES`'s generations.
    """
    arch = gpu.architecture
    return replace(mem, cuda_context=float(CUDA_CONTEXT_BYTES[arch]), nccl_buffers=nccl_buffer_bytes(parallel, gpu),
                   cublas_workspace=float(CUBLAS_WORKSPACE_BYTES[arch]),
                   fragmentation=allocator_fragmentation() * (mem.activations + mem.workspace),
                   usable_hbm=usable_hbm_bytes(gpu))


__all__ = ["CUBLAS_WORKSPACE_BYTES", "CUDA_CONTEXT_BYTES", "DRIVER_RESERVE_FRACTION", "MEASURED_TOTAL_GLOBAL_MEM",
           "NCCL_CONNECTION_BYTES", "allocator_fragmentation", "communicators", "nccl_buffer_bytes", "ring_channels",
           "usable_hbm_bytes", "with_framework"]
