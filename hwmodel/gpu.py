"""One GPU as contended resources: a pool of SMs and the HBM bandwidth.

A kernel is an :class:`~hwmodel.fluid.Activity` whose work is its *solo* duration in seconds (from
the kernel cost model), bounded at rate 1 (never faster than alone), with weight ``sms_used`` on the SM
pool and ``hbm_bytes / solo_time_s`` on HBM. Processor sharing follows: two compute-bound kernels that
each want every SM run at 1/2; a GEMM of many waves beside an NCCL kernel that holds 24 of 108 SMs runs
at 84/108. HBM's capacity is the *achievable* bandwidth (peak x calibrated efficiency), so two
memory-bound kernels also share it half and half.

NCCL kernels hold one SM per channel for their whole duration ("NCCL CTAs won't share an SM with
compute kernels", sjeaugey, NVIDIA/nccl#689): :meth:`GPU.hold_sms` lowers the pool's capacity.

**Wave quantisation under held SMs.** A kernel's grid of ``ctas`` thread blocks runs in waves of at
most one block per SM (:attr:`~hwmodel.costmodel.KernelCost.ctas`: output tiles x split-K pieces for
a GEMM). Alone it needs ``ceil(ctas / sm_count)`` waves; with only ``free`` SMs left by communication
kernels it needs ``ceil(ctas / free)``, so its speed is bounded by the ratio
(:func:`wave_rate_bound`) on top of its fair share of the pool. The bound is the kernel's rate bound
in the fluid engine and changes whenever SMs are held or released, so a kernel that loses or regains
SMs mid-run gets the piecewise time. A one-wave GEMM (132 CTAs on an H100's 132 SMs) beside a
24-channel ``ncclAllGather`` needs two waves on the 108 SMs left and takes twice its solo time --
the "nearly double" GEMM time (MFU ~80 % -> ~47 %) reported on NVIDIA's developer forum (thread
337991, "Compute-communication overlap causes severe GEMM performance degradation because of tail
effect"; project reference hardware_nccl.md §5(a)), where processor sharing alone predicts
132/108 = 1.22x. Kernels of thousands of CTAs lose only the fluid share (10,000 CTAs: 76 -> 93
waves, 0.817 vs 108/132 = 0.818). Wave model as in NVIDIA's *Matrix Multiplication Background
User's Guide* (DU-09799-001), §3.2 "Wave Quantization".
"""

from __future__ import annotations

import math

from hwmodel.costmodel import KernelCost, KernelCostModel
from hwmodel.fluid import Activity, FluidSystem, Resource
from hwmodel.ir import Compute
from hwmodel.specs import GPUSpec


def wave_rate_bound(ctas: int, sm_count: int, free_sms: int) -> float:
    """Speed limit of a kernel of ``ctas`` thread blocks (one SM each while it runs) when only
    ``free_sms`` of the GPU's ``sm_count`` SMs can take them, as a fraction of its solo speed:
    ``ceil(ctas / sm_count) / ceil(ctas / free_sms)`` (solo waves / waves now).

    1.0 when the grid is not modelled (``ctas <= 0``), when no SM is free (the kernel's share of the
    empty pool is already 0) or when the free SMs need no more waves than all of them.
    """
    if ctas <= 0 or free_sms <= 0 or free_sms >= sm_count:
        return 1.0
    return math.ceil(ctas / sm_count) / math.ceil(ctas / free_sms)


class GPU:
    """A GPU's SM pool and HBM on a :class:`FluidSystem`.

    Args:
        fs: the cluster's fluid system.
        name: node name in the topology, e.g. ``n0.gpu3``.
        spec: hardware figures.
        cost_model: prices kernels on this GPU; a default one is built from ``spec``.
    """

    def __init__(self, fs: FluidSystem, name: str, spec: GPUSpec,
                 cost_model: KernelCostModel | None = None) -> None:
        self.fs = fs
        self.name = name
        self.spec = spec
        self.cost_model = cost_model or KernelCostModel(spec)
        # no load timelines: only links' are read (reports, plots); a GPU's change with every kernel
        self.sm: Resource = fs.add_resource(f"{name}.sm", float(spec.sm_count), meta=("sm", name), record=False)
        """SMs available to kernels (capacity in SMs)."""
        self.hbm: Resource = fs.add_resource(
            f"{name}.hbm", spec.hbm_bandwidth_Bps * self.cost_model.hbm_efficiency, meta=("hbm", name),
            record=False)
        """Achievable HBM bandwidth in bytes/s."""
        self.held_sms = 0
        """SMs currently held by communication kernels."""
        self._gridded: dict[Activity, int] = {}  # running kernels with a modelled grid -> their CTAs
        self._ungrid_cb = self._ungrid

    def cost(self, task: Compute) -> KernelCost:
        """Solo cost of ``task`` on this GPU (see :class:`~hwmodel.costmodel.KernelCostModel`)."""
        return self.cost_model.cost(task)

    def free_sms(self) -> int:
        """SMs not held by communication kernels."""
        return max(self.spec.sm_count - self.held_sms, 0)

    def launch(self, task: Compute, cost: KernelCost | None = None) -> Activity:
        """Start a kernel now; ``yield activity.done`` waits for it.

        Its rate bound is 1 (solo speed), or the wave-quantised :func:`wave_rate_bound` while SMs are
        held (kept up to date by :meth:`hold_sms` / :meth:`release_sms`).
        """
        c = cost or self.cost(task)
        t = c.solo_time_s
        weights: dict[Resource, float] = {}
        if c.sms_used > 0:
            weights[self.sm] = float(c.sms_used)
        if c.hbm_bytes > 0 and t > 0:
            weights[self.hbm] = c.hbm_bytes / t
        ctas = c.ctas
        if ctas <= 0:
            return self.fs.start(t, weights, rate_bound=1.0, name=task.name)
        act = self.fs.start(t, weights, rate_bound=wave_rate_bound(ctas, self.spec.sm_count, self.free_sms()),
                            name=task.name)
        if act.end_time is None:
            self._gridded[act] = ctas
            act.done.callbacks.append(self._ungrid_cb)
        return act

    def _ungrid(self, ev) -> None:
        self._gridded.pop(ev.value, None)

    def hold_sms(self, n: int) -> None:
        """A communication kernel occupies ``n`` SMs (one per NCCL channel) until released."""
        self.held_sms += n
        self.fs.set_capacity(self.sm, self.free_sms())
        self._requantise()

    def release_sms(self, n: int) -> None:
        """Give back SMs taken by :meth:`hold_sms`."""
        self.held_sms -= n
        if self.held_sms < 0:
            raise RuntimeError(f"{self.name}: released more SMs than held")
        self.fs.set_capacity(self.sm, self.free_sms())
        self._requantise()

    def _requantise(self) -> None:
        """Re-bound the running kernels with a modelled grid for the SMs now free."""
        if not self._gridded:
            return
        free = self.free_sms()
        sm_count = self.spec.sm_count
        for act, ctas in self._gridded.items():
            b = wave_rate_bound(ctas, sm_count, free)
            if b != act.rate_bound:
                self.fs.set_rate_bound(act, b)  # (no effect once it has ended)

    def __repr__(self) -> str:
        return f"GPU({self.name!r}, {self.spec.name})"
