"""One GPU as contended resources: a pool of SMs and the HBM bandwidth.

A kernel is an :class:`~hwmodel.fluid.Activity` whose work is its *solo* duration in seconds (from
the kernel cost model), bounded at rate 1 (never faster than alone), with weight ``sms_used`` on the SM
pool and ``hbm_bytes / solo_time_s`` on HBM. Processor sharing follows: two compute-bound kernels that
each want every SM run at 1/2; a GEMM beside an NCCL kernel that holds 24 of 108 SMs runs at 84/108.
HBM's capacity is the *achievable* bandwidth (peak x calibrated efficiency), so two memory-bound
kernels also share it half and half.

NCCL kernels hold one SM per channel for their whole duration ("NCCL CTAs won't share an SM with
compute kernels", sjeaugey, NVIDIA/nccl#689): :meth:`GPU.hold_sms` lowers the pool's capacity.
"""

from __future__ import annotations

from hwmodel.costmodel import KernelCost, KernelCostModel
from hwmodel.fluid import Activity, FluidSystem, Resource
from hwmodel.ir import Compute
from hwmodel.specs import GPUSpec


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
        self.sm: Resource = fs.add_resource(f"{name}.sm", float(spec.sm_count), meta=("sm", name))
        """SMs available to kernels (capacity in SMs)."""
        self.hbm: Resource = fs.add_resource(
            f"{name}.hbm", spec.hbm_bandwidth_Bps * self.cost_model.hbm_efficiency, meta=("hbm", name))
        """Achievable HBM bandwidth in bytes/s."""
        self.held_sms = 0
        """SMs currently held by communication kernels."""

    def cost(self, task: Compute) -> KernelCost:
        """Solo cost of ``task`` on this GPU (see :class:`~hwmodel.costmodel.KernelCostModel`)."""
        return self.cost_model.cost(task)

    def launch(self, task: Compute, cost: KernelCost | None = None) -> Activity:
        """Start a kernel now; ``yield activity.done`` waits for it."""
        c = cost or self.cost(task)
        t = c.solo_time_s
        weights: dict[Resource, float] = {}
        if c.sms_used > 0:
            weights[self.sm] = float(c.sms_used)
        if c.hbm_bytes > 0 and t > 0:
            weights[self.hbm] = c.hbm_bytes / t
        return self.fs.start(t, weights, rate_bound=1.0, name=task.name)

    def hold_sms(self, n: int) -> None:
        """A communication kernel occupies ``n`` SMs (one per NCCL channel) until released."""
        self.held_sms += n
        self.fs.set_capacity(self.sm, max(self.spec.sm_count - self.held_sms, 0))

    def release_sms(self, n: int) -> None:
        """Give back SMs taken by :meth:`hold_sms`."""
        self.held_sms -= n
        if self.held_sms < 0:
            raise RuntimeError(f"{self.name}: released more SMs than held")
        self.fs.set_capacity(self.sm, max(self.spec.sm_count - self.held_sms, 0))

    def __repr__(self) -> str:
        return f"GPU({self.name!r}, {self.spec.name})"
