"""A user's calibration profile, applied on top of the shipped ``hwmodel/data/calibration.toml``.

A profile (written by ``trainsim calibrate``) is a TOML file with the shipped file's layout for what it
changes -- ``[default]``, ``[architecture.<arch>]``, ``[gpu."<name>"]`` and ``[nccl]`` sections, merged key
by key over the shipped values -- plus a ``[profile]`` table naming it, and tables of the rows the values
were fitted to (``[fit]``, ``[[rows]]``, ``[[unmatched]]``), which the model ignores.

One profile is *active* per process (:func:`activate`, :func:`applied`): :meth:`Calibration.load` with no
path and the NCCL constants (:mod:`hwmodel.nccl.calibration`) read the shipped file merged with it. With no
profile active nothing changes, byte for byte.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from hwmodel.calibration_schema import check_profile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MODEL_SECTIONS = ("default", "architecture", "gpu", "nccl")
"""Sections of a profile that change the model (merged over the shipped calibration)."""


METADATA_KEYS = frozenset({"collective", "ranks", "nodes", "log2_size_bytes", "fidelity", "line_rate_Bps",
                           "host_fit_gpus", "source", "sources", "fitted"})
"""Leaves of a model section that say what a constant refers to, not constants: a busbw correction's
communicator shape, knots and fidelity (its constants are its ``factor`` list), the NVLink line rate the
fitted ``busbw_Bps`` is a fraction of (the GPU's spec), the GPU count of the host enqueue fit, and the
documentation keys (:class:`hwmodel.costmodel.Calibration`). :attr:`Overlay.changed` leaves them out."""


@dataclass(frozen=True, eq=False)
class Overlay:
    """A loaded profile (compared and hashed by identity: the NCCL constants are cached per profile)."""

    path: str
    """The file it was read from."""
    name: str
    """``[profile] name`` (the file name if none)."""
    sections: Mapping[str, Any]
    """Its model sections (:data:`MODEL_SECTIONS`), as parsed."""
    changed: tuple[str, ...]
    """Dotted paths of the constants it sets, e.g. ``gpu.V100-SXM2.launch_overhead_s`` (not the
    :data:`METADATA_KEYS`)."""

    def applying_to(self, gpu_name: str, arch: str) -> tuple[str, ...]:
        """The :attr:`changed` paths that can move a run on GPU ``gpu_name`` of architecture ``arch``
        (``volta``, ``ampere``, ...): ``default`` and ``nccl`` ones, its architecture's and its GPU's; a
        ``[gpu."<other>"]``, ``[architecture.<other>]``, ``nccl.nvlink_efficiency.<other>`` or
        ``nccl.busbw_correction.<other>`` key does not, nor a ``[default]`` key that the GPU's architecture
        or name section sets (in the shipped calibration or the profile): the more specific value wins
        (:meth:`hwmodel.costmodel.Calibration.for_gpu`)."""
        own = {"gpu": gpu_name, "architecture": arch.lower()}
        specific = [_section(self.sections, "architecture", arch.lower()), _section(self.sections, "gpu", gpu_name),
                    _section(_shipped(), "architecture", arch.lower()), _section(_shipped(), "gpu", gpu_name)]

        def applies(path: str) -> bool:
            section, _, rest = path.partition(".")
            if section in own:
                key = rest[: len(own[section])]
                return (key.lower() if section == "architecture" else key) == own[section] and \
                    rest[len(own[section]):].startswith(".")
            if path.startswith(("nccl.nvlink_efficiency.", "nccl.busbw_correction.")):
                return path.split(".")[2].lower() == arch.lower()
            if section == "default":
                return not any(_has(table, rest.split(".")) for table in specific)
            return True

        return tuple(p for p in self.changed if applies(p))


def _section(data: Mapping[str, Any], kind: str, name: str) -> Mapping[str, Any]:
    """``data[kind][name]`` (architecture names compared in lower case), or an empty table."""
    table = data.get(kind, {})
    if kind == "architecture":
        table = {str(k).lower(): v for k, v in table.items()}
    found = table.get(name, {})
    return found if isinstance(found, Mapping) else {}


def _has(table: Mapping[str, Any], keys: list[str]) -> bool:
    """Whether the dotted ``keys`` lead to a value in ``table``."""
    for k in keys:
        if not isinstance(table, Mapping) or k not in table:
            return False
        table = table[k]
    return True


@cache
def _shipped() -> Mapping[str, Any]:
    """The shipped calibration.toml, read once."""
    from hwmodel.costmodel import DEFAULT_CALIBRATION_PATH

    with DEFAULT_CALIBRATION_PATH.open("rb") as f:
        return tomllib.load(f)


def _leaves(table: Mapping[str, Any], prefix: str) -> list[str]:
    out: list[str] = []
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.extend(_leaves(value, path))
        else:
            out.append(path)
    return out


def load_overlay(path: str | Path) -> Overlay:
    """Read a calibration profile.

    Raises:
        ValueError: one line naming the file and what is wrong (unreadable, not TOML, no ``[profile]``
            table, a model section that is not a table, a key a profile cannot set or a value out of its
            range: :func:`hwmodel.calibration_schema.check_profile`).
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"calibration profile {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"calibration profile {p}: cannot read it ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"calibration profile {p}: not valid TOML ({exc})") from None
    meta = data.get("profile")
    if not isinstance(meta, Mapping):
        raise ValueError(f"calibration profile {p}: no [profile] table (write one with `trainsim calibrate`)")
    sections: dict[str, Any] = {}
    for key in MODEL_SECTIONS:
        if key in data:
            if not isinstance(data[key], Mapping):
                raise ValueError(f"calibration profile {p}: [{key}] must be a table")
            sections[key] = data[key]
    try:  # every key and value, before any of them reaches the model
        check_profile(data, MODEL_SECTIONS)
    except ValueError as exc:
        raise ValueError(f"calibration profile {p}: {exc}") from None
    constants = tuple(leaf for leaf in _leaves(sections, "") if leaf.rsplit(".", 1)[-1] not in METADATA_KEYS)
    return Overlay(str(p), str(meta.get("name", p.stem)), sections, constants)


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, table by table (``over`` wins on leaves)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


_ACTIVE: Overlay | None = None


def active() -> Overlay | None:
    """The active profile, ``None`` when only the shipped calibration is in use."""
    return _ACTIVE


def activate(overlay: Overlay | None) -> None:
    """Make ``overlay`` the active profile (``None``: the shipped calibration alone)."""
    global _ACTIVE
    _ACTIVE = overlay


@contextmanager
def applied(overlay: Overlay | None) -> Iterator[Overlay | None]:
    """Activate ``overlay`` for the duration of a ``with`` block, then restore the previous one."""
    before = _ACTIVE
    activate(overlay)
    try:
        yield overlay
    finally:
        activate(before)


def overlaid(shipped: Mapping[str, Any]) -> Mapping[str, Any]:
    """The shipped calibration data with the active profile merged in (``shipped`` itself if none)."""
    if _ACTIVE is None:
        return shipped
    return merge(shipped, _ACTIVE.sections)
