"""bench/ stays runnable: every module imports, and every openalign name a bench imports (at any depth: many import
inside their functions) exists and is public, or is one of the internals listed in bench/_common.py's MEASURED."""

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

import openalign

BENCH = Path(__file__).resolve().parents[1] / "bench"
MODULES = sorted(p for p in BENCH.glob("*.py"))


def measured() -> dict[str, str]:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module("_common").MEASURED
    finally:
        sys.path.remove(str(BENCH))


def imported_names(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every `from openalign... import name` in `path`; (module, "", line) for `import`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "openalign":
            found += [(node.module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name.split(".")[0] == "openalign"]
    return found


def problem(module_name: str, name: str, allowed: dict[str, str]) -> str | None:
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        return f"{module_name} does not import ({err})"
    if not name:
        return None
    if not hasattr(module, name):
        try:
            importlib.import_module(f"{module_name}.{name}")
            return None  # a submodule
        except ImportError:
            return f"{module_name} has no {name}"
    obj = getattr(module, name)
    if isinstance(obj, types.ModuleType) or name in getattr(module, "__all__", ()) \
            or getattr(openalign, name, None) is obj or f"{module_name}.{name}" in allowed:
        return None
    return (f"{module_name}.{name} is not public: import it from the public API, or list it in bench/_common.py's "
            "MEASURED with what it is there to measure")


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_a_bench_module_imports_and_uses_only_public_or_listed_names(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))  # the module runs nothing on import
    allowed = measured()
    problems = [f"{path.name}:{line}: {p}" for module, name, line in imported_names(path)
                if (p := problem(module, name, allowed))]
    assert not problems, problems


def test_every_listed_internal_is_imported_by_a_bench_and_exists():
    used = {f"{module}.{name}" for path in MODULES for module, name, _ in imported_names(path) if name}
    for dotted in measured():
        module, _, name = dotted.rpartition(".")
        assert dotted in used, f"{dotted} is listed in MEASURED but no bench imports it: remove it"
        assert hasattr(importlib.import_module(module), name), f"{dotted} no longer exists"


def test_a_bench_importing_a_renamed_or_private_name_is_caught(tmp_path):
    bench = tmp_path / "b.py"
    bench.write_text("def main():\n    from openalign.cli import _bytes\n    from openalign.pipeline.curation.filter_rules import "
                     "FilterConfig\n    from openalign.index.embed import _write_part\n    from openalign.host import "
                     "reuse_freed_memory\n")
    found = [problem(m, n, measured()) for m, n, _ in imported_names(bench)]
    assert found[0] == "openalign.cli has no _bytes"
    assert found[1] is None and found[2] is None  # re-exported by openalign; listed
    assert "is not public" in found[3]
