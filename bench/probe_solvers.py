"""The linear probe's two solvers on a small and a large labelled set: which one serves a user's own data.

CLIP's protocol (`linear-probe.solver=lbfgs`: multinomial logistic regression by full-batch L-BFGS, C found by
CLIP's search on a fifth of the training split) against the paper's SGD recipe (`linear-probe.solver=sgd`:
momentum 0.9, batch 1024, lr 0.1 decayed x0.2 every 30 of 100 epochs, written for ImageNet's 1.28M images), both on
the same frozen embeddings of one model, each run through `openalign eval` as a user runs it:

- small: the emoji corpus' classes (`openalign corpus emoji-eval`: 19 held-out families, 146 train / 145 test);
- large: the shapes corpus' 64 colour-shape classes (`openalign corpus shapes`, the held-out split of two seeds:
  300 images a class to train on, 20 a class to test), images the emoji model never saw;
- medium: the first 40 training images of each shapes class (2,560).

    .venv/bin/python bench/probe_solvers.py [--model runs/demo/model] [--emoji data/emoji]

Writes its table into docs/evaluation.md ("Choosing the probe's solver"). Embeddings are computed once (--cache);
the seconds are the whole `openalign eval` run from the cache, the probe's fits included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_section
from openalign import cli

SOLVERS = ("lbfgs", "sgd")


def openalign(*argv: str) -> None:
    code = cli.main(list(argv))
    if code:
        raise SystemExit(f"openalign {' '.join(argv)} exited {code}")


def first_per_class(shards: Path, out: Path, per_class: int) -> Path:
    """The first `per_class` samples of each class (json `name`) of a shard folder, as one new shard."""
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with tarfile.open(out / "subset-000000.tar", "w") as dst:
        for shard in sorted(shards.glob("*.tar")):
            with tarfile.open(shard) as src:
                members = src.getmembers()
                by_key: dict[str, list] = {}
                for m in members:
                    by_key.setdefault(m.name.split(".")[0], []).append(m)
                for files in by_key.values():
                    meta = next(f for f in files if f.name.endswith(".json"))
                    name = json.load(src.extractfile(meta))["name"]
                    if counts.get(name, 0) < per_class:
                        counts[name] = counts.get(name, 0) + 1
                        for f in files:
                            dst.addfile(f, src.extractfile(f))
    return out


def probe(model: str, test: Path, train: Path, cache: Path, solver: str, out: Path) -> tuple[dict, float]:
    start = time.perf_counter()
    openalign("eval", model, "--data", str(test), "--train-data", str(train), "--task", "linear-probe",
              f"linear-probe.solver={solver}", "--cache", str(cache), "--out", str(out))
    seconds = time.perf_counter() - start
    return json.loads(out.read_text()), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "runs" / "demo" / "model"))
    parser.add_argument("--emoji", default=str(ROOT / "data" / "emoji"), help="the emoji corpus (make demo)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        openalign("corpus", "emoji-eval", "--from", args.emoji, "--out", str(work / "emoji-eval"), "--quiet")
        openalign("corpus", "shapes", "--out", str(work / "shapes-train"), "--seed", "3", "--per-combo", "1",
                  "--eval-seen", "300", "--eval-unseen", "300", "--quiet")
        openalign("corpus", "shapes", "--out", str(work / "shapes-test"), "--seed", "2", "--per-combo", "1",
                  "--eval-seen", "20", "--eval-unseen", "20", "--quiet")
        medium = first_per_class(work / "shapes-train" / "eval", work / "shapes-medium", 40)
        sets = [("small: emoji-eval classes", work / "emoji-eval" / "classes" / "test",
                 work / "emoji-eval" / "classes" / "train"),
                ("medium: shapes, 40 a class", work / "shapes-test" / "eval", medium),
                ("large: shapes, 300 a class", work / "shapes-test" / "eval", work / "shapes-train" / "eval")]
        rows = ["| set | classes | train / test | solver | top-1 | top-5 | fit | seconds |",
                "|---|---|---|---|---|---|---|---|"]
        for name, test, train in sets:  # embedded once (a KNN run fills the cache), then each solver from it
            openalign("eval", args.model, "--data", str(test), "--train-data", str(train), "--task", "knn",
                      "--cache", str(work / "cache"), "--out", str(work / "knn.json"))
            for solver in SOLVERS:
                m, seconds = probe(args.model, test, train, work / "cache", solver, work / f"{solver}.json")
                n_test = sum(1 for _ in _images(test))
                if solver == "lbfgs":
                    fit = f"C={m['linear_probe_C']:g} of {m['linear_probe_searched']}, validation " \
                          f"{m['linear_probe_val_top1']:.3f}"
                else:
                    fit = f"{m['linear_probe_epochs']} epochs, train {m['linear_probe_train_top1']:.3f}"
                rows.append(f"| {name} | {m['linear_probe_n_classes']} | {m['linear_probe_n_train']:,} / "
                            f"{n_test:,} | {solver} | {m['linear_probe_top1']:.3f} | {m['linear_probe_top5']:.3f} | "
                            f"{fit} | {seconds:.0f} |")
                print(rows[-1], flush=True)
    setup = f"- model: `{_shown(args.model)}`; {args.threads} threads; {time.strftime('%Y-%m-%d')}"
    body = "\n".join([*rows, "", setup, "- command: `.venv/bin/python bench/probe_solvers.py`"])
    write_section("probe-solvers", body, ROOT / "docs" / "evaluation.md")
    return 0


def _images(split: Path):
    """The images of a class-folder split or the samples of a shard folder."""
    if any(split.glob("*.tar")):
        for shard in split.glob("*.tar"):
            with tarfile.open(shard) as tar:
                yield from (m for m in tar.getmembers() if m.name.endswith(".jpg"))
    else:
        yield from (f for f in split.rglob("*") if f.is_file())


def _shown(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


if __name__ == "__main__":
    sys.exit(main())
