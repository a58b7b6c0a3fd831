"""What an FP8 recipe is, and the registry of recipes (``[training] fp8_recipe``).

A recipe says which quantisation kernels run before the FP8 GEMMs of a Linear layer (per operand: the
forward input ``X``, the backward output gradient ``dY``, the weight ``W``), how its GEMMs are priced
(:attr:`hwmodel.ir.Compute.fp8_scaling`), where it runs, and what it does to communication (FP8
sequence-parallel all-gathers, amax all-reduces, FP8 parameter all-gathers). Adding a recipe is one module
defining an :class:`Fp8Recipe` and one :func:`register` line in :mod:`workload.fp8`.

Kernel bytes are HBM bytes per element of the operand (bf16 in, 1-byte FP8 out), as the recipe's
framework runs them; each recipe module gives its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodel.ir import Compute


@dataclass(frozen=True)
class QuantKernel:
    """One quantisation kernel over an operand of ``n`` elements."""

    name: str
    """Kernel name (as a profiler would show it)."""
    kind: str
    """``elementwise`` (a cast) or ``reduction`` (an amax pass); both memory-bound."""
    bytes_per_element: float
    """HBM bytes read and written per operand element (B)."""
    copies: int = 1
    """FP8 copies written (each ``n`` elements): 2 for a cast-transpose, 0 for an amax pass."""

    def compute(self, n: int, *, layer: str, phase: str) -> Compute:
        """This kernel over ``n`` elements as an IR kernel (no FLOPs: memory-bound)."""
        return Compute(self.name, self.kind, 0.0, float(self.bytes_per_element * n), dtype="bf16",
                       layer=layer, phase=phase)


TP_GATHER_MODES = ("always", "overlap", "never")


@dataclass(frozen=True)
class Fp8Recipe:
    """An FP8 training recipe (see the module docstring); the built-in ones are in :data:`RECIPES`."""

    name: str
    """The ``[training] fp8_recipe`` value."""
    summary: str
    """One line: the framework flag it stands for."""
    activation: tuple[QuantKernel, ...]
    """Kernels over each forward FP8 GEMM's input ``X`` (``b*m*k`` elements)."""
    gradient: tuple[QuantKernel, ...]
    """Kernels over each FP8 module's output gradient ``dY`` (shared by dgrad and wgrad)."""
    weight: tuple[QuantKernel, ...]
    """Kernels over a layer's FP8 weights, once per iteration (every pass under ZeRO-3/FSDP)."""
    gemm_scaling: str = ""
    """:attr:`hwmodel.ir.Compute.fp8_scaling` of its GEMMs (``""``: per-tensor cuBLAS FP8 GEMM)."""
    architectures: tuple[str, ...] = ()
    """GPU architectures (lower case) it runs on; ``()``: every GPU with FP8 tensor cores."""
    tp_gather: str = "never"
    """Whether a sequence-parallel all-gather feeding an FP8 GEMM moves FP8, the cast running on the local
    shard before it: ``always``, ``overlap`` (only under ``tp_comm_overlap`` / ``async_tp``), ``never``."""
    shard_amax_all_reduce: bool = False
    """A per-tensor scale computed on a shard needs the whole tensor's amax: one 4-byte fp32 all-reduce
    over the group before the cast (the TP group before an FP8 all-gather)."""
    param_gather: bool = False
    """Whether ``fp8_param_gather`` (FP8 parameter all-gathers) exists for this recipe."""
    gather_bytes_per_element: float = 1.0
    """Bytes per element of an FP8 all-gather (data plus scales)."""
    fp8_saved_state: bool = True
    """Memory as Transformer Engine keeps it (:mod:`workload.memory` with ``fp8=True``: FP8 weight copies,
    FP8-GEMM inputs saved in FP8); ``False``: as torchao's ``Float8Linear``, which saves the bf16 input
    and weight for backward and re-casts them there, holding no FP8 copy between passes (bf16 memory)."""

    def kernels(self, operand: str, n: int, *, layer: str, phase: str) -> list[Compute]:
        """The quantisation kernels over ``n`` elements of ``operand`` (``activation``, ``gradient``,
        ``weight``) as IR kernels."""
        return [k.compute(n, layer=layer, phase=phase) for k in getattr(self, operand)]

    def gathers_fp8(self, overlap: bool) -> bool:
        """Whether sequence-parallel all-gathers move FP8 (``overlap``: TP communication overlap is on)."""
        return self.tp_gather == "always" or self.tp_gather == "overlap" and overlap


RECIPES: dict[str, Fp8Recipe] = {}
"""Recipes by name, in registration order (error messages list them so)."""
DEFAULT_RECIPE = "delayed"


def register(recipe: Fp8Recipe) -> Fp8Recipe:
    """Add ``recipe`` to :data:`RECIPES`.

    Raises:
        ValueError: a recipe of that name exists, or ``tp_gather`` is not one of :data:`TP_GATHER_MODES`.
    """
    if recipe.name in RECIPES:
        raise ValueError(f"FP8 recipe {recipe.name!r} is already registered")
    if recipe.tp_gather not in TP_GATHER_MODES:
        raise ValueError(f"FP8 recipe {recipe.name!r}: tp_gather {recipe.tp_gather!r}; "
                         f"allowed: {', '.join(TP_GATHER_MODES)}")
    RECIPES[recipe.name] = recipe
    return recipe


def get_recipe(name: str) -> Fp8Recipe:
    """The recipe called ``name``.

    Raises:
        ValueError: one line naming the key and the allowed recipes.
    """
    if not isinstance(name, str) or name not in RECIPES:
        raise ValueError(f"[training] fp8_recipe: unknown {name!r}; allowed: {', '.join(RECIPES)}")
    return RECIPES[name]


def check_recipe_gpu(name: str, gpu_name: str, architecture: str) -> None:
    """Whether recipe ``name`` runs on a GPU of ``architecture`` (lower case).

    Raises:
        ValueError: one line naming the key, the recipe, the GPU and where the recipe runs.
    """
    recipe = get_recipe(name)
    if recipe.architectures and architecture not in recipe.architectures:
        raise ValueError(f"[training] fp8_recipe {name!r} needs a {' or '.join(recipe.architectures)} GPU "
                         f"({recipe.summary}); {gpu_name} is {architecture or 'of unknown architecture'}")


__all__ = ["DEFAULT_RECIPE", "RECIPES", "TP_GATHER_MODES", "Fp8Recipe", "QuantKernel", "check_recipe_gpu",
           "get_recipe", "register"]
