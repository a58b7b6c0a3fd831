"""Full recomputation of some layers: Megatron-LM's ``--recompute-method`` and ``--recompute-num-layers``.

With ``--recompute-granularity full`` Megatron-Core's ``TransformerBlock._checkpointed_forward`` wraps
layers of each model chunk (a pipeline stage, or one virtual chunk of it when interleaved: the block
holds ``num_layers_per_pipeline_rank`` layers) in checkpoints. A checkpoint stores only its input and
re-runs its layers' forward before their backward:

* ``uniform``: the chunk's layers in consecutive groups of ``N``, each group one checkpoint (fewer
  stored inputs, ``N`` layers re-materialised at once in the backward);
* ``block``: the first ``N`` layers of the chunk, each its own checkpoint; the other layers are not
  recomputed and store every activation (``N = 0``: no recomputation at all).

``recompute_granularity = "full"`` without a method is every layer its own checkpoint (uniform, 1
layer: SC'21's ``--checkpoint-activations``), the behaviour before these keys existed. Megatron-LM
requires both keys with full recomputation and refuses them with selective; here an unset method keeps
the old default and a set one needs both. Groups of ``uniform`` must tile the chunk: Megatron-Core's
``custom(start, start + N)`` indexes past the chunk's last layer otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

RECOMPUTE_METHODS = ("uniform", "block")
"""Megatron-LM's ``--recompute-method`` values."""


def check_recompute_keys(granularity: str, method: str | None, num_layers: int | None, *,
                         zero_impl: str = "megatron") -> None:
    """Types, values and combinations of ``recompute_method`` / ``recompute_num_layers`` (no model needed).

    Raises:
        ValueError: one line naming the key and the allowed values.
    """
    if method is not None and not isinstance(method, str):
        raise ValueError(f"recompute_method must be a string, got {method!r}")
    if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool)):
        raise ValueError(f"recompute_num_layers must be an integer, got {num_layers!r}")
    if method is None and num_layers is None:
        return
    if method is not None and method not in RECOMPUTE_METHODS:
        raise ValueError(f"recompute_method: unknown value {method!r}; allowed: {', '.join(RECOMPUTE_METHODS)}")
    if granularity != "full":
        raise ValueError(f"recompute_method / recompute_num_layers need recompute_granularity = 'full' "
                         f"(Megatron-LM's --recompute-method), got recompute_granularity = {granularity!r}")
    if method is None or num_layers is None:
        missing = "recompute_method (uniform or block)" if method is None else "recompute_num_layers"
        raise ValueError(f"recompute_method and recompute_num_layers go together (as Megatron-LM's flags); "
                         f"{missing} is not set")
    if num_layers < (1 if method == "uniform" else 0):
        raise ValueError(f"recompute_num_layers must be >= {1 if method == 'uniform' else 0} with "
                         f"recompute_method = {method!r}, got {num_layers}")
    if zero_impl == "deepspeed" and (method, num_layers) != ("uniform", 1):
        raise ValueError(f"recompute_method = {method!r} with recompute_num_layers = {num_layers} is not modelled "
                         f"with zero_impl = 'deepspeed' (every layer is checkpointed there); unset both")


def check_chunks(method: str | None, num_layers: int | None, chunk_layers: Sequence[int]) -> None:
    """``recompute_num_layers`` against the layers of each model chunk (``ParallelConfig.stage_layers``).

    Raises:
        ValueError: ``block`` asks for more layers than the largest chunk holds, or ``uniform`` groups
            do not tile every chunk.
    """
    if method is None or num_layers is None:
        return
    if method == "block" and num_layers > max(chunk_layers):
        most = max(chunk_layers)
        raise ValueError(f"recompute_num_layers={num_layers} with recompute_method = 'block': a pipeline stage "
                         f"(per virtual chunk) has at most {most} layer{'s' if most != 1 else ''}; allowed: 0 to "
                         f"{most}")
    bad = sorted({n for n in chunk_layers if n % num_layers}) if method == "uniform" else []
    if bad:
        raise ValueError(f"recompute_num_layers={num_layers} with recompute_method = 'uniform' must divide the "
                         f"layers of every pipeline stage (per virtual chunk): {', '.join(map(str, bad))} "
                         f"is not a multiple")


def checkpoints(method: str | None, num_layers: int | None, chunk_layers: int) -> list[range]:
    """The checkpointed groups of one model chunk of ``chunk_layers`` layers, as local layer indices
    (module docstring): each group stores its input and re-runs its forward before its backward.
    ``method`` unset: one group per layer."""
    if method is None or num_layers is None:
        return [range(i, i + 1) for i in range(chunk_layers)]
    if method == "block":
        return [range(i, i + 1) for i in range(min(num_layers, chunk_layers))]
    return [range(i, min(i + num_layers, chunk_layers)) for i in range(0, chunk_layers, num_layers)]


def recomputed_layers(method: str | None, num_layers: int | None, chunk_layers: Sequence[int]) -> int:
    """Layers whose forward is re-run, over ``chunk_layers`` (one entry per model chunk)."""
    return sum(sum(len(g) for g in checkpoints(method, num_layers, n)) for n in chunk_layers)


def stage_chunks(stage_layers: Sequence[int] | None, pp: int, vpp: int, stage: int, layers: int) -> list[int]:
    """Layers of each model chunk of pipeline ``stage``: from ``stage_layers`` (``pp x vpp`` entries in
    Megatron's order, chunk ``c`` of stage ``i`` at ``c*pp + i``), else one chunk of ``layers``."""
    return [stage_layers[c * pp + stage] for c in range(vpp)] if stage_layers else [layers]


def stored_activations(method: str | None, num_layers: int | None, chunk_layers: Sequence[int], *,
                       full_layer_bytes: float, input_bytes: float) -> tuple[float, float]:
    """(bytes stored per micro-batch, recompute workspace bytes) of a stage's chunks under full recomputation.

    A checkpointed group stores its input (``input_bytes``, Korthikanti et al. 2022 Table 2's ``2sbh``);
    a layer outside every group stores ``full_layer_bytes`` (its activations without recomputation). At
    a group's backward its ``n`` layers are re-materialised at once: ``n x full_layer_bytes`` beyond
    nothing, i.e. ``n x full_layer_bytes - input_bytes`` beyond the stored input (the workspace, the
    largest group's; one backward runs at a time). One layer per group gives Table 2's full figure.
    """
    stored = 0.0
    largest = 0
    for n in chunk_layers:
        groups = checkpoints(method, num_layers, n)
        covered = sum(len(g) for g in groups)
        stored += len(groups) * input_bytes + (n - covered) * full_layer_bytes
        largest = max([largest, *(len(g) for g in groups)])
    workspace = largest * full_layer_bytes - input_bytes if largest else 0.0
    return stored, workspace


def rerun_before_backward(method: str | None, num_layers: int | None, layers: Sequence[int]) -> dict[int, list[int]]:
    """For one model chunk's layers (global indices, forward order): layer -> the layers whose forward is
    re-run just before its backward. A group is re-run, in forward order, before the backward of its last
    layer (the first of the group that the backward reaches); layers outside every group re-run nothing."""
    return {layers[g[-1]]: [layers[i] for i in g] for g in checkpoints(method, num_layers, len(layers))}


def not_recomputed(method: str | None, num_layers: int | None, chunk_layers: Sequence[int]) -> set[int]:
    """Global indices of the layers outside every checkpoint, over the chunks in layer order."""
    out: set[int] = set()
    start = 0
    for n in chunk_layers:
        covered = {i for g in checkpoints(method, num_layers, n) for i in g}
        out.update(start + i for i in range(n) if i not in covered)
        start += n
    return out


def recompute_label(method: str | None, num_layers: int | None) -> str:
    """``full``, or e.g. ``full (block, 3 layers)``, for reports."""
    if method is None or num_layers is None:
        return "full"
    return f"full ({method}, {num_layers} layer{'s' if num_layers != 1 else ''})"


__all__ = ["RECOMPUTE_METHODS", "check_chunks", "check_recompute_keys", "checkpoints", "not_recomputed",
           "recompute_label", "recomputed_layers", "rerun_before_backward", "stage_chunks",
           "stored_activations"]
