"""Assembling the recorded ops into an :class:`OpGraph`, cloning the traced block once per layer.

With layer dedup only block 0 is traced; each phase is laid out as ``[pre][block x N][post]`` and the
clones' dependencies and module paths are re-written (see :func:`assemble`). Without dedup the ops
keep their order and are annotated with the part and block they belong to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workload.trace.blocks import block_path, child_name
from workload.trace.graph import OpGraph, OpRecord, window_fraction


def _part_ranges(ops: list[dict], phase: str, prefix: str) -> tuple[list[int], tuple[int, int] | None]:
    """Indices of ``phase`` ops, and the (first, last) position among them of the block's ops."""
    idx = [i for i, o in enumerate(ops) if o["phase"] == phase]
    pos = [j for j, i in enumerate(idx) if in_block(ops[i]["layer"], prefix)]
    return idx, ((pos[0], pos[-1]) if pos else None)


def in_block(layer: str, prefix: str) -> bool:
    """Whether module path ``layer`` lies in the module ``prefix``."""
    return layer == prefix or layer.startswith(prefix + ".")


# Positional segments in backward run head first: what precedes the blocks there is the "post" part.
_BWD_PART = {"pre": "post", "post": "pre"}


def _annotate(raw: list[dict], idx: list[int], attr: str,
              names: list[str] | None = None) -> list[tuple[str, int | None]]:
    """(part, block) of undeduplicated ops: block ``i`` is the container child ``names[i]`` (default
    ``<attr>.<i>`` module paths); ops between two ops of block i go to block i (backward ops the tracker
    attributes to no module)."""
    index = {n: i for i, n in enumerate(names)} if names is not None else None
    blocks: list[int | None] = []
    for i in idx:
        child = child_name(raw[i]["layer"], attr)
        if index is not None:
            blocks.append(index.get(child) if child is not None else None)
        else:
            blocks.append(int(child) if child is not None and child.isdigit() else None)
    known = [j for j, b in enumerate(blocks) if b is not None]
    if not known:
        return [("pre", None)] * len(idx)
    out: list[tuple[str, int | None]] = []
    last = None
    for j, b in enumerate(blocks):
        if j < known[0]:
            out.append(("pre", None))
        elif j > known[-1]:
            out.append(("post", None))
        else:
            last = b if b is not None else last
            out.append(("block", last))
    return out


@dataclass
class _Layout:
    """Where each recorded (template) op goes in the assembled graph."""

    order: list[tuple[int, int | None, str]] = field(default_factory=list)
    """(template index, clone -- or the annotated block without dedup --, part), in graph order."""
    seg: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Template index -> (phase, part)."""
    boundary_out: dict[str, list[int]] = field(default_factory=dict)
    """Phase -> the block's template ops whose outputs the following segment consumes."""


def _layout(raw: list[dict], num_blocks: int, attr: str, prefix: str, block_names: list[str] | None) -> _Layout:
    """Per phase ``[pre][block x num_blocks][post]`` (bwd clones in reverse); without blocks, the issue
    order annotated by :func:`_annotate`."""
    lay = _Layout()
    clones_in_order = {"fwd": range(num_blocks), "bwd": range(num_blocks - 1, -1, -1),
                       "opt": range(num_blocks)}
    for phase in ("fwd", "bwd", "opt"):
        idx, rng = _part_ranges(raw, phase, prefix)
        if num_blocks == 0 or rng is None:
            for i, (part, block) in zip(idx, _annotate(raw, idx, attr, block_names), strict=True):
                lay.order.append((i, block, part))
                lay.seg[i] = (phase, "pre")
            continue
        a, b = rng
        pre, blk, post = idx[:a], idx[a:b + 1], idx[b + 1:]
        for part, ids in (("pre", pre), ("block", blk), ("post", post)):
            for i in ids:
                lay.seg[i] = (phase, part)
        blk_set = set(blk)
        # block ops whose outputs the following segment consumes: the block's "output" in this phase
        lay.boundary_out[phase] = sorted({d for i in post for d in raw[i]["deps"] if d in blk_set})
        lay.order += [(i, None, "pre") for i in pre]
        for c in clones_in_order[phase]:
            lay.order += [(i, c, "block") for i in blk]
        lay.order += [(i, None, "post") for i in post]
    return lay


def _clone_deps(template_deps: tuple[int, ...], c: int | None, lay: _Layout,
                new_index: dict[tuple[int, int | None], int], num_blocks: int,
                block_inputs: set[int] | None) -> set[int]:
    """Graph indices of the producers of an op of clone ``c`` (``None``: outside the blocks)."""
    last_clone = {"fwd": num_blocks - 1, "bwd": 0, "opt": num_blocks - 1}
    deps: set[int] = set()
    for d in template_deps:
        dphase, dpart = lay.seg[d]
        if dpart == "block":
            deps.add(new_index[(d, c if c is not None else last_clone[dphase])])
            continue
        prev = None
        boundary = dphase == "bwd" or not block_inputs or d in block_inputs
        if c is not None and dpart == "pre" and dphase in ("fwd", "bwd") and boundary:
            # an input from before the block: for later clones, the previous clone's output
            first = 0 if dphase == "fwd" else num_blocks - 1
            if c != first and lay.boundary_out.get(dphase):
                prev = c - 1 if dphase == "fwd" else c + 1
        if prev is not None:
            deps.update(new_index[(b, prev)] for b in lay.boundary_out[dphase])
        else:
            deps.add(new_index[(d, None)])
    return deps


PatternOf = Callable[[str], Any]
"""Module path -> that module's ``attention_pattern`` (``None``: it has none)."""


def _pattern(o: dict, clone: int | None, attr: str, pattern_of: PatternOf | None) -> Any:
    """The attention pattern of op ``o`` in ``clone``: the traced one, or with layer dedup that of the
    clone's module in the same place (a windowed layer's template cloned into a global layer)."""
    found = o.get("pattern")
    if found is None:
        return None
    pattern, where = found
    template = block_path(attr, 0)
    if clone is not None and pattern_of is not None and in_block(where, template):
        own = pattern_of(block_path(attr, clone) + where[len(template):])
        if own is not None:
            return own
    return pattern


def _record(o: dict, index: int, layer: str, part: str, block: int | None, deps: set[int],
            pattern: Any = None) -> OpRecord:
    """The :class:`OpRecord` of recorded op ``o`` at graph position ``index``, with the window, sinks and
    ALiBi of ``pattern`` (a :class:`~workload.trace.masked_attention.AttentionPattern`; its window
    scales the model FLOPs by :func:`~workload.trace.graph.window_fraction`)."""
    window, sinks = (pattern.window, pattern.sinks) if pattern else (0, 0)
    return OpRecord(
        index=index, name=o["name"], kind=o["kind"], phase=o["phase"], layer=layer,
        part=_BWD_PART.get(part, part) if o["phase"] == "bwd" else part, block=block,
        flops=o["flops"] * window_fraction(o["shape"], o["causal"], window, sinks),
        kernel_flops=o["kernel_flops"],
        bytes_accessed=o["bytes"], dtype=o["dtype"], shape=o["shape"], in_shapes=o["in_shapes"],
        out_shapes=o["out_shapes"], deps=tuple(sorted(deps)), causal=o["causal"], window=window, sinks=sinks,
        alibi=bool(pattern and pattern.alibi), kv_heads=o.get("kv_heads", 0))


def assemble(raw: list[dict], num_blocks: int, attr: str, block_inputs: set[int] | None = None,
             block_names: list[str] | None = None, pattern_of: PatternOf | None = None) -> OpGraph:
    """Turn recorded op dicts into an :class:`OpGraph`, cloning block 0 ``num_blocks`` times if > 0
    (else annotating blocks by ``block_names``, see :func:`_annotate`).

    Dependencies of clone ``c`` on ops before the block are re-wired to the previous clone's outputs
    (the ops whose results the following segment consumes) when they are the block's input
    activations (``block_inputs``, found by a forward pre-hook; all fwd inputs if unknown) or, in
    backward, the incoming gradient. Other inputs (RoPE tables, masks) keep their producer.
    A clone's attention ops take the ``attention_pattern`` of the clone's own module (``pattern_of``),
    so layers that differ only in their window (Gemma's local and global layers) still dedup.
    """
    prefix = block_path(attr, 0)
    lay = _layout(raw, num_blocks, attr, prefix, block_names)
    new_index: dict[tuple[int, int | None], int] = {}
    ops: list[OpRecord] = []
    for n, (t, c, part) in enumerate(lay.order):
        o = raw[t]
        layer = o["layer"]
        if num_blocks == 0:  # no cloning: op t is op n
            new_index[(t, None)] = n
            deps = {new_index[(d, None)] for d in o["deps"]}
        else:
            deps = _clone_deps(o["deps"], c, lay, new_index, num_blocks, block_inputs)
            if part == "block":
                assert c is not None  # a block op always carries its block (the clone, or _annotate's)
                rest = layer[len(prefix):] if in_block(layer, prefix) else ""
                layer = f"{block_path(attr, c)}{rest}"
            new_index[(t, c)] = n
        ops.append(_record(o, n, layer, part, c, deps, _pattern(o, c if num_blocks else None, attr, pattern_of)))
    return OpGraph(ops=ops, num_blocks=num_blocks, block_attr=attr)
