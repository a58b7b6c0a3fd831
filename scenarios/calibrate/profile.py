"""Write a calibration profile (TOML), atomically: the fitted values in the shipped file's layout
(:mod:`hwmodel.calibration_overlay` reads them back), the rows they were fitted to and the residuals.

Only what this module needs of TOML is written: tables, arrays of tables, strings, numbers, booleans and
flat arrays of them. The file is written to a temporary file beside the target and renamed over it, so
an error leaves no half-written profile.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else '"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} to a profile")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to a profile")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def dumps(doc: Mapping[str, Any], _prefix: str = "") -> str:
    """``doc`` as TOML text."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items()
             if not isinstance(v, Mapping) and not _is_table_array(v)]
    out = "\n".join(lines) + ("\n" if lines else "")
    for k, v in doc.items():
        name = f"{_prefix}.{_key(k)}" if _prefix else _key(k)
        if isinstance(v, Mapping):
            scalars = any(not isinstance(x, Mapping) and not _is_table_array(x) for x in v.values())
            body = dumps(v, name)
            if scalars or not v:
                out += f"\n[{name}]\n" + body
            else:
                out += body
        elif _is_table_array(v):
            for row in v:
                out += f"\n[[{name}]]\n" + dumps(row, name)
    return out


def nested(values: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    """``{("gpu", "V100-SXM2", "launch_overhead_s"): x}`` -> nested tables."""
    out: dict[str, Any] = {}
    for path, value in values.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


def write_profile(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write ``doc`` as TOML to ``path`` atomically (temporary file + rename).

    Raises:
        ValueError: the folder cannot be written (one line).
    """
    target = Path(path)
    text = "# Calibration profile written by `trainsim calibrate`; apply it with --calibration or\n" \
           "# [simulation] calibration. Model sections merge over the shipped calibration.toml.\n" + dumps(doc)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".toml", dir=target.parent)
    except OSError as exc:
        raise ValueError(f"--output {target}: cannot write in {target.parent} ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
