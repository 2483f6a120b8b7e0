"""openalign as a library: the built wheel and sdist, the core installed alone with no network, and pip keeping the
versions a user already has inside the supported ranges (pyproject.toml).

The wheels come from `.venv/wheelhouse`, which `make` fills from requirements.lock (`pip download`); the installs
here run with `--no-index`, so nothing is fetched. A venv of the core takes a minute or two: the tests are slow."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import save_tiny_model, shape_images

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
EXTRAS_MISSING = ("pyspark", "fastapi", "uvicorn", "wandb", "tensorboard")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not WHEELHOUSE.is_dir(), reason=f"no {WHEELHOUSE}: `make test` "
                                                                                "downloads the core's wheels there")]


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, **kwargs)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The wheel and the sdist `python -m build` makes from this checkout (no network: the venv's setuptools)."""
    out = tmp_path_factory.mktemp("dist")
    done = run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_the_wheel_and_sdist_pass_twine_and_the_wheel_holds_its_package_data(dist):
    wheel, sdist = next(dist.glob("openalign-*.whl")), next(dist.glob("openalign-*.tar.gz"))
    done = run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    assert done.returncode == 0 and done.stdout.count("PASSED") == 2, done.stdout + done.stderr
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("openalign/eval/templates/imagenet80.txt", "openalign/eval/templates/generic.txt",
                 "openalign/eval/paper_tables.csv", "openalign/serve/static/index.html",
                 "openalign/serve/static/app.js", "openalign/serve/static/style.css"):
        assert data in names, data
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert not [r for r in core if "==" in r], core  # ranges, never exact pins
    assert not [r for r in core if any(name in r.lower() for name in EXTRAS_MISSING)], core
    for extra in ("spark", "serve", "dashboards", "dev"):
        assert f"Provides-Extra: {extra}" in metadata


def test_the_core_alone_installs_offline_loads_encodes_evaluates_and_names_each_missing_extra(dist, tmp_path):
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    python, openalign = venv / "bin" / "python", venv / "bin" / "openalign"
    wheel = next(dist.glob("openalign-*.whl"))
    done = run(python, "-m", "pip", "install", "--quiet", "--no-compile", "--no-index", "--find-links", WHEELHOUSE,
               wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = json.loads(run(python, "-m", "pip", "list", "--format=json").stdout)
    installed = {item["name"].lower() for item in listed}
    assert "openalign" in installed and "torch" in installed
    assert not installed & set(EXTRAS_MISSING), installed & set(EXTRAS_MISSING)

    model = save_tiny_model(tmp_path / "model", ["a red circle", "a blue square"])
    images = shape_images(tmp_path / "images")
    code = ("import sys, openalign; m = openalign.load(sys.argv[1], device='cpu'); "
            "print(tuple(m.encode_texts(['a red circle', 'a blue square']).shape))")
    done = run(python, "-c", code, model, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip().endswith("(2, 80)"), done.stderr[-3000:]
    done = run(openalign, "eval", model, "--data", images, "--task", "retrieval", "--out", tmp_path / "m.json",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "m.json").read_text())["n_images"] == 12
    for argv, extra, missing in ((["serve", tmp_path / "nowhere"], "serve", "fastapi"),
                                 (["filter", tmp_path / "pairs.parquet", "--out", tmp_path / "kept", "--engine",
                                   "spark"], "spark", "pyspark")):
        done = run(openalign, *argv, cwd=tmp_path)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert missing in done.stderr and f"pip install 'openalign[{extra}]'" in done.stderr, done.stderr


def fake_installed(site: Path, wheel_or_name: str, version: str, metadata: str | None = None) -> None:
    """A distribution as pip sees one installed: its dist-info (METADATA, INSTALLER, RECORD), without its files."""
    name = wheel_or_name
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(metadata or f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def test_pip_keeps_torch_and_transformers_a_user_has_within_the_supported_ranges(dist, tmp_path):
    """A venv holding torch 2.14.1 and transformers 5.18.0 (both in the machine's local package index): installing
    openalign replaces neither. Before: torch==2.13.0 and transformers==5.24.0 were pinned, and pip replaced both
    (on a GPU machine, a multi-GB download of another CUDA build). pip resolves against the installed
    distributions' metadata, so they are laid in as pip would find them (transformers' own METADATA, with its
    requirements, read from its wheel; torch's without the CUDA libraries it would bring)."""
    venv = tmp_path / "venv"
    assert run(sys.executable, "-m", "venv", venv).returncode == 0
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    transformers_wheel = Path("/opt/pypi-more/files/transformers-5.18.0-py3-none-any.whl")
    metadata = None
    if transformers_wheel.is_file():
        metadata = zipfile.ZipFile(transformers_wheel).read("transformers-5.18.0.dist-info/METADATA").decode()
    fake_installed(site, "transformers", "5.18.0", metadata)
    fake_installed(site, "torch", "2.14.1")
    wheel = next(dist.glob("openalign-*.whl"))
    done = run(python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", tmp_path / "report.json",
               "--no-index", "--find-links", WHEELHOUSE, wheel)
    assert done.returncode == 0, done.stderr[-3000:]
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert "openalign" in planned
    assert "torch" not in planned and "transformers" not in planned, planned
