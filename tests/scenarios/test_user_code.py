"""Resolving ``[model] factory`` specs to callables, with one-line errors."""

from __future__ import annotations

import pytest

from scenarios.user_code import FactoryError, load_factory
from workload.zoo import build_model


def test_load_factory() -> None:
    assert load_factory("workload.zoo:build_model") is build_model
    assert load_factory("workload.zoo:build_model.__call__") == build_model.__call__  # dotted attribute
    with pytest.raises(FactoryError, match="expected 'package.module:factory'"):
        load_factory("workload.zoo.build_model")
    with pytest.raises(FactoryError, match="cannot import module 'no_such_pkg.mod'"):
        load_factory("no_such_pkg.mod:make")
    with pytest.raises(FactoryError, match="has no attribute 'nope'"):
        load_factory("workload.zoo:nope")
    with pytest.raises(FactoryError, match="not callable"):
        load_factory("workload.trace:__all__")


def test_file_factory_module_named_by_its_path(tmp_path) -> None:
    (tmp_path / "mine.py").write_text("import dataclasses\n@dataclasses.dataclass\nclass C:\n    x: int = 1\n"
                                      "def build():\n    return C()\n")
    first = load_factory("mine.py:build", tmp_path)
    again = load_factory(str(tmp_path / "mine.py") + ":build")
    assert first().x == 1 and first.__module__ == again.__module__  # one module name per resolved path


def test_old_import_path_still_resolves() -> None:
    import workload
    from workload.trace import FactoryError as Old
    from workload.trace import load_factory as old

    assert Old is FactoryError and old is load_factory and workload.load_factory is load_factory
