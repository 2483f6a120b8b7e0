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
