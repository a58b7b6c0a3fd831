"""NCCL tuner-plugin rules: replay a cluster's algorithm/protocol/channel choices per message size.

Production clusters often do not run NCCL's built-in tuning model: a *tuner plugin*
(``NCCL_TUNER_PLUGIN``) overrides the choice per collective and size. NCCL ships an example plugin
that reads a CSV file (``plugins/tuner/example``, NCCL 2.30.7; ``NCCL_TUNER_CONFIG_FILE``), one rule per
line::

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
    allreduce,8388608,268435456,tree,simple,-1,1,-1

This module reads that same format, so a file written for the real plugin drives the simulator, and
a user who knows what their NCCL picked (an ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`` log) can
replay it. Semantics follow the plugin's ``pluginGetCollInfo``:

* rules are tried in file order; the first one whose collective, inclusive byte range ``[min, max]``,
  ``nNodes``, ``nRanks``, ``numPipeOps`` and ``regBuff`` match (``-1`` = any) wins, *if* its
  (algorithm, protocol) is available on the communicator; an unavailable pair is skipped and the
  search goes on (the plugin: "combination ... is marked as IGNORE");
* ``channels`` > 0 sets the channels launched (clamped to the communicator's channels); ``-1`` keeps
  NCCL's size-based count. (The example plugin's C code initialises the output to 1 channel before
  matching; we follow its documented meaning, "-1 to keep NCCL's default".)
* no matching rule: NCCL's own model decides.

Algorithms NCCL knows but trainsim does not model (``collnet_direct``, ``collnet_chain``) are accepted in
the file and treated as unavailable, as on a system without the hardware for them. A rule naming a
modelled algorithm (the registry, :mod:`hwmodel.nccl.algorithms`) applies where that algorithm is
available and is skipped elsewhere: ``nvls_tree`` on multi-node all-reduces on NVSwitch gen3+
(Hopper/Blackwell) clusters, ``pat`` on all-gather/reduce-scatter with one GPU per node.
Unlike the C plugin, which silently skips malformed lines, a malformed line raises
:class:`TunerConfigError` naming the line and the field.

``n_bytes`` is NCCL's ``nBytes`` (per-rank buffer for all-reduce/broadcast/reduce, the gathered buffer
for all-gather/reduce-scatter), the size nccl-tests prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hwmodel.nccl.algorithms import ALGORITHMS

__all__ = ["COLLECTIVE_NAMES", "TunerConfig", "TunerConfigError", "TunerRule", "load_tuner_config",
           "parse_tuner_config"]

COLLECTIVE_NAMES: dict[str, str] = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce",
}
"""The plugin's collective names (``parseCollType``) -> trainsim's collective names."""

ALGORITHM_NAMES: tuple[str, ...] = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree",
                                    "pat")
"""Algorithms the plugin's file may name (``parseAlgorithm``), in ``NCCL_ALGO_*`` order."""

MODELLED_ALGORITHMS: frozenset[str] = frozenset(ALGORITHMS)
"""The subset trainsim simulates (the registry); rules naming the others never apply."""

PROTOCOL_NAMES: tuple[str, ...] = ("ll", "ll128", "simple")
"""Protocols the file may name (``parseProtocol``)."""

_FIELDS = ("collective_type", "min_bytes", "max_bytes", "algorithm", "protocol", "channels", "nNodes",
           "nRanks", "numPipeOps", "regBuff")


class TunerConfigError(ValueError):
    """A tuner configuration line is malformed (names the source, line and field)."""


@dataclass(frozen=True, slots=True)
class TunerRule:
    """One line of the file. ``-1`` in ``channels``, ``n_nodes``, ``n_ranks``, ``num_pipe_ops`` and
    ``reg_buff`` means "any" (``channels``: NCCL's default)."""

    collective: str
    """trainsim collective name (``all_reduce`` ...)."""
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int = -1
    n_nodes: int = -1
    n_ranks: int = -1
    num_pipe_ops: int = -1
    reg_buff: int = -1
    line: int = 0
    """1-based line number in the source, for messages."""
    source: str = "<text>"
    """The file it came from."""

    @property
    def where(self) -> str:
        """``file:line``."""
        return f"{self.source}:{self.line}"

    def matches(self, collective: str, n_bytes: int, n_nodes: int, n_ranks: int, num_pipe_ops: int = 1,
                reg_buff: bool = False) -> bool:
        """True when every field matches (``-1`` fields match anything), as ``pluginGetCollInfo``."""
        return (self.collective == collective and self.min_bytes <= n_bytes <= self.max_bytes
                and self.n_nodes in (-1, n_nodes) and self.n_ranks in (-1, n_ranks)
                and self.num_pipe_ops in (-1, num_pipe_ops) and self.reg_buff in (-1, int(reg_buff)))

    def to_line(self) -> str:
        """The rule in the plugin's CSV format."""
        inv = {v: k for k, v in COLLECTIVE_NAMES.items()}
        return ",".join(str(x) for x in (inv[self.collective], self.min_bytes, self.max_bytes, self.algorithm,
                                         self.protocol, self.channels, self.n_nodes, self.n_ranks,
                                         self.num_pipe_ops, self.reg_buff))


@dataclass(frozen=True, slots=True)
class TunerConfig:
    """An ordered list of :class:`TunerRule` (first match wins)."""

    rules: tuple[TunerRule, ...]
    source: str = "<text>"

    def candidates(self, collective: str, n_bytes: int, n_nodes: int, n_ranks: int, num_pipe_ops: int = 1,
                   reg_buff: bool = False) -> list[TunerRule]:
        """Matching rules in file order; the caller takes the first whose pair is available."""
        return [r for r in self.rules if r.matches(collective, n_bytes, n_nodes, n_ranks, num_pipe_ops, reg_buff)]

    def __len__(self) -> int:
        return len(self.rules)


def _int(text: str, field: str, where: str, *, minimum: int | None = None) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise TunerConfigError(f"{where}: {field} must be an integer, got {text!r}") from None
    if minimum is not None and value < minimum and value != -1:
        raise TunerConfigError(f"{where}: {field} must be -1 (any/default) or >= {minimum}, got {value}")
    return value


def parse_tuner_config(text: str, source: str = "<text>") -> TunerConfig:
    """Parse the example tuner plugin's CSV format (see the module docstring).

    ``#`` starts a comment (whole line or trailing); blank lines are ignored; fields are trimmed; names
    are case-insensitive.

    Raises:
        TunerConfigError: a line with fewer than 8 or more than 10 fields, an unknown collective,
            algorithm or protocol (the message lists the allowed names), a non-integer number,
            ``min_bytes > max_bytes``, or ``channels``/``nNodes``/``nRanks`` that are neither -1 nor >= 1.
    """
    rules = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        parts = [p.strip() for p in line.split(",")]
        if not 8 <= len(parts) <= 10:
            raise TunerConfigError(f"{where}: expected 8 to 10 comma-separated fields "
                                   f"({','.join(_FIELDS)}), got {len(parts)}")
        coll_name, algo, proto = parts[0].lower(), parts[3].lower(), parts[4].lower()
        if coll_name not in COLLECTIVE_NAMES:
            raise TunerConfigError(f"{where}: collective_type {parts[0]!r} unknown; allowed: "
                                   f"{', '.join(COLLECTIVE_NAMES)}")
        if algo not in ALGORITHM_NAMES:
            raise TunerConfigError(f"{where}: algorithm {parts[3]!r} unknown; allowed: {', '.join(ALGORITHM_NAMES)}")
        if proto not in PROTOCOL_NAMES:
            raise TunerConfigError(f"{where}: protocol {parts[4]!r} unknown; allowed: {', '.join(PROTOCOL_NAMES)}")
        lo = _int(parts[1], "min_bytes", where, minimum=0)
        hi = _int(parts[2], "max_bytes", where, minimum=0)
        if lo < 0 or hi < 0 or lo > hi:
            raise TunerConfigError(f"{where}: need 0 <= min_bytes <= max_bytes, got {lo}..{hi}")
        extra = [_int(parts[i], _FIELDS[i], where, minimum=1 if i < 9 else 0) for i in range(5, len(parts))]
        extra += [-1] * (5 - len(extra))
        channels, n_nodes, n_ranks, pipe_ops, reg = extra
        if reg not in (-1, 0, 1):
            raise TunerConfigError(f"{where}: regBuff must be -1, 0 or 1, got {reg}")
        rules.append(TunerRule(COLLECTIVE_NAMES[coll_name], lo, hi, algo, proto, channels, n_nodes, n_ranks,
                               pipe_ops, reg, lineno, source))
    return TunerConfig(tuple(rules), source)


def load_tuner_config(path: str | Path) -> TunerConfig:
    """Read a tuner configuration file (``NCCL_TUNER_CONFIG_FILE`` format).

    Raises:
        TunerConfigError: the file cannot be read, or a line is malformed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TunerConfigError(f"NCCL tuner config {str(p)!r}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise TunerConfigError(f"NCCL tuner config {str(p)!r}: not UTF-8 text (byte {exc.start})") from None
    return parse_tuner_config(text, str(p))
