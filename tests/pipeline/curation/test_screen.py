import json

from PIL import Image

from conftest import run_killed
from openalign.cli import main
from openalign.data.pairs import read_keep

CLASSIFIER = '''
import numpy as np

def redness(images):
    return [float(np.asarray(im)[..., 0].mean() / 255) for im in images]
'''


def test_a_user_classifier_drops_flagged_images(tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, colour in enumerate(["red", "blue", "red", "green"]):
        Image.new("RGB", (240, 240), colour).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a {colour} square number {i}")
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    main(["ingest", str(folder), "--out", str(tmp_path / "p.parquet"), "--quiet", "--workers", "1"])
    assert main(["screen", str(tmp_path / "p.parquet"), "--classifier", f"{tmp_path / 'clf.py'}:redness",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    report = json.loads((tmp_path / "s" / "screen_report.json").read_text())
    # the two red squares are one image (same bytes): one image, two pairs removed
    assert (report["removed_images"], report["removed_pairs"], report["scored_images"]) == (1, 2, 3)
    assert len(read_keep(tmp_path / "s")) == 2
    assert main(["screen", str(tmp_path / "p.parquet"), "--classifier", "no_such_module:f", "--out",
                 str(tmp_path / "s2")]) == 2
    assert "cannot import" in capsys.readouterr().err


def squares(tmp_path, colours=("red", "blue", "red", "green")):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, colour in enumerate(colours):
        Image.new("RGB", (240, 240), colour).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a {colour} square number {i}")
    assert main(["ingest", str(folder), "--out", str(tmp_path / "p.parquet"), "--quiet", "--workers", "1"]) == 0
    return tmp_path / "p.parquet"


def test_a_classifier_returning_nan_removes_nothing_and_is_counted(tmp_path):
    # Before: DuckDB orders NaN above every number, so `score >= 0.5` removed 752 of 752 images.
    pairs = squares(tmp_path)
    (tmp_path / "nan.py").write_text("def score(images):\n    return [float('nan') if i % 2 else float('inf')"
                                     " for i in range(len(images))]\n")
    assert main(["screen", str(pairs), "--classifier", f"{tmp_path / 'nan.py'}:score", "--out", str(tmp_path / "s"),
                 "--quiet"]) == 0
    report = json.loads((tmp_path / "s" / "screen_report.json").read_text())
    assert (report["removed_images"], report["removed_pairs"]) == (0, 0) and report["nonfinite_scores"] == 3
    assert len(read_keep(tmp_path / "s")) == 4


def test_a_rerun_after_the_classifier_changed_scores_again(tmp_path, monkeypatch, capsys):
    # Before: a relative --classifier path was never fingerprinted: after a killed run, the edited classifier's
    # rerun reused the old scores.
    from openalign.pipeline import runner  # the runner writes every keep-list and its report

    pairs = squares(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    args = ["screen", str(pairs), "--classifier", "clf.py:redness", "--out", str(tmp_path / "s"), "--quiet"]
    run_killed(monkeypatch, runner, "write_keep_without_images", args)  # every image scored, then killed
    assert not (tmp_path / "s" / "screen_report.json").exists()
    (tmp_path / "clf.py").write_text(CLASSIFIER.replace("[..., 0]", "[..., 2]"))  # now it flags blue
    capsys.readouterr()
    assert main(args) == 0
    assert "screen: running again 1 job (its inputs or options changed)" in capsys.readouterr().err
    report = json.loads((tmp_path / "s" / "screen_report.json").read_text())
    assert (report["removed_images"], report["removed_pairs"], report["resumed_tasks"]) == (1, 1, 0)


def test_score_files_of_another_plan_are_never_read(tmp_path):
    # Before: the keep-list read OUT/_work/scores-*.parquet, so a killed run's extra task files counted.
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = squares(tmp_path)
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    work = tmp_path / "s" / "_work"
    work.mkdir(parents=True)
    keys = pq.read_table(pairs, columns=["image_key"]).column(0).to_pylist()
    pq.write_table(pa.table({"image_key": keys, "score": [1.0] * len(keys), "match": [None] * len(keys)}),
                   work / "scores-999999.parquet")  # a stale task of a larger plan: every image flagged
    assert main(["screen", str(pairs), "--classifier", f"{tmp_path / 'clf.py'}:redness", "--out", str(tmp_path / "s"),
                 "--quiet"]) == 0
    report = json.loads((tmp_path / "s" / "screen_report.json").read_text())
    assert (report["removed_images"], report["removed_pairs"]) == (1, 2)


def test_an_interrupted_screen_leaves_no_keep_list_that_shard_would_take(tmp_path, monkeypatch, capsys):
    from openalign.pipeline import runner  # the runner writes every keep-list and its report

    pairs = squares(tmp_path)
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    args = ["screen", str(pairs), "--classifier", f"{tmp_path / 'clf.py'}:redness", "--out", str(tmp_path / "s"),
            "--quiet"]
    assert main(args) == 0
    run_killed(monkeypatch, runner, "write_keep_report", args)  # a rerun killed after the new keep-list, before its
                                                                    # report
    capsys.readouterr()
    assert main(["shard", str(pairs), "--keep", str(tmp_path / "s"), "--out", str(tmp_path / "shards"), "--quiet"]) == 2
    assert "has no report of its stage beside it" in capsys.readouterr().err
