"""The registry of NCCL collective algorithms: the one place that names them.

:data:`ALGORITHMS` maps trainsim's name to the :class:`~hwmodel.nccl.algorithms.base.Algorithm`
object, in NCCL's ``NCCL_ALGO_*`` order (Tree 0, Ring 1, NVLS 4, NVLSTree 5, PAT 6; CollNet Direct/Chain
2/3 need a SHARP plugin and are not modelled). The tuner iterates over it (ties go to the earlier
entry, as ``topoGetAlgoInfo``'s strict ``<``); the engine and the tuner-plugin rules ask the objects.
:data:`P2P` is the send/recv and all-to-all "algorithm", which NCCL's model does not price.

A new algorithm is one module with an ``Algorithm`` subclass plus one line here.
"""

from __future__ import annotations

from hwmodel.nccl.algorithms.base import Algorithm, Flow
from hwmodel.nccl.algorithms.nvls import Nvls
from hwmodel.nccl.algorithms.nvls_tree import NvlsTree
from hwmodel.nccl.algorithms.p2p import PointToPoint
from hwmodel.nccl.algorithms.pat import Pat
from hwmodel.nccl.algorithms.ring import Ring
from hwmodel.nccl.algorithms.tree import Tree

__all__ = ["ALGORITHMS", "ALIASES", "P2P", "Algorithm", "Flow", "get"]

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (Tree(), Ring(), Nvls(), NvlsTree(), Pat())}
"""Tuned collective algorithms, name -> object, in NCCL's algorithm order."""

P2P: Algorithm = PointToPoint()
"""Send/recv and all-to-all."""

ALIASES: dict[str, str] = {alias: a.name for a in ALGORITHMS.values() for alias in a.aliases}
"""Other spellings -> trainsim's name (NCCL's ``NVLSTree`` token is ``nvls_tree``)."""


def get(name: str) -> Algorithm:
    """The algorithm object for ``name`` (any spelling; ``p2p`` included).

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key == P2P.name:
        return P2P
    algo = ALGORITHMS.get(key)
    if algo is None:
        raise ValueError(f"unknown NCCL algorithm {name!r}; allowed: {', '.join(ALGORITHMS)}")
    return algo
