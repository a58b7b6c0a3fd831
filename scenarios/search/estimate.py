"""The screen's verdict on one plan (:class:`Estimate`), apart from how the screen computes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scenarios.search.flags import framework
from scenarios.search.space import Candidate
from workload.memory import MemoryBreakdown


@dataclass(frozen=True)
class Estimate:
    """The screen's verdict on one plan (seconds, bytes; ``nan`` times for a plan that does not fit)."""

    candidate: Candidate
    iteration_time_s: float
    compute_s: float
    bubble_s: float
    exposed_comm_s: float
    memory_bytes: float
    """The memory verdict's need (device use: reserved + CUDA context + NCCL buffers); JSON ``verdict_need_bytes``."""
    hbm_bytes: float
    """What it is compared with (the usable HBM); JSON ``verdict_capacity_bytes``."""
    oom_reason: str = ""
    """Empty when the plan fits; else one line: by how much, and the largest term."""
    tokens_per_s_per_gpu: float = math.nan
    mfu: float = math.nan
    memory: MemoryBreakdown | None = field(default=None, compare=False, repr=False)
    priced: str = "analytic"
    """How the time was found: ``analytic`` (the screen), ``step1`` (its layer passes timed by the
    hierarchical engine's step 1) or ``sampled`` (simulated with a few layers and extrapolated):
    :mod:`scenarios.search.refine`."""

    @property
    def fits(self) -> bool:
        return not self.oom_reason

    @property
    def headroom_bytes(self) -> float:
        return self.hbm_bytes - self.memory_bytes

    def to_dict(self, global_batch_size: int | None = None, num_layers: int | None = None) -> dict[str, Any]:
        """The estimate as JSON; ``global_batch_size`` and ``num_layers``: the scenario's, for torchtitan's batch
        and stage-split flags."""
        c = self.candidate
        return {"plan": c.to_dict(), "flags": c.flags(global_batch_size, num_layers), "framework": framework(c),
                "label": c.short(),
                "screen_iteration_time_s": _num(self.iteration_time_s), "screen_compute_s": _num(self.compute_s),
                "screen_bubble_s": _num(self.bubble_s), "screen_exposed_comm_s": _num(self.exposed_comm_s),
                # run --json's names: the verdict's two figures and, where modelled, the allocator's peaks
                "verdict_need_bytes": self.memory_bytes, "verdict_capacity_bytes": self.hbm_bytes,
                "headroom_bytes": self.headroom_bytes,
                **({"peak_allocated_bytes": self.memory.allocated, "peak_reserved_bytes": self.memory.reserved}
                   if self.memory is not None else {}),
                "fits": self.fits, "oom_reason": self.oom_reason,
                "screen_tokens_per_s_per_gpu": _num(self.tokens_per_s_per_gpu), "screen_mfu": _num(self.mfu),
                "screen_priced": self.priced}


def _num(x: float) -> float | None:
    return None if x is None or math.isnan(x) else x


__all__ = ["Estimate"]
