"""Saved-tensor accounting: the bytes autograd keeps for backward, per part of the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from workload.trace.blocks import child_name
from workload.trace.recorder import storage_key

if TYPE_CHECKING:
    from workload.trace.recorder import Recorder


@contextmanager
def saved_tensors(rec: Recorder, model: nn.Module, out: list[tuple[str, float]]) -> Iterator[None]:
    """Record (module path, bytes) of each storage autograd saves for backward, once per storage;
    parameters and buffers (model state, counted elsewhere) excluded.

    Storages are told apart by :func:`~workload.trace.recorder.storage_key`, an address; ``seen`` holds each
    counted storage so that its address is not handed to a later one while the trace runs (a saved tensor
    whose graph is dropped in forward would otherwise free it, and its successor would go uncounted).
    """
    own = {storage_key(t) for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            key = rec.storage_alias.get(storage_key(t), storage_key(t))
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError, AttributeError):  # tensor subclasses without storage
            return t
        if key not in own and key not in seen:
            seen[key] = t.untyped_storage()
            out.append((rec.current_layer(), float(nbytes)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def saved_by_part(saved: list[tuple[str, float]], attr: str, names: list[str], input_bytes: dict[str, float],
                  num_blocks: int, dedup: bool) -> dict[str, Any]:
    """Saved bytes per part: before the blocks, per block, after (an entry outside the blocks between
    two block entries goes to the block before it, as :func:`workload.trace.assemble._annotate` does with ops)."""
    index = {n: i for i, n in enumerate(names)}
    children = [child_name(layer, attr) for layer, _ in saved]
    where = [index.get(child) if child is not None else None for child in children]
    known = [j for j, b in enumerate(where) if b is not None]
    pre = post = 0.0
    per_block = [0.0] * len(names)
    last = None
    for j, ((_, nbytes), b) in enumerate(zip(saved, where, strict=True)):
        if not known or j < known[0]:
            pre += nbytes
        elif j > known[-1]:
            post += nbytes
        else:
            last = b if b is not None else last
            assert last is not None  # j >= known[0], whose block is known
            per_block[last] += nbytes
    inputs = [input_bytes.get(n, 0.0) for n in names]
    if dedup:  # one block traced: every clone saves the same
        per_block, inputs = per_block * num_blocks, inputs * num_blocks
    return {"pre": pre, "post": post, "blocks": per_block, "block_inputs": inputs}
