"""Which module an op runs in: a :class:`ModuleTracker` with a well-defined innermost module."""

from __future__ import annotations

from collections import defaultdict

from torch.utils.module_tracker import ModuleTracker


class Tracker(ModuleTracker):
    """A :class:`ModuleTracker` that also dates each entry into a module (``entered``: path -> the
    number of recorded ops before its latest entry), so that the module an op runs in is well defined.

    ``ModuleTracker.parents`` is a set. In forward the innermost module is also the longest path, but
    in backward modules are entered by gradient hooks and some are never left: a module whose inputs
    need no gradient (an embedding, fed integer indices) stays in the set after its backward. With
    ``x = wte(idx) + wpe(pos)`` both embeddings are then entered when their backward kernels run, two
    paths of equal length, and a longest-path rule picks one by set order (by the hash seed). The
    hooks run just before the autograd node of the module's output executes (a tensor hook is a
    pre-hook on its ``grad_fn``, ``torch/csrc/autograd/engine.cpp``), so the module entered last is the
    one whose backward is running; modules entered with no op in between (a block and its last child
    share one output tensor) are ranked by depth. A module whose backward is an identity (its output
    is its input, e.g. dropout with p = 0) is left before it is entered; such an entry is dropped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.entered: dict[str, int] = {}
        self.ops = 0
        """Recorded ops so far (the recorder counts them)."""
        self._early_exits: dict[str, int] = defaultdict(int)

    def _get_append_fn(self, name, is_bw):
        fn = super()._get_append_fn(name, is_bw)

        def append(*args) -> None:
            if is_bw and self._early_exits[name] > 0:  # identity backward: already left
                self._early_exits[name] -= 1
                return
            fn(*args)
            self.entered[name] = self.ops

        return append

    def _get_pop_fn(self, name, is_bw):
        fn = super()._get_pop_fn(name, is_bw)

        def pop(*args) -> None:
            if is_bw and name not in self.parents:
                self._early_exits[name] += 1
                return
            fn(*args)

        return pop

    def innermost(self) -> str:
        """The module path the next op runs in (``""``: none but ``"Global"``)."""
        return max((p for p in self.parents if p != "Global"),
                   key=lambda p: (self.entered.get(p, -1), p.count("."), len(p), p), default="")
