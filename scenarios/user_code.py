"""User code named by a scenario: ``"package.module:factory"`` and ``"path/to/file.py:factory"`` specs.

Input handling for ``[model] factory`` (:mod:`scenarios.runner`): resolve the spec to a callable, or
fail with a one-line :class:`FactoryError` naming the spec and what is wrong.

A scenario file is data, except for ``factory``: importing a module or executing a file runs code, so
for a scenario read from a file it is opt-in (:func:`check_trusted`), like Hugging Face's
``trust_remote_code``: ``--trust-code`` on the command line or :data:`TRUST_ENV` = ``1``. The catalog
shipped with trainsim is trusted (its one factory is ``examples/vit.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TRUST_ENV", "FactoryError", "UntrustedCodeError", "check_trusted", "describe_factory",
           "env_trusts_code", "load_factory"]

TRUST_ENV = "TRAINSIM_TRUST_CODE"
"""Environment variable: ``1`` lets scenario files run their ``[model] factory`` (as ``--trust-code``)."""


class FactoryError(ValueError):
    """A ``"package.module:factory"`` string is malformed or does not resolve to a callable."""


class UntrustedCodeError(ValueError):
    """A scenario file names code to run (``[model] factory``) and running it was not allowed."""


def env_trusts_code() -> bool:
    """Whether :data:`TRUST_ENV` is set to ``1`` (or ``true``/``yes``)."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def describe_factory(spec: Any, base_dir: str | Path | None = None) -> str:
    """What a factory spec would run, in words: ``function system of module os``."""
    if not isinstance(spec, str) or ":" not in spec:
        return f"factory {spec!r}"
    mod_name, attr = spec.rsplit(":", 1)
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        return f"function {attr} of file {path}"
    return f"function {attr} of module {mod_name}"


def check_trusted(spec: Any, trusted: bool, base_dir: str | Path | None = None) -> None:
    """Refuse to run a scenario's factory unless ``trusted`` or :func:`env_trusts_code`.

    Raises:
        UntrustedCodeError: one line saying what would run and how to allow it.
    """
    if trusted or env_trusts_code():
        return
    raise UntrustedCodeError(f"[model] factory = {spec!r} would run {describe_factory(spec, base_dir)}; a "
                             f"scenario file runs code only when you allow it: pass --trust-code or set "
                             f"{TRUST_ENV}=1")


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
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # the module's own code: one line
            first = str(e).splitlines()[0] if str(e) else ""
            raise FactoryError(f"factory spec {spec!r}: importing {mod_name} raised {type(e).__name__}: "
                               f"{first}") from e
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
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # the user's file: one line, never an exit
        del sys.modules[name]
        first = str(e).splitlines()[0] if str(e) else ""
        raise FactoryError(f"factory spec {spec!r}: executing {path} raised {type(e).__name__}: {first}") from e
    return module
