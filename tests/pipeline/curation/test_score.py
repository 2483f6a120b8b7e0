"""pipeline/curation/score.py: each pair's image-text cosine under a model, and the keep-list of the top fraction or of the
scores above a minimum."""

import json
import math
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import COLORS, SHAPES, run_killed, save_tiny_model, shape_image
from openalign.cli import main
from openalign.data.pairs import read_keep
from openalign.pipeline.curation import score as score_lib
from openalign.pipeline.curation.score import ScoreOptions, keep_count, score

COMBOS = [(colour, shape) for colour in COLORS for shape in SHAPES]


def picture(i: int):
    return shape_image(*COMBOS[i], size=64)


def captions() -> list[tuple[int, str]]:
    """(picture, caption): 10 pictures; picture 0 and 1 have two captions each, one caption is on two pictures."""
    rows = [(i, f"a {COMBOS[i][0]} {COMBOS[i][1]} number {i}") for i in range(10)]
    return rows + [(0, "a second caption for the first"), (1, "a shared caption"), (5, "a shared caption")]


def make_table(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(10):
        picture(i).save(folder / f"p{i}.png")
    lines = ["image,text"] + [f"p{i}.png,{text}" for i, text in captions()]
    (folder / "pairs.csv").write_text("\n".join(lines) + "\n")
    assert main(["ingest", str(folder / "pairs.csv"), "--out", str(tmp_path / "pairs.parquet"), "--quiet",
                 "--workers", "1"]) == 0
    (folder / "p9.png").write_bytes(b"damaged after ingest")  # its pair cannot be scored
    return tmp_path / "pairs.parquet"


def save_model(path, seed: int = 0):
    return save_tiny_model(path, [t for _, t in captions()], seed=seed)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    return make_table(root), save_model(root / "model")


def independent_cosines(pairs, model_dir) -> dict[str, float]:
    """Each pair's cosine, one pair at a time through the public encode functions."""
    from openalign.data import images, sources
    from openalign.data.transforms import vision_transform
    from openalign.model.encode import encode_images, encode_texts, load_for_inference

    model, tokenizer, cfg = load_for_inference(model_dir, "cpu")
    transform = vision_transform(cfg.model.vision)
    found = {}
    for row in pq.read_table(pairs).to_pylist():
        if row["path"].endswith("p9.png"):
            continue
        pixels = transform(images.load_rgb(sources.read_bytes(row["path"], row["member"])))
        image = encode_images(model, pixels[None])[0]
        text = encode_texts(model, tokenizer, [row["text"]], max_length=cfg.model.text.max_length)[0]
        found[row["uid"]] = float(image @ text)
    return found


def scores_of(out) -> dict[str, float]:
    return {r["uid"]: r["score"] for r in pq.read_table(out / "scores.parquet").to_pylist()}


def test_every_pair_s_score_is_its_own_cosine_and_the_top_fraction_is_kept_exactly(corpus, tmp_path):
    pairs, model = corpus
    result = score(pairs, tmp_path / "out", ScoreOptions(model=str(model), keep_fraction=0.5, images_per_task=3),
                   progress=False)
    expected = independent_cosines(pairs, model)
    got = scores_of(tmp_path / "out")
    assert len(got) == 12 and got.keys() == expected.keys()  # 13 pairs, one with an unreadable image
    assert max(abs(got[uid] - expected[uid]) for uid in got) < 1e-5
    assert len(set(np.round(list(got.values()), 4))) > 10  # the scores tell the pairs apart
    table = pq.read_table(tmp_path / "out" / "scores.parquet")
    assert set(table.column("model").to_pylist()) == {result.report["model_fingerprint"]}
    ranked = sorted(got, key=lambda uid: (-got[uid], uid))
    assert result.pairs == 13 and result.kept_pairs == 6 == keep_count(0.5, 13)
    assert read_keep(tmp_path / "out") == sorted(ranked[:6])
    assert result.threshold == got[ranked[5]]
    report = json.loads((tmp_path / "out" / "score_report.json").read_text())
    assert report["unscored_pairs"] == 1 and report["unreadable_images"] == 1 and report["images"] == 10
    assert sum(report["histogram"]["counts"]) == 12
    cut = next(c for c in report["cuts"] if c["fraction"] == 0.3)
    assert cut["kept"] == 3 and cut["threshold"] == got[ranked[2]]
    assert [e["rank"] for e in cut["border"]] == [1, 2, 3, 4, 5, 6] and [e["kept"] for e in cut["border"]] == [
        True, True, True, False, False, False]
    assert all(e["text"] and e["image"].endswith(".png") for e in cut["border"])
    assert (tmp_path / "out" / "score_report.png").stat().st_size > 0


def test_ties_at_the_cut_go_to_the_smaller_uid_and_a_minimum_keeps_every_score_above_it(tmp_path, monkeypatch):
    uids = [f"{i:02x}" for i in range(12)]
    values = [0.9, 0.5, 0.5, 0.5, 0.5, 0.1, float("nan"), 0.7, 0.5, float("inf"), -0.2, 0.3]
    pq.write_table(pa.table({"uid": uids, "score": values}), tmp_path / "scores.parquet")
    from openalign.data.engine import Engine

    kept = score_lib._write_keep(tmp_path / "scores.parquet", tmp_path, score_lib.FINITE, 4, Engine())
    finite = [(-v, u) for u, v in zip(uids, values) if math.isfinite(v)]
    assert kept == 4 and sorted(pq.read_table(tmp_path / "keep.parquet").column("uid").to_pylist()) == sorted(
        u for _, u in sorted(finite)[:4]) == ["00", "01", "02", "07"]
    score_lib._write_keep(tmp_path / "scores.parquet", tmp_path, f"{score_lib.FINITE} AND score >= 0.5", None, Engine())
    assert sorted(pq.read_table(tmp_path / "keep.parquet").column("uid").to_pylist()) == [
        "00", "01", "02", "03", "04", "07", "08"]


def test_the_fraction_is_read_as_the_decimal_it_is_written_as():
    assert keep_count(0.29, 100) == 29 and keep_count(0.3, 10) == 3 and keep_count(1.0, 7) == 7
    assert keep_count(0.5, 13) == 6 and keep_count(0.001, 999) == 0


def test_another_cut_reuses_the_scores_and_another_model_scores_again(corpus, tmp_path, monkeypatch, capsys):
    pairs, model = corpus
    args = ["score", str(pairs), "--model", str(model), "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*args, "--keep-fraction", "0.3"]) == 0
    first = scores_of(tmp_path / "out")
    with monkeypatch.context() as patch:
        patch.setattr(score_lib, "score_task", lambda *a: (_ for _ in ()).throw(AssertionError("scored again")))
        assert main([*args, "--min-score", "0"]) == 0
    assert "(scores reused)" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "score_report.json").read_text())
    assert report["reused_scores"] and report["kept_pairs"] == sum(v >= 0 for v in first.values())
    other = save_model(tmp_path / "other", seed=1)
    assert main(["score", str(pairs), "--model", str(other), "--out", str(tmp_path / "out"), "--quiet",
                 "--min-score", "0"]) == 0
    again = json.loads((tmp_path / "out" / "score_report.json").read_text())
    assert not again["reused_scores"] and scores_of(tmp_path / "out") != first


def test_a_killed_score_leaves_no_keep_list_and_resumes_its_finished_jobs(corpus, tmp_path, monkeypatch):
    pairs, model = corpus
    args = ["score", str(pairs), "--model", str(model), "--out", str(tmp_path / "out"), "--quiet",
            "--keep-fraction", "0.3", "--images-per-task", "4"]
    run_killed(monkeypatch, score_lib, "_write_scores", args)  # every job done, then killed
    assert not (tmp_path / "out" / "score_report.json").exists()
    assert main(args) == 0
    assert len(read_keep(tmp_path / "out")) == 3


def test_the_keep_list_composes_with_shard(corpus, tmp_path):
    pairs, model = corpus
    assert main(["score", str(pairs), "--model", str(model), "--out", str(tmp_path / "s"), "--quiet",
                 "--keep-fraction", "0.5"]) == 0
    assert main(["shard", str(pairs), "--keep", str(tmp_path / "s"), "--out", str(tmp_path / "shards"), "--quiet",
                 "--image-size", "32"]) == 0
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    kept = set(read_keep(tmp_path / "s"))
    images = {r["image_key"] for r in pq.read_table(pairs).to_pylist() if r["uid"] in kept}
    assert len(kept) == 6 and manifest["n_samples"] == len(images)  # one sample per image, with its kept texts


@pytest.mark.parametrize("flags, message", [
    ([], "--model"),
    (["--model", "MODEL"], "give one of --keep-fraction F"),
    (["--model", "MODEL", "--keep-fraction", "0.3", "--min-score", "0.1"], "give one of --keep-fraction F"),
    (["--model", "MODEL", "--keep-fraction", "0"], "must be in (0, 1]"),
    (["--model", "MODEL", "--min-score", "nan"], "must be a finite number"),
    (["--model", "nowhere", "--min-score", "0.2"], "is not a directory"),
])
def test_bad_options_are_one_sentence(corpus, tmp_path, capsys, flags, message):
    pairs, model = corpus
    flags = [str(model) if f == "MODEL" else f for f in flags]
    assert main(["score", str(pairs), "--out", str(tmp_path / "out"), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "keep.parquet").exists()


@pytest.mark.skipif(shutil.which("java") is None,
                    reason="the Spark engine needs Java (apt-get install default-jre-headless)")
def test_spark_scores_and_keeps_what_the_local_engine_does(corpus, tmp_path, monkeypatch):
    from openalign.data.engine import Engine

    pairs, model = corpus
    options = ScoreOptions(model=str(model), keep_fraction=0.4, images_per_task=4)
    local = score(pairs, tmp_path / "local", options, progress=False)
    plans = []
    writer = score_lib.write_keep_spark

    def spy(frame, path):  # the keep-list's physical plan: before, a sort and limit(k) in one partition
        plans.append(frame.sparkSession._jvm.PythonSQLUtils.explainString(frame._jdf.queryExecution(), "simple"))
        return writer(frame, path)

    monkeypatch.setattr(score_lib, "write_keep_spark", spy)
    spark = score(pairs, tmp_path / "spark", options, progress=False, engine=Engine("spark", "local[2]", retries=2))
    assert len(plans) == 1 and "Filter" in plans[0]
    assert not any(word in plans[0] for word in ("SinglePartition", "TakeOrderedAndProject", "GlobalLimit", "Sort")), \
        plans[0]
    assert read_keep(tmp_path / "local") == read_keep(tmp_path / "spark") and local.kept_pairs == 5
    assert scores_of(tmp_path / "local") == {r["uid"]: r["score"] for r in pq.read_table(
        tmp_path / "spark" / "scores.parquet").to_pylist()}
    differ = ("engine", "seconds", "keep", "scores")
    assert {k: v for k, v in local.report.items() if k not in differ} == {
        k: v for k, v in spark.report.items() if k not in differ}


def test_a_model_whose_vectors_are_nan_keeps_nothing_and_says_so(corpus, tmp_path, capsys):
    """Before: with NaN text vectors, score wrote keep.parquet and then failed drawing its report (a `ValueError`
    traceback from matplotlib): no score was finite, so the histogram had no edges."""
    from conftest import poison

    pairs, model = corpus
    bad = poison(shutil.copytree(model, tmp_path / "nan"), "text_projection")
    assert main(["score", str(pairs), "--model", str(bad), "--keep-fraction", "0.5", "--out", str(tmp_path / "out"),
                 "--workers", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "has a finite score" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "score_report.json").exists()  # no finished keep-list


def test_a_vector_that_is_nan_infinite_or_zero_is_not_usable():
    from openalign.pipeline.curation.scoring import usable

    vectors = np.array([[0.6, 0.8], [np.nan, 1.0], [np.inf, 0.0], [0.0, 0.0], [0.0, -1e-30]], np.float32)
    assert usable(vectors).tolist() == [True, False, False, False, True]
