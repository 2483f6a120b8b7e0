"""How far a reader follows the training config: from the functions `openalign train` calls, every openalign function
the config (or a part of it, or an object built from it) is passed to, read statically from src/ (issue 86).

    python bench/config_trail.py [--src SRC] [--root MODULE:FUNCTION ...]

A *stop* is a function the config reaches, visited once, depth first in call order. The trail *crosses* the files
of its stops; it *climbs back* each time the next stop lies in a higher layer (tests/test_layering.py's LAYERS) than
the one before it: the reader went down into data/ or corpora/ and must come up again to go on. An argument
carries the config when it mentions a name that does: the root's parameters, a parameter a carrying argument was
passed to, a local assigned from a carrying expression. Calls are resolved through each module's imports (names,
modules, their aliases) and its own functions; methods and calls through variables are not followed.

The defaults are what `openalign train` runs: `openalign.prepare:prepare` then `openalign.train.trainer:train`
(before issue 86, one root: `openalign.train.trainer:train`, which took the config). Prints the counts and
the files, each with its layer and stops.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

LAYERS = [("config", "sizes", "schedule", "loss", "distributed", "host", "outputs", "plots", "tokenizer", "presets"),
          ("model",), ("data",), ("pipeline", "index"), ("corpora", "eval", "serve", "api"), ("train",), ("prepare",),
          ("cli", "flags", "__main__")]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


class Module:
    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (module, attribute or "")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("openalign"):
                for alias in node.names:
                    self.names[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("openalign"):
                        self.names[alias.asname or alias.name.split(".")[0]] = (alias.name, "")

    @property
    def unit(self) -> str:
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else "__main__"

    @property
    def layer(self) -> int:
        return RANK.get(self.unit, len(LAYERS))


def modules(src: Path) -> dict[str, Module]:
    found = {}
    for path in sorted((src / "openalign").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = Module(name, path)
    return found


def resolve(mods: dict[str, Module], module: Module, call: ast.Call) -> tuple[Module, ast.FunctionDef] | None:
    """The openalign function a call names, where it can be told statically."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in module.functions:
            return module, module.functions[func.id]
        target = module.names.get(func.id)
        if target:
            where, attribute = target
            if where in mods and attribute in mods[where].functions:
                return mods[where], mods[where].functions[attribute]
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        target = module.names.get(func.value.id)
        if target:
            where, attribute = target
            name = f"{where}.{attribute}" if attribute else where
            if name in mods and func.attr in mods[name].functions:
                return mods[name], mods[name].functions[func.attr]
    return None


def mentions(node: ast.AST, carrying: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in carrying for n in ast.walk(node))


def parameters(function: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*function.args.posonlyargs, *function.args.args)]


def carried(function: ast.FunctionDef, given: set[str]) -> set[str]:
    """The names that carry the config inside `function`: `given` parameters and the locals assigned from them."""
    names = set(given)
    for _ in range(3):  # assignments in any order, a few hops deep
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and mentions(node.value, names):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.For, ast.comprehension)) and mentions(node.iter, names):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.withitem) and node.optional_vars is not None \
                    and mentions(node.context_expr, names):
                names |= {n.id for n in ast.walk(node.optional_vars) if isinstance(n, ast.Name)}
    return names


def trail(mods: dict[str, Module], roots: list[str]) -> list[tuple[Module, str]]:
    stops: list[tuple[Module, str]] = []
    seen: set[tuple[str, str]] = set()

    def visit(module: Module, function: ast.FunctionDef, given: set[str]) -> None:
        if (module.name, function.name) in seen:
            return
        seen.add((module.name, function.name))
        stops.append((module, function.name))
        names = carried(function, given)
        calls = sorted((n for n in ast.walk(function) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            found = resolve(mods, module, call)
            if not found:
                continue
            callee_module, callee = found
            params = parameters(callee)
            passed = {params[i] for i, a in enumerate(call.args) if i < len(params) and mentions(a, names)}
            passed |= {k.arg for k in call.keywords if k.arg and mentions(k.value, names)}
            if passed:
                visit(callee_module, callee, passed)

    for root in roots:
        name, _, function = root.partition(":")
        module = mods[name]
        visit(module, module.functions[function], set(parameters(module.functions[function])))
    return stops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"))
    parser.add_argument("--root", action="append", help="MODULE:FUNCTION (default: what `openalign train` runs)")
    args = parser.parse_args(argv)
    mods = modules(Path(args.src))
    roots = args.root or [r for r in ("openalign.prepare:prepare", "openalign.train.trainer:train")
                          if r.partition(":")[0] in mods]
    stops = trail(mods, roots)
    climbs = sum(1 for (a, _), (b, _) in zip(stops, stops[1:]) if b.layer > a.layer)
    files = Counter(m.name for m, _ in stops)
    print(f"roots: {', '.join(roots)}")
    print(f"stops {len(stops)}, files crossed {len(files)}, climbs back up the layers {climbs}")
    for name, count in sorted(files.items(), key=lambda kv: (-mods[kv[0]].layer, kv[0])):
        print(f"  layer {mods[name].layer}  {name}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
