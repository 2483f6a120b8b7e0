"""`openalign study`: every variant over seeds, resumable, summarized as tables, a plot and JSON."""

import json

from openalign import cli, presets
from openalign.study import ablation


def test_ablation_plan_changes_one_thing_per_variant():
    base = presets.get("demo")
    plan = ablation.variants(base)
    assert [v for v in plan if v.baseline] == [plan[0]] and plan[0].overrides == ()
    assert all(len(v.overrides) == 1 for v in plan[1:])
    assert {v.group for v in plan[1:]} == {"embedding dimension", "in-batch negatives", "temperature",
                                           "temperature init and lr", "label smoothing", "loss"}
    dims = [v.overrides[0] for v in plan if v.group == "embedding dimension"]
    assert dims == [f"model.embed_dim={base.model.embed_dim // f}" for f in (2, 4, 8)]
    assert "loss.fixed_temperature=0.0078125" in [v.overrides[0] for v in plan[1:]]  # 1/128


def test_study_runs_variants_over_seeds_resumes_and_reports(shapes, tmp_path, monkeypatch):
    argv = ["study", "ablation", "--out", str(tmp_path / "study"), "--preset", "tiny", "--data", str(shapes["train"]),
            "--eval-data", str(shapes["eval"]), "--only", "label smoothing", "--seeds", "2", "--quiet",
            "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0"]
    assert cli.main(argv) == 0
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    assert list(results["variants"]) == ["baseline", "no_smoothing"] and results["seeds"] == 2
    baseline = results["variants"]["baseline"]
    assert len(baseline["runs"]) == 2 and baseline["runs"][0] != baseline["runs"][1]  # two seeds, two runs
    recalls = [r["mean_recall"] for r in baseline["runs"]]
    assert abs(baseline["mean"]["mean_recall"] - sum(recalls) / 2) < 1e-12
    assert abs(baseline["std"]["mean_recall"] - abs(recalls[0] - recalls[1]) / 2) < 1e-12
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## label smoothing" in report and "no label smoothing" in report and " ± " in report
    assert (tmp_path / "study" / "study.png").stat().st_size > 0
    # a second call trains nothing: every run has its result
    import openalign.train.trainer as trainer

    monkeypatch.setattr(trainer, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "study" / "results.json").read_text())["variants"] == results["variants"]


def test_unknown_study_and_bad_override_are_one_line_errors(tmp_path, capsys):
    assert cli.main(["study", "nosuch", "--out", str(tmp_path)]) == 2
    assert "unknown study 'nosuch'" in capsys.readouterr().err
    assert cli.main(["study", "ablation", "--out", str(tmp_path), "--preset", "tiny", "optim.lrr=1"]) == 2
    assert "did you mean optim.lr" in capsys.readouterr().err


def test_noise_vs_scale_plan_varies_only_the_corpus():
    from openalign import config as config_lib
    from openalign.data.corpora import corpus_dir, corpus_options
    from openalign.study import noise_scale

    base = presets.get("demo")
    plan = noise_scale.variants(base)
    assert [v.name for v in plan] == ["clean_x1", "noisy_x1", "noisy_x2", "noisy_x4"] and plan[0].baseline
    dirs = set()
    for v in plan:
        cfg = config_lib.override(base, list(v.overrides))
        assert cfg.model == base.model and cfg.train == base.train  # the same model and budget
        options = corpus_options("emoji", cfg.data.corpus_options)
        assert options["noise"] == (0.0 if v.baseline else noise_scale.NOISE)
        assert options.get("copies", 1) == (1 if v.baseline else int(v.name[-1]))
        dirs.add(corpus_dir("emoji", cfg.data.corpus_options))
    assert len(dirs) == 4  # four corpora side by side


def test_noise_vs_scale_report_says_where_noisy_data_catches_up(tmp_path):
    from openalign.study import noise_scale

    def row(recall):
        return {"mean": {"mean_recall": recall, "zeroshot_top1": recall / 2},
                "std": {"mean_recall": 0.0, "zeroshot_top1": 0.0}}

    results = {"clean_x1": row(0.05), "noisy_x1": row(0.03), "noisy_x2": row(0.05), "noisy_x4": row(0.07)}
    lines = noise_scale.extra_report(results, tmp_path)
    assert "reaches the clean corpus's mean recall (0.050) at 2x its size" in "\n".join(lines)
    assert (tmp_path / "noise_vs_scale.png").stat().st_size > 0
    results["noisy_x4"] = row(0.04)
    results["noisy_x2"] = row(0.049)
    assert "does not reach" in "\n".join(noise_scale.extra_report(results, tmp_path))
    assert noise_scale.extra_report({"clean_x1": row(0.05)}, tmp_path) == []
