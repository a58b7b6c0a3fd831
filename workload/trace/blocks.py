"""Layer dedup: finding the repeated blocks of a model and tracing a copy that holds only the first.

The copy is made by rewriting ``_modules`` of shallow copies along the path to the block container,
so the user's model keeps all its blocks and no parameter is copied.
"""

from __future__ import annotations

import copy

from torch import nn


def _block_signature(block: nn.Module) -> tuple:
    return (type(block),
            tuple((n, tuple(p.shape), p.dtype) for n, p in block.named_parameters()),
            tuple((n, tuple(b.shape), b.dtype) for n, b in block.named_buffers()),
            tuple(type(m).__name__ for m in block.modules()))


def submodule(model: nn.Module, path: str) -> nn.Module | None:
    """``model.get_submodule(path)`` (``""``: the model itself), or ``None`` if there is none."""
    if not path:
        return model
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def block_path(attr: str, name: str | int) -> str:
    """Module path of child ``name`` of the block container ``attr`` (``""``: the model's own children)."""
    return f"{attr}.{name}" if attr else str(name)


def repeated_blocks(model: nn.Module, attr: str) -> nn.ModuleList | nn.Sequential | None:
    """The container at ``attr`` if it is an ``nn.ModuleList``/``nn.Sequential`` of identical blocks named
    ``0, 1, ...`` (what layer dedup can clone), else ``None``."""
    blocks = submodule(model, attr)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)) or len(blocks) < 1:
        return None
    if list(blocks._modules) != [str(i) for i in range(len(blocks))]:
        return None
    sig = _block_signature(blocks[0])
    return blocks if all(_block_signature(b) == sig for b in blocks) else None


def one_block_copy(model: nn.Module, attr: str) -> nn.Module:
    """A shallow copy of ``model`` whose container at ``attr`` holds only its first block (shared); the
    modules on the path to it are shallow-copied too, so the original keeps all its blocks."""
    def replaced(mod: nn.Module, parts: list[str]) -> nn.Module:
        reduced = copy.copy(mod)
        if not parts:  # the container itself
            reduced._modules = {"0": mod._modules["0"]}
            return reduced
        reduced._modules = dict(mod._modules)
        child = mod._modules[parts[0]]
        assert child is not None  # ``attr`` names a path of modules (repeated_blocks found it)
        reduced._modules[parts[0]] = replaced(child, parts[1:])
        return reduced

    return replaced(model, attr.split(".") if attr else [])


def child_name(layer: str, attr: str) -> str | None:
    """The container child a module path lies in (``"blocks.3.attn"`` -> ``"3"`` for attr ``blocks``)."""
    if attr:
        if not layer.startswith(attr + "."):
            return None
        layer = layer[len(attr) + 1:]
    return layer.split(".")[0] or None
