"""User code named by a scenario: ``"package.module:factory"`` and ``"path/to/file.py:factory"`` specs.

Input handling for ``[model] factory`` (:mod:`scenarios.runner`): resolve the spec to a callable, or
fail with a one-line :class:`FactoryError` naming the spec and what is wrong.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FactoryError", "load_factory"]


class FactoryError(ValueError):
    """A ``"package.module:factory"`` string is malformed or does not resolve to a callable."""


def load_factory(spec: str, base_dir: str | Path | None = None) -> Callable[..., Any]:
    """Resolve ``"package.module:factory"`` (``factory`` may be dotted: ``"pkg.mod:Class.build"``), or
    ``"path/to/file.py:factory"``: a Python file, a relative path taken from ``base_dir`` (default: the
    working directory).

    Raises:
        FactoryError: malformed string, module or file not importable, attribute missing or not callable.
    """
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise FactoryError(f"bad factory spec {spec!r}: expected 'package.module:factory' or "
                           f"'path/to/file.py:factory', e.g. 'workload.zoo:build_model'")
    mod_name, attr_path = spec.split(":")
    if mod_name.endswith(".py"):
        obj: Any = _load_file(mod_name, spec, base_dir)
    else:
        try:
            obj = importlib.import_module(mod_name)
        except ImportError as e:
            raise FactoryError(f"cannot import module {mod_name!r} of factory spec {spec!r}: {e}") from e
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_"))[:20]
            raise FactoryError(f"{getattr(obj, '__name__', obj)!r} has no attribute {part!r} "
                               f"(factory spec {spec!r}); available: {', '.join(public)}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryError(f"{spec!r} resolves to a {type(obj).__name__}, which is not callable")
    return obj


def _load_file(file: str, spec: str, base_dir: str | Path | None) -> Any:
    """Execute a Python file as a module, registered in ``sys.modules`` under a name unique to its path
    (as ``importlib``'s recipe does: dataclasses and pickling look the module up there)."""
    path = Path(file)
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise FactoryError(f"factory spec {spec!r}: file not found: {path}")
    tag = zlib.crc32(str(path.resolve()).encode())
    name = f"trainsim_factory_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{tag:08x}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module
    try:
        mod_spec.loader.exec_module(module)
    except Exception as e:  # the user's file: one line
        del sys.modules[name]
        first = str(e).splitlines()[0] if str(e) else ""
        raise FactoryError(f"factory spec {spec!r}: executing {path} raised {type(e).__name__}: {first}") from e
    return module
