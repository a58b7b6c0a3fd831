"""The shipped scenarios (``scenarios/catalog/*.toml``): names, descriptions, and where a name points.

Light on purpose (no torch, no SimPy): ``trainsim list`` and the argument checks of ``run`` and
``sweep`` read it before anything heavy is imported.
"""

from __future__ import annotations

from pathlib import Path

from scenarios.scenario import read_toml_file

__all__ = ["catalog_dir", "catalog_entries", "catalog_names", "display_source", "is_sweep_file", "scenario_path"]


def catalog_dir() -> Path:
    """The folder of the shipped scenarios (``scenarios/catalog``)."""
    return Path(__file__).parent / "catalog"


def catalog_names() -> list[str]:
    """Names of the catalog's scenario and sweep files, sorted."""
    return sorted(p.stem for p in catalog_dir().glob("*.toml"))


def catalog_entries() -> list[tuple[str, str, bool]]:
    """``(name, description, is_sweep)`` of every catalog file, sorted by name."""
    out = []
    for p in sorted(catalog_dir().glob("*.toml")):
        data = read_toml_file(p)
        out.append((p.stem, str(data.get("description", "")), "sweep" in data))
    return out


def scenario_path(name: str) -> Path:
    """A catalog scenario by name (``scenarios/catalog/<name>.toml``) or a path."""
    p = Path(name)
    if p.exists() or p.suffix == ".toml":
        return p
    return catalog_dir() / f"{name}.toml"


def display_source(source: str) -> str:
    """How to show a scenario's source: ``catalog`` for shipped files, the path otherwise."""
    if not source or source.startswith("<"):
        return "built in"
    p = Path(source)
    try:
        if p.resolve().parent == catalog_dir().resolve():
            return "catalog"
    except OSError:
        pass
    return source


def is_sweep_file(path: str | Path) -> bool:
    """Whether the TOML file at ``path`` has a ``[sweep]`` table."""
    return "sweep" in read_toml_file(path)
