"""A user's own ``torch.nn.Module``, simulated end to end.

The contract (a scenario's ``[model] factory = "package.module:fn"`` or ``"path/to/file.py:fn"``):

* ``fn(**factory_args)`` is called under ``torch.device("meta")`` (so modules it builds hold no memory)
  and returns either the module, or ``(module, example_inputs)`` -- the arguments of ``module(...)``
  for ONE micro-batch (a tensor, a tuple of positional arguments or a dict of keyword arguments),
  as ``torch.export.export(module, args)`` takes them. Their leading dimension must equal
  ``[training] micro_batch_size``. (A factory returning a zoo configuration is the older contract;
  :func:`scenarios.runner.build_model_config` handles it.)
* A bare module gets its input from ``[model] input_shape``, the shape of one sample (trainsim
  prepends ``micro_batch_size``) with ``input_dtype`` ``"float"`` (the training dtype, the default)
  or ``"int64"`` (token ids); else from the module's ``example_inputs(micro_batch_size)`` method,
  as zoo models have.
* The loss: if forward returns a tensor, trainsim adds ``output.sum()`` and its backward (a scalar
  output is the loss itself; a dict's ``"loss"`` or a tuple's first element are used). The optimizer
  is mixed-precision Adam, as for zoo models.

**Blocks.** The module's *blocks* are the units of pipeline stages, recomputation, FSDP and gradient
buckets: ``[model] blocks = "path"`` names a container; by default the ``nn.ModuleList`` /
``nn.Sequential`` of at least two identical blocks with the most parameters (a transformer's
``blocks``, traced once and cloned), else the module's own children in the order forward calls
them (its *top-level blocks*). What runs before the first block is the ``pre`` part, after the last
the ``post`` part (as embedding and head in the zoo).

**Strategies.** Data parallelism (DDP buckets, overlapped), ZeRO-1/2/3 and FSDP, full recomputation
(each block's forward re-run before its backward; pre and post are not recomputed) and, when the
blocks are identical, pipeline parallelism. Tensor, sequence, context and expert parallelism need the
zoo's Megatron layers and are rejected with a one-line error, as is selective recomputation.

**Memory** (:meth:`CustomModel.memory`): parameters, gradients and optimizer states by ZeRO stage,
with the zoo's byte counts (:mod:`workload.memory`); activations are the tensors autograd saves in the
traced forward (each storage once, parameters excluded); with full recomputation a block keeps only
its input, and one block's saved tensors are the recomputation workspace.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from hwmodel.dtypes import TRAINING_DTYPES
from workload.memory import MemoryBreakdown
from workload.parallel.builder import ELEM_BYTES, ModelTrace
from workload.parallel.config import ParallelConfig
from workload.parallel.schedules import interleaved_in_flight
from workload.trace import OpGraph, TraceError, _repeated_blocks, _submodule, trace_model
from workload.zoo.family import ModelFamily, state_bytes

INPUT_DTYPES = ("float", "int64")
"""``[model] input_dtype`` values: the training dtype, or int64 token ids."""
MODULE_KEYS = ("factory", "factory_args", "input_shape", "input_dtype", "blocks")
"""``[model]`` keys for a factory that returns an ``nn.Module``."""

_TORCH_DTYPES = {n: getattr(torch, d.torch_name) for n, d in TRAINING_DTYPES.items() if d.traced_as == n}
_NEEDS_MEGATRON = (
    ("tensor_model_parallel_size", "tp", "tensor parallelism splits the zoo's Megatron column/row-parallel layers"),
    ("context_parallel_size", "cp", "context parallelism needs the zoo's ring attention"),
    ("expert_model_parallel_size", "ep", "expert parallelism needs the zoo's MoE layers"),
)


def sum_loss(out: Any) -> torch.Tensor:
    """The loss trainsim adds to a custom module: a scalar output as is, else ``output.sum()``; a dict's
    ``"loss"``; a tuple's or list's first element.

    Raises:
        TraceError: no tensor in the output.
    """
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.sum()
    if isinstance(out, Mapping) and "loss" in out:
        return sum_loss(out["loss"])
    if isinstance(out, (tuple, list)) and out:
        return sum_loss(out[0])
    raise TraceError(f"forward returned a {type(out).__name__}; trainsim needs a tensor (it adds output.sum() "
                     f"as the loss), a dict with 'loss', or a tuple whose first element is a tensor")


def _loss_name(out: Any, name: str = "output") -> str:
    if isinstance(out, torch.Tensor):
        return name if out.dim() == 0 else f"{name}.sum()"
    if isinstance(out, Mapping) and "loss" in out:
        return _loss_name(out["loss"], f"{name}['loss']")
    if isinstance(out, (tuple, list)) and out:
        return _loss_name(out[0], f"{name}[0]")
    return ""


def find_blocks(module: nn.Module) -> str:
    """Module path of the ``nn.ModuleList``/``nn.Sequential`` of >= 2 identical blocks with the most
    parameters (ties: the shallowest, then the first), or ``""`` (the module's own children)."""
    best: tuple[int, int, int] | None = None
    path = ""
    for i, (name, mod) in enumerate(module.named_modules()):
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 2:
            continue
        if _repeated_blocks(module, name) is None:
            continue
        key = (sum(p.numel() for p in mod.parameters()), -name.count(".") - bool(name), -i)
        if best is None or key > best:
            best, path = key, name
    return path


def _containers(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if n and isinstance(m, (nn.ModuleList, nn.Sequential))]


@dataclass
class CustomModel:
    """A user's module built on the meta device, with what trainsim needs to trace and split it.

    Build it with :meth:`from_factory`; :meth:`check_parallel`, :meth:`trace` and :meth:`memory` take a
    resolved :class:`~workload.parallel.config.ParallelConfig`.
    """

    name: str
    """The module's class name (reports)."""
    factory: str
    """The ``[model] factory`` string (error messages)."""
    module: nn.Module
    blocks: str
    """Module path of the block container (``""``: the module's own children)."""
    repeated: bool
    """The blocks are identical (traced once; pipeline parallelism possible)."""
    num_parameters: int
    example: tuple[tuple, dict] | None = None
    """(args, kwargs) the factory returned for one micro-batch (positional arguments or keyword
    arguments, not both), or ``None``."""
    input_shape: tuple[int, ...] | None = None
    """One sample's input shape (``[model] input_shape``)."""
    input_dtype: str = "float"
    loss: str = ""
    """How the loss was formed from the output (set by tracing), e.g. ``output.sum()``."""
    _graphs: dict = field(default_factory=dict, repr=False)
    architecture: ClassVar[str] = "custom"
    """Its model family (:class:`CustomFamily`) in :mod:`workload.zoo.registry`."""

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_factory(cls, result: Any, factory: str, model: Mapping[str, Any]) -> CustomModel:
        """Wrap what ``factory`` returned (a module or ``(module, example_inputs)``) with the ``[model]``
        keys ``input_shape``, ``input_dtype`` and ``blocks``.

        Raises:
            ValueError: a malformed return value or key, naming the factory or the key.
        """
        example: tuple[tuple, dict] | None = None
        module = result
        if isinstance(result, tuple):
            if len(result) != 2 or not isinstance(result[0], nn.Module):
                raise ValueError(f"[model] factory {factory!r} returned a tuple of {len(result)}; expected "
                                 f"(module, example_inputs)")
            module, inputs = result
            if isinstance(inputs, torch.Tensor):
                example = ((inputs,), {})
            elif isinstance(inputs, Mapping):
                example = ((), dict(inputs))
            elif isinstance(inputs, Sequence) and not isinstance(inputs, str):
                example = (tuple(inputs), {})
            else:
                raise ValueError(f"[model] factory {factory!r}: example_inputs must be a tensor, a tuple of "
                                 f"arguments or a dict of keyword arguments, got {type(inputs).__name__}")
            if "input_shape" in model:
                raise ValueError(f"[model] input_shape: factory {factory!r} already returns example inputs; "
                                 f"give one or the other")
        shape = model.get("input_shape")
        if shape is not None and (not isinstance(shape, list) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)):
            raise ValueError(f"[model] input_shape must be a list of positive integers (one sample's shape, "
                             f"without the batch dimension), got {shape!r}")
        dtype = model.get("input_dtype", "float")
        if dtype not in INPUT_DTYPES:
            raise ValueError(f"[model] input_dtype: unknown {dtype!r}; allowed: {', '.join(INPUT_DTYPES)}")
        if "input_dtype" in model and shape is None:
            raise ValueError("[model] input_dtype goes with input_shape")
        blocks = model.get("blocks")
        if blocks is None:
            blocks = find_blocks(module)
        else:
            found = _submodule(module, blocks) if isinstance(blocks, str) else None
            if found is None:
                raise ValueError(f"[model] blocks: {type(module).__name__} has no submodule {blocks!r}; "
                                 f"containers: {', '.join(_containers(module)) or 'none'}")
        return cls(name=type(module).__name__, factory=factory, module=module, blocks=blocks,
                   repeated=_repeated_blocks(module, blocks) is not None,
                   num_parameters=sum(p.numel() for p in module.parameters()), example=example,
                   input_shape=tuple(shape) if shape is not None else None, input_dtype=dtype)

    @property
    def container(self) -> nn.Module:
        found = _submodule(self.module, self.blocks)
        assert found is not None  # from_factory checked ``blocks`` (or found it)
        return found

    @property
    def summary(self) -> str:
        """One line for reports: parameters and blocks."""
        kids = len(list(self.container.children()))
        where = f" in '{self.blocks}'" if self.blocks else " (top-level)"
        kind = f"{kids} {'identical ' if self.repeated else ''}block{'s' * (kids != 1)}{where}"
        loss = f", loss {self.loss}" if self.loss else ""
        return f"custom nn.Module ({self.factory}), {self.num_parameters / 1e6:,.2f} M parameters, {kind}{loss}"

    # -- parallel strategies ------------------------------------------------------------------
    def check_parallel(self, cfg: ParallelConfig) -> None:
        """Reject what a plain module cannot do.

        Raises:
            ValueError: one line naming the ``[parallel]`` field, its value and why.
        """
        what = f"{self.name} (factory {self.factory!r}) is a plain nn.Module"
        for fname, attr, why in _NEEDS_MEGATRON:
            v = getattr(cfg, attr)
            if v > 1:
                raise ValueError(f"[parallel] {fname} = {v}: {why}; {what}, so it must be 1 (a custom module "
                                 f"supports data parallelism, ZeRO-1/2/3, FSDP, full recomputation and, with "
                                 f"repeated blocks, pipeline parallelism)")
        if cfg.recompute_granularity in ("selective", "selective_op"):
            raise ValueError(f"[parallel] recompute_granularity = {cfg.recompute_granularity!r} is for the zoo "
                             f"transformers' layers; for {self.name}, a custom module, use 'none' or 'full'")
        if cfg.recompute_method is not None:
            raise ValueError(f"[training] recompute_method = {cfg.recompute_method!r} is for the zoo transformers' "
                             f"layers (Megatron-LM's flag); for {self.name}, a custom module, unset it (every block "
                             f"is recomputed under 'full')")
        if cfg.recompute_granularity == "full" and not any(True for _ in self.container.children()):
            raise ValueError(f"[parallel] recompute_granularity = 'full' re-runs each block's forward; "
                             f"{self.name} has no submodules to checkpoint: use 'none'")
        if cfg.pp > 1:
            if not self.repeated:
                found = _containers(self.module)
                hint = f"choose one of {', '.join(found)} with [model] blocks, or" if found else "so"
                raise ValueError(
                    f"[parallel] pipeline_model_parallel_size = {cfg.pp} splits a model by its repeated blocks; "
                    f"{self.name} has no nn.ModuleList/nn.Sequential of identical blocks ({hint} use 1)")
            blocks = self.container
            assert isinstance(blocks, (nn.ModuleList, nn.Sequential))  # what ``repeated`` blocks are in
            n = len(blocks)
            try:
                cfg.stage_layers(n)
            except ValueError as exc:
                raise ValueError(f"[parallel] {exc} ({self.name} has {n} blocks in '{self.blocks}')") from None

    # -- tracing ------------------------------------------------------------------------------
    def example_inputs(self, micro_batch_size: int, dtype: str) -> tuple[tuple, dict]:
        """(args, kwargs) for one micro-batch on the meta device, floating tensors in ``dtype``.

        Raises:
            ValueError: no way to build the input, or the factory's inputs have another batch size.
        """
        tdtype = _TORCH_DTYPES[dtype]
        if self.example is not None:
            args, kwargs = self.example
            tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            if tensors and (tensors[0].dim() == 0 or tensors[0].shape[0] != micro_batch_size):
                got = tuple(tensors[0].shape)
                raise ValueError(f"[training] micro_batch_size = {micro_batch_size}, but factory {self.factory!r} "
                                 f"returned example inputs of shape {got} (the leading dimension is the "
                                 f"micro-batch); make them agree")
        elif self.input_shape is not None:
            if self.input_dtype == "int64":
                x = torch.zeros((micro_batch_size, *self.input_shape), dtype=torch.int64, device="meta")
            else:
                x = torch.empty((micro_batch_size, *self.input_shape), dtype=tdtype, device="meta")
            return (x,), {}
        elif (module_inputs := getattr(self.module, "example_inputs", None)) is not None:
            with torch.device("meta"):
                got = module_inputs(micro_batch_size)
            args, kwargs = ((), dict(got)) if isinstance(got, Mapping) else (
                (got,) if isinstance(got, torch.Tensor) else tuple(got), {})
        else:
            raise ValueError(f"[model] input_shape is required: {self.name} (factory {self.factory!r}) needs an "
                             f"input; give one sample's shape, e.g. input_shape = [3, 224, 224] (trainsim "
                             f"prepends micro_batch_size), or return (module, example_inputs) from the factory")

        def prep(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            t = t.to("meta") if t.device.type != "meta" else t
            return t.to(tdtype) if t.is_floating_point() else t

        return tuple(prep(a) for a in args), {k: prep(v) for k, v in kwargs.items()}

    def graph(self, micro_batch_size: int, dtype: str) -> OpGraph:
        """The op graph of one micro-batch (fwd, bwd, Adam), with saved-tensor bytes; cached.

        Raises:
            ValueError: one line naming the factory when forward or backward cannot run on meta.
        """
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"[training] dtype {dtype!r}: a custom module trains in {', '.join(_TORCH_DTYPES)} "
                             f"(fp8 runs the zoo transformers' Linear layers as Transformer Engine does)")
        key = (micro_batch_size, dtype)
        if key not in self._graphs:
            args, kwargs = self.example_inputs(micro_batch_size, dtype)
            try:
                g = trace_model(self.module, kwargs if kwargs else args, dtype=_TORCH_DTYPES[dtype],
                                block_attr=self.blocks, loss_fn=self._loss, saved_activations=True)
            except Exception as exc:  # the user's code: one line naming the factory
                msg = str(exc).splitlines()[0] if str(exc) else ""
                raise ValueError(f"[model] factory {self.factory!r}: {self.name} could not be traced on the meta "
                                 f"device ({type(exc).__name__}: {msg})") from None
            self._graphs[key] = g
        return self._graphs[key]

    def trace(self, cfg: ParallelConfig, dtype: str = "bf16") -> ModelTrace:
        """The :class:`~workload.parallel.builder.ModelTrace` the builder splits into per-rank programs.

        Parameter counts are elements: ``params_block`` (identical blocks) or ``params_per_block``, and
        ``params_pre``/``params_post`` (parameters outside the blocks, by whether the part before the
        blocks uses them; ``params_post_tied``: of "pre", those a "post" module owns too, such as a tied
        output layer). ``hidden_size`` is the elements per sample of a block's input and
        ``seq_length`` 1, so that a pipeline p2p message is one block input.

        Raises:
            ValueError: see :meth:`check_parallel` and :meth:`graph`.
        """
        self.check_parallel(cfg)
        g = self.graph(cfg.micro_batch_size, dtype)
        names = g.info.get("block_names", [])
        kids = dict(self.container.named_children()) if names else {}
        per_block = [sum(p.numel() for p in kids[n].parameters()) for n in names]
        in_blocks = {id(p) for n in names for p in kids[n].parameters()}
        pre_layers = {o.layer for o in g.pre_ops("fwd")}
        # A parameter outside the blocks is "pre" if a module the part before the blocks runs owns it,
        # else "post"; one owned by both (an output layer tied to the input embedding) is also tied.
        owners: dict[int, tuple[int, bool, bool]] = {}  # id -> (elements, owned pre, owned post)
        for path, mod in self.module.named_modules():
            used_pre = any(lay == path or lay.startswith(path + ".") for lay in pre_layers) if path \
                else bool(pre_layers)
            for p in mod.parameters(recurse=False):
                if id(p) in in_blocks:
                    continue
                n, was_pre, was_post = owners.get(id(p), (p.numel(), False, False))
                owners[id(p)] = (n, was_pre or used_pre, was_post or not used_pre)
        pre = sum(n for n, is_pre, _ in owners.values() if is_pre)
        post = sum(n for n, is_pre, _ in owners.values() if not is_pre)
        tied = sum(n for n, is_pre, is_post in owners.values() if is_pre and is_post)
        eb = ELEM_BYTES[dtype]
        inputs = g.info["saved_bytes"]["block_inputs"]
        hidden = round(inputs[0] / (cfg.micro_batch_size * eb)) if inputs else 0
        return ModelTrace(
            graph=g, num_layers=g.num_blocks, hidden_size=hidden, seq_length=1, micro_batch_size=cfg.micro_batch_size,
            params_pre=pre, params_block=max(per_block, default=0), params_post=post, params_post_tied=tied,
            dtype=dtype,
            params_per_block=None if self.repeated else tuple(per_block))

    def _loss(self, out: Any) -> torch.Tensor:
        self.loss = _loss_name(out)
        return sum_loss(out)

    # -- memory -------------------------------------------------------------------------------
    def memory(self, cfg: ParallelConfig, *, dtype: str = "bf16", param_bytes: int = 2, grad_bytes: int = 4,
               optimizer_bytes_per_param: int | None = None) -> MemoryBreakdown:
        """Peak memory of one GPU (bytes), the busiest pipeline stage.

        Model states as :func:`workload.memory.memory_per_gpu`: ``param_bytes`` per parameter,
        ``grad_bytes`` per gradient (4: fp32 main gradients), ``optimizer_bytes_per_param`` (default
        12: fp32 master weights and Adam moments; 8 when parameters are fp32), sharded over the
        data-parallel ranks by ZeRO stage (1: optimizer, 2: + gradients, 3/FSDP: + parameters).
        Activations: the traced forward's saved tensors times the micro-batches in flight (1F1B: stage
        ``i`` of ``p`` holds ``min(p, m) - i``, at least 1; GPipe: all ``m``; interleaved: stage 0 x
        ``1 + (p-1)/(p·v)``); with full recomputation a block keeps only its input and the largest
        block's saved tensors are the workspace.

        Raises:
            ValueError: see :meth:`trace`.
        """
        t = self.trace(cfg, dtype)
        assert isinstance(t.graph, OpGraph)  # ModelTrace.graph is typed ``object``; ours is the traced graph
        saved = t.graph.info["saved_bytes"]
        n = t.num_layers
        per_vstage = cfg.stage_layers(n)
        offsets = [0]
        for k in per_vstage:
            offsets.append(offsets[-1] + k)
        p, v, m = cfg.pp, cfg.vpp, cfg.num_microbatches
        opt_bytes = optimizer_bytes_per_param if optimizer_bytes_per_param is not None else (
            12 if param_bytes < 4 else 8)
        full = cfg.recompute_granularity == "full"
        zero, shard = cfg.memory_zero_stage, cfg.dp * cfg.cp
        in_flight_first = m if cfg.schedule == "gpipe" else max(1, min(p, m))

        def one_stage(i: int) -> MemoryBreakdown:
            layers = [layer for c in range(v) for layer in range(offsets[c * p + i], offsets[c * p + i + 1])]
            params = float(sum(t.block_params(layer) for layer in layers))
            act = sum(saved["block_inputs"][layer] if full else saved["blocks"][layer] for layer in layers)
            in_flight = in_flight_first if cfg.schedule == "gpipe" else max(1, in_flight_first - i)
            act *= interleaved_in_flight(p, i, v, m) if cfg.schedule == "interleaved_1f1b" else in_flight
            extra = 0.0
            if i == 0:
                params += t.params_pre
                extra += saved["pre"] * in_flight
            if i == p - 1:
                params += t.params_post
                extra += saved["post"] * in_flight
            workspace = max((saved["blocks"][layer] - saved["block_inputs"][layer] for layer in layers),
                            default=0.0) if full else 0.0
            return MemoryBreakdown(
                parameters=params * param_bytes / (shard if zero >= 3 else 1),
                gradients=params * grad_bytes / (shard if zero >= 2 else 1),
                optimizer_states=params * opt_bytes / (shard if zero >= 1 else 1),
                activations=act + extra, workspace=max(workspace, 0.0), stage=i, params_per_gpu=params,
                detail={"saved_bytes_pre": saved["pre"], "saved_bytes_post": saved["post"],
                        "saved_bytes_blocks": math.fsum(saved["blocks"]), "layers": len(layers),
                        "microbatches_in_flight": in_flight})

        return max((one_stage(i) for i in range(p)), key=lambda r: (r.total, -r.stage))



class CustomFamily(ModelFamily):
    """A user's own module: traced whole by :meth:`CustomModel.trace` (its own blocks), FLOPs traced,
    memory from the saved tensors (:meth:`CustomModel.memory`)."""

    name = "custom"
    config_type = CustomModel
    transformer = False

    def unsupported(self, cfg: CustomModel) -> dict[str, str]:
        reasons = {attr: why for _, attr, why in _NEEDS_MEGATRON}
        reasons["sp"] = "sequence parallelism splits the zoo's Megatron layers"
        reasons["pp"] = "pipeline parallelism needs an nn.ModuleList/nn.Sequential of identical blocks"
        if cfg.repeated:
            del reasons["pp"]
        return reasons

    def check_parallel(self, cfg: CustomModel, parallel: ParallelConfig) -> None:
        cfg.check_parallel(parallel)

    def build(self, cfg: CustomModel, *, tp=None, ep: int = 1) -> nn.Module:
        self.check_sizes(cfg, tp=tp.size if tp is not None else 1, ep=ep)
        return cfg.module

    def own_trace(self, cfg: CustomModel, parallel: ParallelConfig, dtype: str) -> ModelTrace:
        return cfg.trace(parallel, dtype)

    def memory(self, cfg: CustomModel, parallel: ParallelConfig, dtype: str, *,
               compiled: bool = False) -> MemoryBreakdown:
        """The module's own saved tensors (:meth:`CustomModel.memory`); ``compiled`` changes nothing here."""
        param_bytes, grad_bytes = state_bytes(dtype)
        return cfg.memory(parallel, dtype=dtype, param_bytes=param_bytes, grad_bytes=grad_bytes)


FAMILIES = (CustomFamily(),)
