"""The lab uses openalign as a user would: only the names openalign's modules list in `__all__`.

Every `import openalign...` and `from openalign... import name` in the lab's code (not its tests) is read: an
imported name must be in its module's `__all__` (a submodule counts when it has an `__all__` of its own), and every
attribute read off an imported module (`config_lib.override`) must be in that module's `__all__` too.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

LAB = Path(__file__).resolve().parents[1]


def _public_module(name: str):
    """The module `name` when it declares its public names, else None."""
    if importlib.util.find_spec(name) is None:
        return None
    module = importlib.import_module(name)
    return module if hasattr(module, "__all__") else None


def _submodule(package: str, name: str):
    """`package.name` when it is a module (not an attribute of `package`), else None."""
    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except ModuleNotFoundError:
        return None
    return importlib.import_module(f"{package}.{name}") if spec else None


def private_uses(source: str) -> list[str]:
    """Each use of openalign in `source` that is not public, as `line: what`."""
    tree = ast.parse(source)
    modules: dict[str, object] = {}  # local name -> the openalign module it is bound to
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "openalign":
                    continue
                module = _public_module(alias.name)
                if module is None:
                    found.append(f"{node.lineno}: import {alias.name} (no __all__: not a public module)")
                elif alias.asname:
                    modules[alias.asname] = module
                elif alias.name == "openalign":
                    modules["openalign"] = module
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "openalign":
            parent = importlib.import_module(node.module)
            public = getattr(parent, "__all__", None)
            for alias in node.names:
                sub = _submodule(node.module, alias.name)
                if sub is not None:
                    if not hasattr(sub, "__all__"):
                        found.append(f"{node.lineno}: from {node.module} import {alias.name} (no __all__)")
                    else:
                        modules[alias.asname or alias.name] = sub
                elif public is None or alias.name not in public:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name} (not in its __all__)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            sub = _submodule(module.__name__, node.attr)
            if node.attr not in module.__all__ and (sub is None or not hasattr(sub, "__all__")):
                found.append(f"{node.lineno}: {node.value.id}.{node.attr} (not in {module.__name__}.__all__)")
    return found


def test_the_lab_imports_only_public_names():
    uses = {str(path.relative_to(LAB)): private_uses(path.read_text()) for path in sorted(LAB.rglob("*.py"))
            if "tests" not in path.relative_to(LAB).parts}
    assert len(uses) >= 20  # every study and part was read
    assert {path: found for path, found in uses.items() if found} == {}


def test_the_check_finds_a_private_name_a_private_attribute_and_a_private_module():
    source = ("from openalign.index.build import file_of\n"  # a helper of the index's own, not in its __all__
              "from openalign import config as config_lib\n"
              "config_lib.from_dict(None, {})\n"  # a helper of config's own, not in its __all__
              "import openalign.train.step\n"  # a module without __all__
              "from openalign.index.build import build\n"
              "import openalign\n"
              "openalign.search\n")
    assert [use.split(":")[0] for use in private_uses(source)] == ["1", "4", "3"]
