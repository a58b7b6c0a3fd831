"""The dispatch recorder: every aten op of a traced step as a plain dict (name, kind, FLOPs, bytes,
module, phase and the producers of its inputs)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

from workload.trace import kinds
from workload.trace.errors import TraceError

if TYPE_CHECKING:
    from workload.trace.tracker import Tracker


# Ops whose output shape or value depends on tensor data (no meta kernel, or a meaningless one).
_DATA_DEPENDENT = {"nonzero", "bincount", "masked_select", "_unique", "_unique2", "unique_dim",
                   "unique_consecutive", "histc", "_local_scalar_dense"}
_DATA_DEPENDENT_HINT = (
    "data-dependent ops need an explicit assumption on the meta device (e.g. MoE routing: assume "
    "uniform tokens-per-expert with a capacity factor, as workload.zoo.moe does; replace .item()/"
    "nonzero/bincount with static-shape code)"
)


class Recorder(TorchDispatchMode):
    """Records aten ops as plain dicts (turned into :class:`OpRecord` s by :func:`assemble`)."""

    def __init__(self, tracker: Tracker, root: str) -> None:
        super().__init__()
        self.tracker, self.root = tracker, root
        self.ops: list[dict[str, Any]] = []
        self.producer: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.phase = "fwd"
        self.layer_override: str | None = None
        self.storage_alias: dict[int, int] = {}
        """Storage key -> the storage it stands for (the flash output relaid out unrecorded). Both storages
        are pinned (:meth:`alias_storage`): a key is an address, which a freed storage hands on."""
        self._pinned: list[torch.UntypedStorage] = []
        self.pending_pattern: Any = None
        """The :class:`~workload.trace.masked_attention.AttentionPattern` of the attention call being
        rerouted (set by :class:`~workload.trace.reroutes.FusedKernels`), for the fused op it issues."""
        self._pattern_of_output: WeakIdKeyDictionary = WeakIdKeyDictionary()
        """A patterned forward attention op's outputs -> (pattern, its module path): its backward op reads
        them (``out``, ``logsumexp``) and takes the same pattern. Weak keys, by identity (as ``producer``):
        a freed output's storage reused by another tensor carries no pattern."""
        self._paused = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Run ops without recording them."""
        self._paused, was = True, self._paused
        try:
            yield
        finally:
            self._paused = was

    def alias(self, new: torch.Tensor, old: torch.Tensor) -> None:
        """Let ``new`` stand for ``old`` as a dependency source."""
        if old in self.producer:
            self.producer[new] = self.producer[old]

    def alias_storage(self, new: torch.Tensor, old: torch.Tensor) -> None:
        """Let the storage of ``new`` stand for that of ``old`` in saved-tensor accounting.

        A :func:`storage_key` is the address of the storage's C++ object, reused by the allocator once the
        storage is freed. ``nn.MultiheadAttention`` copies the relaid attention output and drops it; a later
        storage (an MLP activation) born at its address would then read as the attention output, already
        counted, and be skipped -- or not, by the heap's state, which follows the hash seed. Both storages
        are therefore kept alive until the recorder goes (free on the meta device), so a key names one
        storage for the whole trace.
        """
        self._pinned += [new.untyped_storage(), old.untyped_storage()]
        self.storage_alias[storage_key(new)] = storage_key(old)

    def current_layer(self) -> str:
        if self.layer_override is not None:
            return self.layer_override
        # the innermost module (see Tracker); never by set order, which depends on PYTHONHASHSEED
        path = self.tracker.innermost()
        if path == self.root:
            return ""
        return path.removeprefix(self.root + ".")

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        name = func._overloadpacket.__name__
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_meta = any(t.device.type == "meta" for t in ins)
        if on_meta and (torch.Tag.data_dependent_output in func.tags or name in _DATA_DEPENDENT):
            what = "Tensor.item()" if name == "_local_scalar_dense" else f"aten.{name}"
            raise TraceError(f"{what} (aten.{name}) cannot run on the meta device: its result depends on "
                             f"tensor values. In module '{self.current_layer() or '<top>'}': {_DATA_DEPENDENT_HINT}")
        try:
            out = func(*args, **kwargs)
        except TraceError:
            raise
        except (NotImplementedError, RuntimeError) as e:
            raise TraceError(f"aten.{name} failed on the meta device in module '{self.current_layer() or '<top>'}'"
                             f" ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
                             f"If it has no meta kernel, express it with ops that do; "
                             f"{_DATA_DEPENDENT_HINT}") from e
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if func.namespace == "profiler" or not (on_meta or any(o.device.type == "meta" for o in outs)):
            return out  # host-side bookkeeping (the optimizer's CPU step counter) launches no kernel
        if func.is_view or name in kinds.NO_KERNEL_OPS:
            src = self.producer.get(ins[0]) if ins else None
            if src is not None:
                for o in outs:
                    self.producer[o] = src
            return out
        pkt = func._overloadpacket
        flops = float(flop_registry[pkt](*args, **kwargs, out_val=out)) if pkt in flop_registry else 0.0
        kind = kinds.kernel_kind(name, func, self.phase)
        shape: tuple[int, ...] = ()
        causal = False
        kv_heads = 0
        model_flops = flops
        if name in kinds.GEMM_OPS:
            shape = kinds.gemm_shape(name, args, out)
        elif name in kinds.ATTENTION_FWD_OPS or name in kinds.ATTENTION_BWD_OPS:
            shape, causal = kinds.attention_info(name, args, kwargs)
            kv_heads = kinds.attention_kv_heads(name, args)
            if name in kinds.ATTENTION_BWD_OPS:
                model_flops = flops * 0.8  # 5 GEMMs incl. the recomputed QK^T -> the 4 of a plain bwd
        pattern = self._attention_pattern(name, ins, outs)
        floats = [t for t in ins + outs if t.is_floating_point()]
        nbytes = float(sum(map(kinds.tensor_bytes, ins)) + sum(map(kinds.tensor_bytes, outs)))
        if name == "embedding":
            # a gather: the indices, the rows they select (as many bytes as the output) and the
            # output; not the whole table. Its backward (embedding_dense_backward) keeps the default
            # count, table-sized: CUDA's embedding_backward_cuda_kernel (ATen
            # native/cuda/EmbeddingBackwardKernel.cu) allocates the gradient with at::zeros({num_weights,
            # dim}), a write of the whole table, then reads the incoming gradient and adds its rows.
            nbytes = float(kinds.tensor_bytes(args[1]) + 2 * sum(map(kinds.tensor_bytes, outs)))
        idx = len(self.ops)
        self.tracker.ops += 1
        self.ops.append({
            "name": f"{func.namespace}.{name}", "kind": kind, "phase": self.phase, "layer": self.current_layer(),
            "flops": model_flops,
            "kernel_flops": flops, "bytes": nbytes,
            "dtype": kinds.dtype_name(floats[0].dtype) if floats else kinds.dtype_name((ins + outs)[0].dtype),
            "shape": tuple(int(s) for s in shape), "causal": causal, "pattern": pattern, "kv_heads": kv_heads,
            "in_shapes": tuple(tuple(t.shape) for t in ins), "out_shapes": tuple(tuple(t.shape) for t in outs),
            "deps": tuple(sorted({d for d in (self.producer.get(t) for t in ins) if d is not None})),
        })
        for o in outs:
            self.producer[o] = idx
        return out


    def _attention_pattern(self, name: str, ins: list, outs: list) -> tuple[Any, str] | None:
        """(pattern, module path of the forward call) of a fused attention op issued by
        :func:`~workload.trace.masked_attention.masked_attention`, forward or backward; else ``None``."""
        if name in kinds.ATTENTION_FWD_OPS and self.pending_pattern is not None:
            found = (self.pending_pattern, self.current_layer())
            for o in outs[:2]:  # out, logsumexp (the RNG state tensors may be shared between calls)
                self._pattern_of_output[o] = found
            return found
        if name in kinds.ATTENTION_BWD_OPS:
            return next((self._pattern_of_output[t] for t in ins if t in self._pattern_of_output), None)
        return None


def storage_key(t: torch.Tensor) -> int:
    """The address of ``t``'s storage object: identifies it only while the storage lives (a freed one's
    address is reused), so callers that remember keys keep the storages alive."""
    return t.untyped_storage()._cdata
