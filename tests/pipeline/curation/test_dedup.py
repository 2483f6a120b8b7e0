import io
import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from conftest import run_killed
from openalign import presets
from openalign.cli import main
from openalign.data.transforms import to_tensor
from openalign.data.pairs import read_keep
from openalign.model.dual_encoder import DualEncoder
from openalign.model.hub import save_pretrained
from openalign.tokenizer import train_tokenizer


def picture(seed: int) -> Image.Image:
    """Smooth shapes (perceptual hashes need structure, not noise)."""
    rng = np.random.default_rng(seed)
    image = Image.new("RGB", (320, 240), tuple(int(c) for c in rng.integers(0, 255, 3)))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x, y = rng.integers(0, 260), rng.integers(0, 180)
        draw.ellipse((x, y, x + rng.integers(30, 120), y + rng.integers(30, 120)),
                     fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
    return image


def setup(tmp_path):
    train, held = tmp_path / "train", tmp_path / "eval"
    train.mkdir()
    held.mkdir()
    for i in range(8):
        picture(i).save(train / f"t{i}.png")
        (train / f"t{i}.txt").write_text(f"training picture number {i}")
    picture(1).save(held / "exact.png")  # the same pixels as t1
    buf = io.BytesIO()
    picture(2).resize((200, 150)).save(buf, "JPEG", quality=70)  # t2, smaller and recompressed
    (held / "near.jpg").write_bytes(buf.getvalue())
    picture(100).save(held / "other.png")
    assert main(["ingest", str(train), "--out", str(tmp_path / "pairs.parquet"), "--quiet", "--workers", "1"]) == 0
    return held


def save_model(path):
    """A tiny model with BatchNorm statistics of the pictures (random towers output ~0 in eval mode otherwise)."""
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # cumulative average: one pass gives exact statistics
        model.encode_image(torch.stack([to_tensor(picture(i).resize((32, 32))) for i in range(8)]))
    model.eval()
    save_pretrained(model, train_tokenizer(["a b c"] * 10, 120, 16), path, cfg)
    return path


def test_phash_removes_exact_and_resized_copies(tmp_path, capsys):
    held = setup(tmp_path)
    assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "d"),
                 "--quiet", "--workers", "1"]) == 0
    report = json.loads((tmp_path / "d" / "dedup_report.json").read_text())
    assert report["removed_images"] == 2 and report["removed_pairs"] == 2 and report["eval_images"] == 3
    assert {e["train"].rsplit("/", 1)[1] for e in report["examples"]} == {"t1.png", "t2.png"}
    assert len(read_keep(tmp_path / "d")) == 6


def test_embedding_mode_with_a_saved_model(tmp_path):
    held = setup(tmp_path)
    save_model(tmp_path / "model")
    assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "d"),
                 "--mode", "embedding", "--model", str(tmp_path / "model"), "--threshold", "0.99999",
                 "--quiet"]) == 0
    report = json.loads((tmp_path / "d" / "dedup_report.json").read_text())
    assert report["examples"][0]["train"].endswith("t1.png") and report["examples"][0]["score"] > 0.99999
    assert report["removed_images"] >= 1 and len(read_keep(tmp_path / "d")) == 8 - report["removed_images"]


def test_embedding_mode_needs_a_model(tmp_path, capsys):
    held = setup(tmp_path)
    assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "d"),
                 "--mode", "embedding", "--quiet"]) == 2
    assert "--model" in capsys.readouterr().err


def test_an_interrupted_dedup_resumes_its_finished_tasks(tmp_path, monkeypatch):
    # Before: eval.npy was written again by every run and its time was in every task's key: nothing resumed.
    from openalign.pipeline import runner  # the runner writes every keep-list and its report

    held = setup(tmp_path)
    args = ["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "d"), "--quiet",
            "--workers", "1", "--images-per-task", "2"]
    run_killed(monkeypatch, runner, "write_keep_without_images", args)  # every image scored, then killed
    assert main(args) == 0
    report = json.loads((tmp_path / "d" / "dedup_report.json").read_text())
    assert report["resumed_tasks"] == 4 and report["removed_images"] == 2
    picture(5).save(held / "exact5.png")  # another evaluation set: nothing of the killed run may be reused
    run_killed(monkeypatch, runner, "write_keep_without_images", args)
    assert main(args) == 0
    report = json.loads((tmp_path / "d" / "dedup_report.json").read_text())
    assert report["resumed_tasks"] == 4 and report["removed_images"] == 3  # this set's killed run, resumed


def test_bucket_dedup_flags_exactly_the_brute_force_pairs_that_share_a_bucket():
    from openalign.pipeline.curation import dedup as dd

    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    evaluation = unit(rng.normal(size=(300, 16))).astype(np.float32)
    near = unit(evaluation[:120] + rng.normal(scale=0.03, size=(120, 16))).astype(np.float32)  # cosine ~0.99
    train = np.concatenate([near, unit(rng.normal(size=(100, 16))).astype(np.float32)])
    centroids = dd.kmeans(evaluation, 100)
    index = dd.cell_index(dd.nearest_cells(evaluation, centroids, 10), len(centroids))
    cells = dd.nearest_cells(train, centroids, 10)
    rows, found = dd.bucket_pairs(cells, index, 3)
    cos = train @ evaluation.T
    flagged = {(int(i), int(j)) for i, j in zip(rows, found) if cos[i, j] > 0.975}
    # oracle: every pair by brute force, and the paper's buckets listed: every 3-of-10 combination of each image's
    # 10 nearest cells (numpy's full sort of the cosines), a pair sharing one of them
    import itertools

    top = lambda x: [sorted(np.argsort(-(v @ centroids.T), kind="stable")[:10].tolist()) for v in x]  # noqa: E731
    buckets = lambda x: [set(itertools.combinations(cells, 3)) for cells in top(x)]  # noqa: E731
    train_buckets, eval_buckets = buckets(train), buckets(evaluation)
    brute = {(i, j) for i, j in zip(*np.nonzero(cos > 0.975))}
    shared = {(i, j) for i, j in brute if train_buckets[i] & eval_buckets[j]}
    assert flagged <= brute  # every flagged pair is a duplicate
    assert shared <= flagged  # every duplicate that shares a bucket is flagged
    assert len(shared) >= 110 and len(flagged) / len(brute) >= 0.9  # near copies land in the same cells
    assert len(rows) / len(train) < 0.5 * len(evaluation)  # the point of buckets: far fewer comparisons
    # each row's score is its best cosine among the pairs it shares a bucket with (chunked like a task's rows)
    best, match, compared = dd.bucket_best(train, evaluation, cells, index, 3, rows_per_chunk=64)
    for i in range(len(train)):
        mine = found[rows == i]
        assert compared[i] == len(mine) and (match[i] == -1) == (len(mine) == 0)
        if len(mine):
            assert best[i] == pytest.approx(cos[i, mine].max(), abs=1e-6) and cos[i, match[i]] == cos[i, mine].max()


def test_bucket_mode_removes_what_it_finds_in_shared_buckets(tmp_path):
    held = setup(tmp_path)
    save_model(tmp_path / "model")
    common = ["--model", str(tmp_path / "model"), "--threshold", "0.99999", "--quiet"]
    for mode in ("embedding", "buckets"):
        assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / mode),
                     "--mode", mode, *common]) == 0
    exact = json.loads((tmp_path / "embedding" / "dedup_report.json").read_text())
    report = json.loads((tmp_path / "buckets" / "dedup_report.json").read_text())
    assert report["clusters"] == 3 and "sharing a bucket" in report["rule"]  # at most one cell per evaluation image
    assert list(report)[-6:] == ["nonfinite_scores", "clusters", "unbucketed_train_images",  # the report's own keys
                                 "comparisons_per_train_image", "seconds", "pair_table"]
    assert report["examples"][0]["train"].endswith("t1.png")  # the exact copy shares every bucket
    assert report["removed_images"] == exact["removed_images"] and read_keep(tmp_path / "buckets") == read_keep(
        tmp_path / "embedding")
    assert main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "x"),
                 "--mode", "buckets", "--choose", "11", *common]) == 2  # 11 of 10 cells: one sentence
