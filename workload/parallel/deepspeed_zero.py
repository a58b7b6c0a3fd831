"""DeepSpeed ZeRO stage 3 as DeepSpeed runs it (``[parallel] zero_impl = "deepspeed"``).

The mechanisms and defaults are those of DeepSpeed v0.3.16 (April 2021, the release of the SC'21
ZeRO-3 measurements; ``deepspeed/runtime/zero/stage3.py``, ``partition_parameters.py``,
``constants.py``):

* *Per-module fetch.* A pre-forward / pre-backward hook on every module that owns parameters
  (``pre_sub_module_forward_function``) all-gathers the module's partitioned parameters over the whole
  data-parallel group (``fetch_sub_module``), then waits for every gather in flight and synchronises
  the device (``_synchronize_communication``: ``comm_stream.synchronize()``, ``torch.cuda.synchronize()``;
  ``_allgather_param`` also calls ``torch.cuda.synchronize()`` before each gather). So a module's
  kernels start only when its parameters are whole and the previous module's kernels are done.
* *Prefetch* (``prefetch_next_sub_modules``, ``get_params_to_prefetch``): after the fetch, if nothing is
  in flight and fewer than ``stage3_max_live_parameters`` elements are gathered, the parameters of the
  next modules of the recorded trace that are not yet gathered, in trace order, until at least
  ``stage3_prefetch_bucket_size`` elements. A module larger than the bucket is prefetched alone: one
  module ahead, overlapping the current module's kernels only.
* *Persistence*: parameters of at most ``stage3_param_persistence_threshold`` elements stay whole on
  every GPU (never gathered, never released).
* *Release* (``release_sub_module``, ``_keep_for_later``): after the module's pass its parameters are
  freed unless the module is used again within ``stage3_max_reuse_distance`` elements of other
  modules' parameters (with full recomputation a layer's last modules stay gathered from the recompute
  into their backward).
* *Gradients* (``reduce_independent_p_g_buckets_and_remove_grads``): each gradient joins a bucket of at
  most ``reduce_bucket_size`` elements; a gradient that would overflow it first reduces the bucket, on
  the reduction stream (``overlap_comm``, on by default for stage 3), after the host waits for the
  previous bucket's reduction (``reduction_stream.synchronize()``), so the next kernels launch only
  then. With ``contiguous_gradients`` off (the stage-3 default in v0.3.16) the bucket is all-reduced in
  the parameters' dtype (``buffered_reduce_fallback`` -> ``allreduce_bucket``), else reduce-scattered.
  Every micro-batch's backward reduces its gradients (ZeRO 2/3 reduce per micro-step).

* *Gather buffers* (``_allgather_param``): each gather zero-fills its buffer (``torch.zeros``) and
  passes PyTorch 1.8 a list of ``world_size`` partition views, so ``ProcessGroupNCCL::allgather`` copies
  its flat output into each (one ``copy_`` per rank, enqueued by the host).
* *The host's per-rank loops* (:func:`gather_kernels`, :func:`host_per_rank_s`): after its
  ``torch.cuda.synchronize()``, ``_allgather_param`` loops over the ``world_size`` ranks in Python
  (``flat_tensor.narrow``, ``torch.distributed.get_rank(group=...)``), then PyTorch 1.8 issues the
  per-rank ``recordStream`` + ``copy_``; the device idles meanwhile (every gather, fetch or prefetch, is
  issued right after a device synchronisation, and the module's kernels are launched only after the
  hook). ``_post_step`` (``stage3.py``) all-gathers the persistent parameters after every optimizer step
  (backward's ``_partition_all_parameters`` partitioned them) through ``_allgather_params``, whose Python
  loop copies each parameter's ``world_size`` pieces out (:func:`persistent_gather_host_s`). Both grow
  with the data-parallel size at a fixed model while the per-GPU work shrinks with it at a fixed batch:
  SC'21 Table 2's falling ZeRO-3 throughput.

Not modelled: the Python hooks' own host time per module (``pre_sub_module_forward_function`` and the
rest: bookkeeping, ``print_rank_0`` f-strings evaluated even when not printed -- ``fetch_sub_module``
formats ``param.norm()`` for every parameter of every fetched module, a reduction kernel and a
device-to-host copy each), which does not grow with the data-parallel size; the ``contiguous_gradients``
reduce-scatter path (off by default in v0.3.16).
DeepSpeed's pipeline engine does not run stage 3, so ``pipeline_model_parallel_size`` must be 1
(:meth:`ParallelConfig._check_deepspeed`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from hwmodel.costmodel import DEFAULT_CALIBRATION_PATH
from hwmodel.dtypes import ELEMENT_BYTES
from hwmodel.ir import Collective, Compute

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from workload.parallel.builder import RankBuilder


@dataclass(frozen=True)
class Stage3Settings:
    """DeepSpeed's ``zero_optimization`` settings for stage 3, with v0.3.16's defaults
    (``deepspeed/runtime/zero/constants.py``; the current ``config.py`` keeps the same numbers)."""

    prefetch_bucket_size: int = 50_000_000
    """``stage3_prefetch_bucket_size``: elements prefetched at a time (5e7)."""
    max_live_parameters: int = 1_000_000_000
    """``stage3_max_live_parameters``: no prefetch while at least this many elements are gathered (1e9)."""
    max_reuse_distance: int = 1_000_000_000
    """``stage3_max_reuse_distance``: a module's parameters are kept if it is used again within this many
    elements of other parameters (1e9)."""
    param_persistence_threshold: int = 100_000
    """``stage3_param_persistence_threshold``: parameters of at most this many elements stay whole (1e5)."""
    reduce_bucket_size: int = 500_000_000
    """``reduce_bucket_size``: gradient elements per reduction (5e8)."""
    contiguous_gradients: bool = False
    """``contiguous_gradients`` (stage 3 default False in v0.3.16): reduce-scatter the bucket instead of
    the all-reduce fallback."""


DEFAULTS = Stage3Settings()


@dataclass(frozen=True)
class Use:
    """One module's forward or backward pass in the iteration, in execution order."""

    key: tuple
    """Which module: ``(unit, path)``, unit a layer index, ``"pre"`` or ``"post"``."""
    params: tuple[int, ...]
    """Elements of each of its parameters."""

    def gathered(self, s: Stage3Settings) -> int:
        """Elements all-gathered for it (its partitioned, i.e. non-persistent, parameters)."""
        return sum(n for n in self.params if n > s.param_persistence_threshold)

    @property
    def numel(self) -> int:
        return sum(self.params)


@dataclass
class Gather:
    """One all-gather the coordinator issues at step ``at``: the parameters of the modules ``keys``."""

    at: int
    keys: tuple
    numel: int
    prefetch: bool


@dataclass
class FetchPlan:
    """The all-gathers of an iteration (:func:`plan_fetches`): per step, the gathers issued at its hook."""

    gathers: list[Gather] = field(default_factory=list)
    by_step: dict[int, list[int]] = field(default_factory=dict)
    """Step -> indices into ``gathers`` issued there (the blocking fetch first, then the prefetch)."""
    synced: list[bool] = field(default_factory=list)
    """Per step: whether its hook waited for the gathers in flight and synchronised the device."""
    peak_live: int = 0
    """Most elements gathered at once (fetched, in flight or kept for reuse), at a hook after its prefetch."""
    live: list[int] = field(default_factory=list)
    """Per step: the elements gathered at its hook after its prefetch (the module's pass runs with them)."""
    after: list[int] = field(default_factory=list)
    """Per step: the elements still gathered once its module is released (until the next step's hook)."""

    def per_step_counts(self) -> list[int]:
        return [len(self.by_step.get(i, [])) for i in range(max(self.by_step, default=-1) + 1)]


def plan_fetches(uses: list[Use], s: Stage3Settings = DEFAULTS) -> FetchPlan:
    """Replay DeepSpeed v0.3.16's coordinator over ``uses`` (a complete trace, steady state).

    At step i: fetch module i's parameters if not gathered (blocking); if any were fetched or in flight,
    wait for every gather in flight and synchronise the device (:attr:`FetchPlan.synced`). Then, if
    nothing is in flight and fewer than ``max_live_parameters`` elements are gathered, prefetch the
    parameters of the following steps that are not gathered, until at least ``prefetch_bucket_size``
    elements. After the pass, release module i's unless it is used again within ``max_reuse_distance``
    elements. Persistent parameters are never gathered (a module with only those neither fetches nor
    synchronises).
    """
    plan = FetchPlan()
    live: dict[tuple, int] = {}  # gathered or in-flight modules -> elements
    inflight: set[tuple] = set()
    n = len(uses)

    def issue(at: int, keys: list, numel: int, prefetch: bool) -> None:
        plan.by_step.setdefault(at, []).append(len(plan.gathers))
        plan.gathers.append(Gather(at, tuple(keys), numel, prefetch))

    for i, use in enumerate(uses):
        need = use.gathered(s)
        synced = bool(need) and (use.key not in live or use.key in inflight)
        if need and use.key not in live:
            live[use.key] = need
            issue(i, [use.key], need, False)
        if synced:
            inflight.clear()
        plan.synced.append(synced)
        if not inflight and sum(live.values()) < s.max_live_parameters:
            keys: list = []
            total = 0
            for later in uses[i + 1:]:
                g = later.gathered(s)
                if g and later.key not in live and later.key not in keys:
                    keys.append(later.key)
                    live[later.key] = g
                    total += g
                    if total >= s.prefetch_bucket_size:
                        break
            if keys:
                inflight.update(keys)
                issue(i, keys, total, True)
        plan.live.append(sum(live.values()))
        plan.peak_live = max(plan.peak_live, plan.live[-1])
        if use.key in live and not _reused_soon(uses, i, n, s):
            del live[use.key]
        plan.after.append(sum(live.values()))
    return plan


def _reused_soon(uses: list[Use], i: int, n: int, s: Stage3Settings) -> bool:
    """Whether module i is used again within ``max_reuse_distance`` elements of other modules
    (``get_reuse_distance_in_numel``)."""
    between = 0
    for j in range(i + 1, n):
        if uses[j].key == uses[i].key:
            return between < s.max_reuse_distance
        between += uses[j].numel
        if between >= s.max_reuse_distance:
            return False
    return False


def gradient_buckets(numels: list[int], s: Stage3Settings = DEFAULTS) -> list[list[int]]:
    """Indices of ``numels`` (gradients in the order backward produces them) per reduction bucket: a
    gradient that would take the bucket past ``reduce_bucket_size`` elements first flushes it."""
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for k, n in enumerate(numels):
        if cur and total + n > s.reduce_bucket_size:
            out.append(cur)
            cur, total = [], 0
        cur.append(k)
        total += n
    if cur:
        out.append(cur)
    return out


def module_order(modules: tuple, items: list, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    """A block's parameter modules ``(name, element counts)`` in the order its ops ``items`` (one pass of
    the layer whose op paths start with ``prefix``, e.g. ``layers.3.``) first run them, registration order
    for those the ops do not name."""
    seen: list[str] = []
    for o in items:
        path = getattr(o, "layer", "")
        for name, _ in modules:
            if name and (path == prefix + name or path.startswith(prefix + name + ".")) and name not in seen:
                seen.append(name)
    rest = [name for name, _ in modules if name not in seen]
    params = dict(modules)
    return [(name, params[name]) for name in seen + rest]


def segment_starts(items: list, paths: list[str]) -> list[int]:
    """Index in ``items`` of the first op of each module path in ``paths`` (its op paths equal it or lie
    under it; 0 where none does, ``""`` for a module the ops do not name), never before the previous
    one's: where each module's pre-forward hook splits the pass."""
    out: list[int] = []
    prev = 0
    for full in paths:
        idx = next((j for j, o in enumerate(items) if full and (getattr(o, "layer", "") == full or
                    getattr(o, "layer", "").startswith(full + "."))), prev)
        prev = max(prev, idx)
        out.append(prev)
    return out



@cache
def host_per_rank_s() -> float:
    """``[deepspeed] host_per_rank_s`` of calibration.toml: host seconds per data-parallel rank of one
    ``_allgather_param`` call (:func:`gather_kernels`)."""
    with DEFAULT_CALIBRATION_PATH.open("rb") as f:
        return float(tomllib.load(f)["deepspeed"]["host_per_rank_s"])


def gather_kernels(gather: Gather, world: int, element_bytes: int, dtype: str,
                   label: str) -> tuple[Compute, Compute, Compute]:
    """The kernels around one ``_allgather_param`` call (see :meth:`DeepSpeedStage3._gather`), shared by the
    program builder and the search screen: the ``torch.zeros`` fill of the ``gather.numel`` gathered
    elements (one launch per module), the host's per-rank work on the compute stream (no bytes; ``world``
    x :func:`host_per_rank_s` per module, the device idle meanwhile), and PyTorch 1.8's copy of the flat
    output into the ``world`` partition views (read + write of the buffer, ``world`` launches per module).
    ``element_bytes``: bytes per gathered element.

    The host part is DeepSpeed v0.3.16's ``_allgather_param`` (``partition_parameters.py``) after its
    ``torch.cuda.synchronize()``: a Python loop over the ``world_size`` ranks (``flat_tensor.narrow`` and
    ``torch.distributed.get_rank(group=...)`` per rank), then PyTorch 1.8's ``ProcessGroupNCCL::allgather``
    (``recordStream`` and ``copy_`` per rank, issued one by one). The module's kernels are launched only
    after the hook returns, and the all-gather only after the Python loop, so both wait for it; the
    cost grows with the data-parallel size at a fixed model, which is what makes SC'21 Table 2's ZeRO-3
    throughput fall as GPUs are added at a fixed batch."""
    nbytes = float(gather.numel * element_bytes)
    n = len(gather.keys)
    fill = Compute(f"{label}_zero_fill", "copy", 0.0, nbytes, dtype=dtype, launches=n)
    host = Compute(f"{label}_host_issue", "copy", 0.0, 0.0, fixed_time_s=world * n * host_per_rank_s())
    copy_out = Compute(f"{label}_copy_out", "copy", 0.0, 2.0 * nbytes, dtype=dtype, launches=world * n)
    return fill, host, copy_out

def persistent_parameters(modules: tuple | list, layers: int, s: Stage3Settings = DEFAULTS) -> tuple[int, int]:
    """(parameters, elements) that stay whole on every GPU (at most ``param_persistence_threshold``
    elements each) in ``layers`` blocks of parameter modules ``modules`` (``(name, element counts)``)."""
    small = [n for _, params in modules for n in params if n <= s.param_persistence_threshold]
    return len(small) * layers, sum(small) * layers


def persistent_gather_host_s(count: int, world: int) -> float:
    """Host seconds of DeepSpeed v0.3.16's ``_post_step`` gather of the ``count`` persistent parameters
    (``stage3.py``: ``self.persistent_parameters[0].all_gather(self.persistent_parameters)``, blocking).
    Backward's ``_partition_all_parameters`` partitioned them, so after each optimizer step
    ``_allgather_params`` (``partition_parameters.py``) gathers their partitions in one flat all-gather,
    then copies each parameter's ``world`` pieces out in a Python loop (two ``narrow`` and a ``copy_`` per
    parameter and rank): ``count x world`` per-rank steps at :func:`host_per_rank_s` each."""
    return count * world * host_per_rank_s()


class DeepSpeedStage3:
    """The program structure of ZeRO-3 as DeepSpeed runs it, emitted through a
    :class:`workload.parallel.builder.RankBuilder` (its compute stream, ``fsdp_ag`` for parameter
    all-gathers, ``fsdp_rs`` for gradient reductions)."""

    def __init__(self, rb: RankBuilder, settings: Stage3Settings = DEFAULTS) -> None:
        self.rb = rb
        self.s = settings
        t = rb.t
        self.modules = t.block_modules or (("", (t.params_block,)),)
        self.eb = ELEMENT_BYTES.get(t.dtype, 2)
        uses: list[Use] = []
        for _ in range(rb.cfg.num_microbatches):
            uses += self._pass_uses("fwd") + self._pass_uses("bwd")
        self.uses = uses
        self.plan = plan_fetches(uses, settings)
        self.step = 0
        self.gather_task: dict[int, int] = {}
        self.last_gather: int | None = None
        self.bucket: list[int] = []
        self.bucket_numel = 0
        self.last_reduce: int | None = None
        self.host_wait: int | None = None
        """The reduction the host waited for at the last flush, which the next kernels wait for."""
        self.persistent = persistent_parameters(self.modules, t.num_layers, settings)

    # -- the iteration's module order --------------------------------------------------------------
    def _unit_uses(self, unit, phase: str) -> list[Use]:
        t = self.rb.t
        if unit == "pre":
            return [Use(("pre", ""), (t.params_pre,))] if t.params_pre > 0 else []
        if unit == "post":
            n = t.params_post + t.params_post_tied
            return [Use(("post", ""), (n,))] if n > 0 else []
        order = self._module_order(unit, phase)
        return [Use((unit, path), params) for path, params in order]

    def _module_order(self, layer: int, phase: str) -> list[tuple[str, tuple[int, ...]]]:
        return module_order(self.modules, self.rb.ops.get("block", phase, layer), f"layers.{layer}.")

    def _pass_uses(self, phase: str) -> list[Use]:
        layers = range(self.rb.t.num_layers)
        if phase == "fwd":
            out = self._unit_uses("pre", "fwd")
            for layer in layers:
                out += self._unit_uses(layer, "fwd")
            return out + self._unit_uses("post", "fwd")
        out = self._unit_uses("post", "bwd")
        for layer in reversed(layers):
            if self.rb.cfg.recompute_granularity == "full" and not self.rb.macro:
                out += self._unit_uses(layer, "fwd")
            out += self._unit_uses(layer, "bwd")
        return out + self._unit_uses("pre", "bwd")

    # -- emission -----------------------------------------------------------------------------------
    def _hook(self, deps: list) -> list:
        """Module ``self.step``'s pre-hook: its gathers, each launched after a device synchronisation
        (every kernel and reduction so far), then what its kernels wait for: when the hook synchronised,
        every gather issued before this step's prefetch and every reduction so far."""
        rb, i = self.rb, self.step
        wait: list = list(deps)
        synced = self.plan.synced[i]
        for g in self.plan.by_step.get(i, []):
            gather = self.plan.gathers[g]
            if gather.prefetch and synced:
                wait.append(self.last_gather)
                synced = False  # waited for already
            self.last_gather = self._gather(gather, (rb.last_compute, self.last_gather, self.last_reduce))
        if synced:
            wait.append(self.last_gather)
        if self.plan.synced[i]:
            wait.append(self.last_reduce)
        if self.host_wait is not None:
            wait.append(self.host_wait)
            self.host_wait = None
        self.step += 1
        return wait

    def _gather(self, gather: Gather, deps: tuple) -> int:
        """``_allgather_param`` for each module of ``gather`` (one weight above the persistence threshold
        each; the modules of one prefetch share each task below): the ``torch.zeros`` fill of the
        gathered buffer, the all-gather, and PyTorch 1.8's copy of the flat NCCL output into the
        ``world_size`` partition views of the list ``all_gather`` (``ProcessGroupNCCL::allgather``;
        DeepSpeed later switched to ``_all_gather_base``, warning that the list fallback "will result in
        suboptimal performance"). The host enqueues those copies one by one (``copy_`` per rank) inside
        the call. Every gather (fetch or prefetch) is issued from a hook right after a device
        synchronisation, before the module's kernels are launched, so the compute stream idles while the
        host runs its per-rank loops (``_host_issue``, :func:`gather_kernels`), and the all-gather starts
        after them. Returns the last gather task."""
        rb = self.rb
        group = rb.groups["dp"]
        label = f"{'ds_prefetch' if gather.prefetch else 'ds_fetch'}_{_label(gather.keys[0])}"
        fill_k, host_k, copy_k = gather_kernels(gather, len(group), self.eb, rb.t.dtype, label)
        fill = rb.add(fill_k, "fsdp_ag", deps)
        # the host's per-rank loop, after the device synchronisation: the compute stream idles, and the
        # all-gather is called only after the Python part of it (gather_kernels)
        host = rb.add(host_k, "compute", (fill,))
        done = rb.add(Collective("all_gather", gather.numel * self.eb, group, dtype=rb.t.dtype, name=label),
                      "fsdp_ag", (fill, host))
        return rb.add(copy_k, "fsdp_ag", (done,))

    def _emit_unit(self, unit, phase: str, deps: list, *, reduce: bool) -> None:
        """One unit's pass, split at the first op of each of its parameter modules (each waits for its
        hook); with ``reduce``, each module's gradients join the reduction buckets after its pass."""
        rb = self.rb
        uses = self._unit_uses(unit, phase)
        part = unit if isinstance(unit, str) else "block"
        items = rb.ops.get(part, phase, None if isinstance(unit, str) else unit)
        starts = self._segment_starts(unit, items, uses)
        for k, use in enumerate(uses):
            lo = starts[k] if k else 0
            hi = starts[k + 1] if k + 1 < len(uses) else len(items)
            deps = self._hook(deps)
            if not rb.emit(items[lo:hi], deps, blocks=part == "block") and deps:
                rb.last_compute = rb.add(Compute("ds_hook_wait", "elementwise", 0.0, 0.0, fixed_time_s=0.0),
                                         "compute", deps)
            deps = []
            if reduce:
                self._gradient_ready(use.numel if use.key[0] != "post" else rb.t.params_post)
        if not uses:
            rb.emit(items, deps, blocks=part == "block")

    def _segment_starts(self, unit, items: list, uses: list[Use]) -> list[int]:
        return segment_starts(items, [f"layers.{unit}.{u.key[1]}" if not isinstance(unit, str) else "" for u in uses])

    def _post_step_gather(self, deps: list) -> list:
        """The previous optimizer step's ``_post_step`` gather of the persistent parameters
        (:func:`persistent_gather_host_s`), at the start of the iteration (the steady state's end of the
        previous one): the host's copy loop on the compute stream around one all-gather of their
        partitions; the first module's kernels wait for both."""
        rb = self.rb
        count, numel = self.persistent
        group = rb.groups["dp"]
        if count == 0 or len(group) == 1:
            return deps
        done = rb.add(Collective("all_gather", numel * self.eb, group, dtype=rb.t.dtype, name="ds_persistent_gather"),
                      "fsdp_ag", tuple(deps))
        host = rb.add(Compute("ds_persistent_copy_out", "copy", 0.0, 0.0,
                              fixed_time_s=persistent_gather_host_s(count, len(group))), "compute", (done,))
        self.last_gather = done
        return [*deps, host]

    def forward(self, first_v: bool, last_v: bool, deps: list) -> int | None:
        rb = self.rb
        if self.step == 0:
            deps = self._post_step_gather(deps)
        if first_v:
            self._emit_unit("pre", "fwd", deps + rb.gathered("pre"), reduce=False)
            deps = []
        for layer in range(rb.t.num_layers):
            self._emit_unit(layer, "fwd", deps, reduce=False)
            deps = []
        if last_v:
            self._emit_unit("post", "fwd", deps, reduce=False)
        return rb.last_compute

    def backward(self, first_v: bool, last_v: bool, deps: list) -> None:
        rb = self.rb
        if last_v:
            self._emit_unit("post", "bwd", deps, reduce=True)
            deps = []
        for layer in reversed(range(rb.t.num_layers)):
            if rb.cfg.recompute_granularity != "none" and not rb.macro:
                if rb.cfg.recompute_granularity == "full":
                    self._emit_unit(layer, "fwd", deps, reduce=False)
                    deps = []
                else:
                    deps = rb.recompute(layer, deps)
            self._emit_unit(layer, "bwd", deps, reduce=True)
            deps = []
        if first_v:
            self._emit_unit("pre", "bwd", deps, reduce=True)
        self._flush()

    # -- gradients ----------------------------------------------------------------------------------
    def _gradient_ready(self, numel: int) -> None:
        if numel <= 0:
            return
        if self.bucket and self.bucket_numel + numel > self.s.reduce_bucket_size:
            self._flush()
        self.bucket.append(numel)
        self.bucket_numel += numel

    def _flush(self) -> None:
        """Reduce the bucket on the reduction stream after the kernels so far, once the host has waited
        for the previous bucket's reduction (so the next kernels wait for that one)."""
        rb = self.rb
        if not self.bucket or len(rb.groups["dp"]) == 1:
            self.bucket, self.bucket_numel = [], 0
            return
        op = "reduce_scatter" if self.s.contiguous_gradients else "all_reduce"
        self.host_wait = self.last_reduce  # reduction_stream.synchronize() before launching the next
        self.last_reduce = rb.add(Collective(op, self.bucket_numel * self.eb, rb.groups["dp"], dtype=rb.t.dtype,
                                             name="ds_grad_bucket"), "fsdp_rs", (rb.last_compute, self.last_reduce))
        self.bucket, self.bucket_numel = [], 0


def _label(key: tuple) -> str:
    unit, path = key
    return f"L{unit}.{path}" if isinstance(unit, int) else str(unit)
