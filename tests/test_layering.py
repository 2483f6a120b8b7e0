"""The package's layers (docs/architecture.md), read from every import in src/, function-level ones included:

    config, sizes, schedule, loss, distributed, host, outputs, plots, tokenizer, presets  <  model  <  data  <  pipeline, index
      <  corpora, eval, serve  <  train  <  prepare  <  cli, flags

Training is apart from its data: no module of train/ imports the corpora, the pipeline or the tokenizer (its
trainer); `prepare` (openalign/prepare.py) makes the data ready and hands it to training.

A module imports only from its own layer or below, and no two modules import each other, directly or
through others (neither a function-level import nor `importlib.import_module("openalign.x")` hides a
cycle). The corpus pipeline's stages are siblings: none imports another.
"""

import ast
from pathlib import Path

import openalign

PACKAGE = Path(openalign.__file__).parent
LAYERS = [("config", "sizes", "schedule", "loss", "distributed", "host", "outputs", "plots", "tokenizer", "presets"), ("model",),
          ("data",),
          ("pipeline", "index"), ("corpora", "eval", "serve", "api"), ("train",), ("prepare",),
          ("cli", "flags", "__main__")]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported openalign module, line) of every import statement in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:  # `from openalign.data import sources`: the module itself
                candidate = f"{base}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").is_file() or \
                    (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                found.append((candidate if is_module else base, node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            found.append((node.args[0].value, node.lineno))  # importlib.import_module("openalign.x") imports as well
    return [(name, line) for name, line in found if name.startswith("openalign.") and name != me]


def unit(module: str) -> str:
    return module.split(".")[1]


def graph() -> dict[str, list[tuple[str, int]]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_unit_has_a_layer():
    units = {unit(m) for m in graph() if "." in m}
    assert units <= set(RANK), f"give these a layer in LAYERS (and docs/architecture.md): {sorted(units - set(RANK))}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{m.replace('.', '/')}.py:{line} imports {target} ({unit(m)} -> {unit(target)})"
              for m, targets in graph().items() if "." in m for target, line in targets
              if RANK[unit(target)] > RANK[unit(m)]]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_modules():
    modules = graph()
    edges = {m: sorted({t for t, _ in targets if t in modules}) for m, targets in modules.items()}
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in edges.get(node, ()):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


TRAINING_NEVER_IMPORTS = ("openalign.corpora", "openalign.pipeline", "openalign.tokenizer")  # prepare's, not train's


def apart(modules: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The imports by which a module of train/ reaches what only `prepare` may: building corpora, the pipeline's
    stages, training a tokenizer."""
    return [f"{m.replace('.', '/')}.py:{line} imports {target}" for m, targets in modules.items()
            if m == "openalign.train" or m.startswith("openalign.train.") for target, line in targets
            if any(target == n or target.startswith(n + ".") for n in TRAINING_NEVER_IMPORTS)]


def test_training_imports_none_of_the_corpora_the_pipeline_and_the_tokenizer_trainer():
    assert not apart(graph()), "\n".join(apart(graph()))
    # the check itself: train/trainer.py as it was before `prepare` (it built corpora and trained the tokenizer)
    before = {"openalign.train.trainer": [("openalign.corpora", 31), ("openalign.tokenizer", 40),
                                          ("openalign.data.tars", 30)]}
    assert apart(before) == ["openalign/train/trainer.py:31 imports openalign.corpora",
                             "openalign/train/trainer.py:40 imports openalign.tokenizer"]


RESOLUTION = {"resolve_data", "heldout_keep", "source_eval_shards"}  # the corpora's resolution of a config's data


def test_prepare_is_the_only_caller_of_the_corpora_s_resolution():
    # before prepare: train/trainer.py and cli/web.py imported resolve_data
    callers = [f"{module_name(p).replace('.', '/')}.py:{node.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
               if module_name(p) not in ("openalign.prepare", "openalign.corpora")
               for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("openalign.corpora")
               and RESOLUTION & {alias.name for alias in node.names}]
    assert not callers, callers


STAGES = ("web.extract", "web.fetch", "ingest", "curation.filter", "curation.dedup", "curation.screen",
          "curation.score", "curation.semdedup", "curation.balance", "curation.card",
          "shard")  # pipeline/: the corpus stages, siblings
WINGS = ("openalign.pipeline.web", "openalign.pipeline.curation")  # reaching the web; curating a pair table


def stage_imports(modules: dict) -> list[str]:
    """Imports of one pipeline stage by another (what they share lives in data/pairs.py, pipeline/runner.py or a
    wing's shared modules: curation/scoring.py, curation/concepts.py)."""
    stages = {f"openalign.pipeline.{s}" for s in STAGES}
    return [f"{m} imports {t} (line {line})" for m, targets in modules.items() if m in stages
            for t, line in targets if t in stages or any(t.startswith(s + ".") for s in stages)]


def wing_imports(modules: dict) -> list[str]:
    """Imports of one wing of the pipeline by the other: the web side (extract, fetch and their helpers) and the
    curation side (the stages from a pair table to a keep-list) share only what lies below them or at the pipeline's
    root (the runner, ingest, shard)."""
    def wing(name: str) -> str | None:
        return next((w for w in WINGS if name == w or name.startswith(w + ".")), None)

    return [f"{m} imports {t} (line {line})" for m, targets in modules.items() if wing(m)
            for t, line in targets if wing(t) and wing(t) != wing(m)]


def test_no_pipeline_stage_imports_another_stage():
    assert {f"openalign.pipeline.{s}" for s in STAGES} <= set(graph()), "a stage was renamed: update STAGES"
    assert not stage_imports(graph()), "\n".join(stage_imports(graph()))


def test_the_stage_check_finds_a_stage_importing_a_stage():
    modules = {"openalign.pipeline.curation.screen": [("openalign.pipeline.curation.dedup", 29),
                                                      ("openalign.pipeline.curation.scoring", 30)],
               "openalign.corpora.openclipart": [("openalign.pipeline.ingest", 24)]}
    assert stage_imports(modules) == ["openalign.pipeline.curation.screen imports openalign.pipeline.curation.dedup "
                                      "(line 29)"]


def test_the_web_wing_and_the_curation_wing_never_import_each_other():
    found = graph()
    assert {w for w in WINGS} <= set(found), "a wing was renamed: update WINGS"
    assert not wing_imports(found), "\n".join(wing_imports(found))


def test_the_wing_check_finds_either_wing_importing_the_other():
    modules = {"openalign.pipeline.web.fetch": [("openalign.pipeline.curation.filter", 12),
                                                ("openalign.pipeline.runner", 13), ("openalign.data.pairs", 14)],
               "openalign.pipeline.curation.card": [("openalign.pipeline.web.extract_links", 7)],
               "openalign.pipeline.ingest": [("openalign.pipeline.web.fetch", 3)],  # the root may use a wing
               "openalign.corpora.web": [("openalign.pipeline.web.extract", 5),
                                         ("openalign.pipeline.curation.filter", 6)]}
    assert wing_imports(modules) == [
        "openalign.pipeline.web.fetch imports openalign.pipeline.curation.filter (line 12)",
        "openalign.pipeline.curation.card imports openalign.pipeline.web.extract_links (line 7)"]


def test_the_checker_sees_function_level_relative_and_importlib_imports(tmp_path, monkeypatch):
    """The checks above cannot pass vacuously: an upward import inside a function body, relative or through
    importlib, is found."""
    fake = tmp_path / "openalign"
    (fake / "data").mkdir(parents=True)
    (fake / "eval").mkdir()
    for pkg in (fake, fake / "data", fake / "eval"):
        (pkg / "__init__.py").write_text("")
    (fake / "eval" / "tasks.py").write_text("X = 1\n")
    (fake / "data" / "reader.py").write_text("import importlib\n\n\ndef f():\n    from openalign.eval import tasks\n"
                                             "    from ..eval.tasks import X\n"
                                             "    importlib.import_module('openalign.eval.tasks')\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    found = imports(fake / "data" / "reader.py")
    assert sorted(found, key=lambda hit: hit[1]) == [("openalign.eval.tasks", 5), ("openalign.eval.tasks", 6),
                                                     ("openalign.eval.tasks", 7)]
    assert RANK[unit(found[0][0])] > RANK["data"]


def private_imports_of_text(path: Path) -> list[str]:
    """`line name` of every `from openalign.X import _name` (a name private to X) in the file."""
    return [f"{node.lineno} {a.name}" for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("openalign")
            for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]


def private_imports(files) -> list[str]:
    return [f"{module_name(path)}:{hit}" for path in files for hit in private_imports_of_text(path)]


def test_no_module_imports_a_name_private_to_another():
    # Before: index/cells.py imported exact.py's _SCAN_LOCK and _tile_scores; they are index/scan.py's public API.
    assert private_imports(PACKAGE.rglob("*.py")) == []


def test_the_private_import_check_finds_one(tmp_path):
    bad = PACKAGE / "index" / "cells.py"
    copy = tmp_path / "cells.py"
    copy.write_text(bad.read_text() + "\nfrom openalign.index.exact import _scan\n")
    assert private_imports([bad]) == []
    assert any(hit.endswith(" _scan") for hit in private_imports_of_text(copy))
