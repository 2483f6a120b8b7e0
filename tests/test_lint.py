"""The lint and the type check: `ruff check` on the package, the tests, the studies and the benches, with
pyproject.toml's rule sets (why each: the comment above `[tool.ruff.lint]`); mypy on the modules `[tool.mypy]` lists."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "src", "tests", "experiments", "bench"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_package_says_it_is_typed():
    # PEP 561: without py.typed, a user's type checker ignores openalign's annotations
    assert (ROOT / "src" / "openalign" / "py.typed").is_file()


def test_matplotlibs_backend_is_chosen_in_one_place():
    # openalign/plots.py: Agg unless the process has imported pyplot already (a user's notebook keeps its backend)
    chosen = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "src").rglob("*.py"))
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if "matplotlib.use(" in line]
    assert chosen == ["src/openalign/plots.py:27"], chosen


def test_no_result_is_built_with_positional_arguments():
    # a Result of 13 fields built positionally breaks silently when a field is added in the middle
    import ast

    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in (ROOT / "src").rglob("*.py")}
    results = {node.name for tree in trees.values() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and node.name.endswith("Result")}
    positional = sorted(f"{path.relative_to(ROOT)}:{node.lineno}" for path, tree in trees.items()
                        for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
                        and getattr(node.func, "id", getattr(node.func, "attr", None)) in results)
    assert positional == [], positional


def test_files_are_put_in_place_only_through_the_outputs_module():
    # outputs.staged / staged_dir / place: a rename written by hand elsewhere is how a half-written file (or one
    # left behind by an error) came to sit under a final name
    import ast

    renames = []
    for path in sorted((ROOT / "src").rglob("*.py")):
        if path.name == "outputs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = ast.unparse(node.func)
            one_path = (isinstance(node.func, ast.Attribute) and node.func.attr in ("replace", "rename")
                        and len(node.args) == 1 and not node.keywords and name != "dataclasses.replace")
            if name in ("os.replace", "os.rename", "os.renames", "shutil.move") or one_path:
                renames.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert renames == [], renames
