"""Trace one training step of a torch module into an :class:`OpGraph`, on the meta device.

The recipe (``reference/style_ecosystem.md`` §2.3): build the model on ``torch.device("meta")`` (no
memory, no init cost), run forward, backward and an ``AdamW`` step under a
:class:`~torch.utils._python_dispatch.TorchDispatchMode` that records every aten op
(:mod:`workload.trace.recorder`), while a :class:`~torch.utils.module_tracker.ModuleTracker` says
which module issued it (:mod:`workload.trace.tracker`). Per op we keep the name, shapes, dtype, FLOPs
(``torch.utils.flop_counter.flop_registry``), bytes read + written (views skipped, stride-0 dims
counted once, as ``torch/utils/_runtime_estimation.py``), module path, phase and the producers of its
inputs (dependency edges).

Reroutes (a :class:`~torch.overrides.TorchFunctionMode`, :mod:`workload.trace.reroutes`) make the
trace look like a GPU run rather than the meta/CPU fallback: ``F.scaled_dot_product_attention``
becomes one ``aten._scaled_dot_product_flash_attention`` op (and one ``..._backward``) instead of the
math path with its ``B·H·T·T`` score tensor, ``F.rms_norm`` one fused RMSNorm op and ``F.dropout``
one dropout kernel (:mod:`workload.trace.fused_ops`).

**Layer dedup.** A model whose ``layers`` attribute is an ``nn.ModuleList`` of identical blocks (same
class, same parameter and buffer shapes) is traced with only its first block
(:mod:`workload.trace.blocks`); the block's forward, backward and optimizer ops are then cloned once
per layer with renamed module paths and re-wired dependencies (:mod:`workload.trace.assemble`). A
96-layer model therefore costs about one layer to trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from workload.trace.assemble import assemble
from workload.trace.blocks import one_block_copy, repeated_blocks, submodule
from workload.trace.errors import TraceError
from workload.trace.graph import OpGraph
from workload.trace.kinds import dtype_name
from workload.trace.optimizer import trace_adamw
from workload.trace.recorder import Recorder
from workload.trace.reroutes import FusedKernels
from workload.trace.saved import saved_by_part, saved_tensors
from workload.trace.tracker import Tracker


def _default_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().mean()
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return _default_loss(out[0])
    raise TraceError(f"cannot derive a scalar loss from the model output of type {type(out).__name__}; "
                     f"pass loss_fn=")


def _first_float(args: tuple, kwargs: dict) -> torch.Tensor | None:
    return next((t for t in tree_flatten((args, kwargs))[0]
                 if isinstance(t, torch.Tensor) and t.is_floating_point()), None)


@dataclass
class _BlockHooks:
    """Forward pre-hooks on the blocks: which ops produce the first block's input activations, the order
    in which forward first calls the container's children, and each child's input size."""

    rec: Recorder
    block_inputs: set[int] = field(default_factory=set)
    """Ops producing the first block's input activations (dedup only)."""
    call_order: list[str] = field(default_factory=list)
    """Children of the container, in the order forward first calls them."""
    input_bytes: dict[str, float] = field(default_factory=dict)
    """Child -> bytes of its first floating-point input."""
    handles: list = field(default_factory=list)

    def install(self, traced: nn.Module, container: nn.Module | None, dedup: bool, block_attr: str) -> None:
        if dedup:
            blocks = submodule(traced, block_attr)
            assert isinstance(blocks, (nn.ModuleList, nn.Sequential))  # dedup: repeated_blocks found it
            first = blocks[0]
            self.handles.append(first.register_forward_pre_hook(self._note_block_input, with_kwargs=True))
            self.handles.append(first.register_forward_pre_hook(self._note_call("0"), with_kwargs=True))
        elif container is not None:
            for name, child in container.named_children():
                self.handles.append(child.register_forward_pre_hook(self._note_call(name), with_kwargs=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def _note_block_input(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t in self.rec.producer:
                self.block_inputs.add(self.rec.producer[t])
                break

    def _note_call(self, name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if name not in self.input_bytes:
                self.call_order.append(name)
                first = _first_float(args, kwargs)
                self.input_bytes[name] = float(first.numel() * first.element_size()) if first is not None else 0.0
        return hook


def _on_meta(model: nn.Module, dtype: torch.dtype | None) -> nn.Module:
    """``model`` on the meta device, cast to ``dtype``, in training mode."""
    if any(p.device.type != "meta" for p in model.parameters()):
        model = model.to_empty(device="meta")
    if dtype is not None:
        model.to(dtype)
    model.train()
    return model


def _call_args(model: nn.Module, inputs: Sequence[Any] | dict[str, Any] | None,
               micro_batch_size: int) -> tuple[tuple, dict]:
    """(args, kwargs) of the model call (``inputs``, or the model's ``example_inputs``)."""
    if inputs is None:
        example_inputs = getattr(model, "example_inputs", None)  # a method of the user's model, if any
        if example_inputs is None:
            raise TraceError(f"{type(model).__name__} has no example_inputs(); pass inputs=")
        inputs = example_inputs(micro_batch_size)
    return ((), dict(inputs)) if isinstance(inputs, dict) else (tuple(inputs), {})


@dataclass
class _Step:
    """What one traced step needs besides the model: the loss, the optimizer and what to record."""

    loss_fn: Callable[[Any], torch.Tensor] | None
    optimizer: bool
    master_dtype: torch.dtype
    weight_decay: float
    saved: list[tuple[str, float]] | None
    """Filled with (module path, bytes) of the saved tensors; ``None``: not recorded."""
    fused_rms_norm: bool = True
    """``F.rms_norm`` as one fused kernel (else PyTorch eager's decomposition, traced as it runs)."""


def _run_step(traced: nn.Module, args: tuple, kwargs: dict, rec: Recorder, step: _Step) -> None:
    """Forward, backward and (optionally) the AdamW step of ``traced`` under the recorder."""
    params = [(n, p) for n, p in traced.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    packing = saved_tensors(rec, traced, step.saved) if step.saved is not None else nullcontext()
    try:
        with torch.device("meta"), rec.tracker, FusedKernels(rec, fused_rms_norm=step.fused_rms_norm), rec:
            with packing:
                loss = (step.loss_fn or _default_loss)(traced(*args, **kwargs))
            rec.phase = "bwd"
            loss.backward()
        if step.optimizer:
            trace_adamw(rec, params, step.master_dtype, step.weight_decay)
    finally:
        for _, p in params:
            p.grad = None


def trace_model(
    model: nn.Module,
    inputs: Sequence[Any] | dict[str, Any] | None = None,
    *,
    micro_batch_size: int = 1,
    dtype: torch.dtype | None = torch.bfloat16,
    optimizer: bool = True,
    layer_dedup: bool = True,
    block_attr: str = "layers",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    master_dtype: torch.dtype = torch.float32,
    weight_decay: float = 0.1,
    saved_activations: bool = False,
    fused_rms_norm: bool = True,
) -> OpGraph:
    """Trace forward, backward and (optionally) one AdamW step of ``model`` into an :class:`OpGraph`.

    Args:
        model: a module on the meta device (moved there with ``to_empty`` if it is not). Its parameters
            are cast to ``dtype`` in place (free on meta).
        inputs: positional arguments (a sequence) or keyword arguments (a dict) for ``model(...)``;
            ``None`` calls ``model.example_inputs(micro_batch_size)`` (every zoo model has it).
        micro_batch_size: B, used only when ``inputs`` is ``None``.
        dtype: parameter/activation dtype (``None`` keeps the model's).
        optimizer: also trace ``torch.optim.AdamW.step()`` as phase ``opt``. Mixed precision as
            Megatron: fp32 (``master_dtype``) master weights and Adam moments; the step casts the
            gradient to fp32, updates, and copies the master back into the ``dtype`` parameter. We use
            the single-tensor implementation (``foreach=False``): it traces on meta and yields
            per-parameter kernels, attributable to a layer and shardable with it (``foreach=True``
            also traces but fuses all parameters into ``_foreach_*`` ops). The first step, which only
            allocates the moments, is run untraced.
        layer_dedup: trace one of identical ``model.<block_attr>`` blocks and clone it (see module doc).
        block_attr: module path of the block container (``"layers"``, ``"encoder.blocks"``; ``""``: the
            model's own children). An ``nn.ModuleList``/``nn.Sequential`` of identical blocks is
            deduplicated; any other container's children are the blocks, numbered in the order forward
            first calls them (:attr:`OpGraph.info` ``block_names``). No module at that path: no blocks.
        loss_fn: maps the model output to a scalar loss; default: the output if it is a scalar,
            ``output["loss"]``, ``output[0]``, else ``output.float().mean()``.
        saved_activations: also record the tensors autograd saves for backward
            (``torch.autograd.graph.saved_tensors_hooks``), once per storage, parameters and buffers
            excluded, into ``graph.info["saved_bytes"]``: ``{"pre": B, "post": B, "blocks": [B per
            block], "block_inputs": [B per block]}`` for one micro-batch (bytes), where
            ``block_inputs`` is the size of each block's first floating-point input (what full
            recomputation keeps).
        fused_rms_norm: ``F.rms_norm`` as one fused kernel (Transformer Engine's or apex's RMSNorm, and
            what torch.compile generates); ``False``: PyTorch eager's ``at::rms_norm``, a
            CompositeImplicitAutograd function (``aten/src/ATen/native/layer_norm.cpp``) that runs as
            its decomposition -- an fp32 upcast, ``pow``, ``mean``, ``add_``, ``rsqrt``, two ``mul`` and a
            cast back in forward, and autograd's dozen fp32 kernels in backward (PyTorch releases up to
            2.7 had no fused CUDA RMSNorm kernel; torchtitan's ``nn.RMSNorm`` ran so in Dec 2024).

    Raises:
        TraceError: an op has no meta kernel or is data-dependent (``nonzero``, ``.item()``...).
    """
    model = _on_meta(model, dtype)
    container = submodule(model, block_attr)
    blocks = repeated_blocks(model, block_attr)
    dedup = layer_dedup and blocks is not None
    traced = one_block_copy(model, block_attr) if dedup else model
    args, kwargs = _call_args(model, inputs, micro_batch_size)
    rec = Recorder(Tracker(), type(traced).__name__)
    hooks = _BlockHooks(rec)
    step = _Step(loss_fn, optimizer, master_dtype, weight_decay, [] if saved_activations else None,
                 fused_rms_norm)
    hooks.install(traced, container, dedup, block_attr)
    try:
        _run_step(traced, args, kwargs, rec, step)
    finally:
        hooks.remove()
    if dedup:
        assert blocks is not None  # dedup implies repeated blocks
        num_blocks = len(blocks)
        graph = assemble(rec.ops, num_blocks, block_attr, hooks.block_inputs,
                         pattern_of=lambda path: getattr(submodule(model, path), "attention_pattern", None))
        names = [str(i) for i in range(num_blocks)]
    else:
        names = hooks.call_order if container is not None else []
        num_blocks = len(names)
        graph = assemble(rec.ops, 0, block_attr, hooks.block_inputs, names)
    graph.num_blocks = num_blocks
    graph.info.update(model=type(model).__name__, layer_dedup=dedup, dtype=dtype_name(dtype or torch.float32),
                      num_parameters=sum(p.numel() for p in model.parameters()))
    if container is not None and names:
        graph.info["block_names"] = names
    if step.saved is not None:
        graph.info["saved_bytes"] = saved_by_part(step.saved, block_attr, names[:1] if dedup else names,
                                                  hooks.input_bytes, num_blocks, dedup)
    return graph
