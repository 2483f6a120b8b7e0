"""`openalign study`: every variant over seeds, resumable, summarized as tables, a plot and JSON."""

import json

import pytest

from conftest import needs_emoji_data, read_jsonl
from openalign import cli, presets
from openalign.config import ConfigError
from openalign.study import ablation


def test_ablation_plan_changes_one_thing_per_variant():
    base = presets.get("demo")
    plan = ablation.variants(base)
    assert [v for v in plan if v.baseline] == [plan[0]] and plan[0].overrides == ()
    # the sigmoid loss has no label smoothing to keep (the config refuses it there): its one change is the loss
    assert all(len(v.overrides) == 1 for v in plan[1:] if v.name != "sigmoid")
    assert [v.overrides for v in plan if v.name == "sigmoid"] == [("loss.kind=sigmoid", "loss.label_smoothing=0")]
    assert {v.group for v in plan[1:]} == {"embedding dimension", "in-batch negatives", "temperature",
                                           "temperature init and lr", "label smoothing", "loss", "loss direction"}
    dims = [v.overrides[0] for v in plan if v.group == "embedding dimension"]
    assert dims == [f"model.embed_dim={base.model.embed_dim // f}" for f in (2, 4, 8)]
    assert "loss.temperature.fixed=0.0078125" in [v.overrides[0] for v in plan[1:]]  # 1/128


def test_study_runs_variants_over_seeds_resumes_and_reports(shapes, tmp_path, monkeypatch):
    argv = ["study", "ablation", "--out", str(tmp_path / "study"), "--preset", "tiny", "--data", str(shapes["train"]),
            "--eval-data", str(shapes["eval"]), "--only", "label smoothing", "--only", "rows_only", "--seeds", "2", "--quiet",
            "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0"]
    assert cli.main(argv) == 0
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    assert list(results["variants"]) == ["baseline", "no_smoothing", "rows_only"] and results["seeds"] == 2
    baseline = results["variants"]["baseline"]
    assert len(baseline["runs"]) == 2 and baseline["runs"][0] != baseline["runs"][1]  # two seeds, two runs
    recalls = [r["mean_recall"] for r in baseline["runs"]]
    assert abs(baseline["mean"]["mean_recall"] - sum(recalls) / 2) < 1e-12
    assert abs(baseline["std"]["mean_recall"] - abs(recalls[0] - recalls[1]) / 2) < 1e-12
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## label smoothing" in report and "no label smoothing" in report and " ± " in report
    # Table 8's KNN column: KNN R@1 of the held-out split's classes, each dealt alternately to train and test
    assert 0 <= baseline["mean"]["knn_top1"] <= 1 and baseline["runs"][0]["knn_n_test"] > 0
    assert "| KNN R@1 |" in report.replace(" | KNN R@1 | ", "| KNN R@1 |")
    # the loss-direction group's threshold table: the baseline's and the row loss's spreads, from their runs
    table = report[report.index("## One threshold for every query?"):].splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in table if line.startswith("| ")}
    std = results["variants"]["rows_only"]["mean"]["t2i_threshold_std"]
    assert f"{std:.3f} ± " in rows["row loss alone (image→text)"] and "baseline" in " ".join(rows)
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
    from openalign.corpora import corpus_dir, corpus_options
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


TINY = ["--preset", "tiny", "--quiet", "train.steps=2", "train.eval_every=0", "train.checkpoint_every=0"]


def run_study(name: str, out, *overrides: str) -> dict:
    assert cli.main(["study", name, "--out", str(out), *TINY, *overrides]) == 0
    return json.loads((out / "results.json").read_text())["variants"]


@needs_emoji_data
def test_noise_vs_scale_pipeline_on_a_tiny_corpus(tmp_path):
    variants = run_study("noise-vs-scale", tmp_path / "study", f"data.data_dir={tmp_path / 'data'}",
                         "data.corpus_options=limit=120")
    assert list(variants) == ["clean_x1", "noisy_x1", "noisy_x2", "noisy_x4"]
    built = {json.loads((d / "train" / "manifest.json").read_text())["n_samples"]
             for d in (tmp_path / "data").iterdir()}
    assert len(built) == 3  # 1x (clean and noisy), 2x and 4x the training images
    assert variants["noisy_x4"]["paper"]["MSCOCO I2T R@1"] == 23.8
    # KNN's classes are the held-out emoji families; 120 emoji hold no family of two, so there is no KNN, not a crash
    assert not any("knn_top1" in v["mean"] for v in variants.values())
    report = (tmp_path / "study" / "report.md").read_text()
    assert "paper: MSCOCO I2T R@1" in report and "Table 10" in report
    assert (tmp_path / "study" / "noise_vs_scale.png").stat().st_size > 0


@needs_emoji_data
def test_multilingual_pipeline_reports_every_language(tmp_path):
    from openalign.study import multilingual

    variants = run_study("multilingual", tmp_path / "study", f"data.data_dir={tmp_path / 'data'}",
                         "data.corpus_options=limit=150")
    languages = multilingual.TRAIN_LANGUAGES + multilingual.HELDOUT_LANGUAGES
    for name in ("english", "multilingual"):
        assert all(f"multilingual_{lang}_mean_recall" in variants[name]["mean"] for lang in languages)
    trained = json.loads((tmp_path / "study" / "runs" / "multilingual" / "seed0" / "config.json").read_text())
    assert trained["model"]["text"]["vocab_size"] > 0
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Mean recall per language (held-out emoji)" in report and "| ko | **no** |" in report
    assert (tmp_path / "study" / "multilingual.png").stat().st_size > 0


@needs_emoji_data
def test_model_vs_data_pipeline(tmp_path):
    variants = run_study("model-vs-data", tmp_path / "study", f"data.data_dir={tmp_path / 'data'}",
                         "data.corpus_options=limit=300")
    assert list(variants) == ["large_full", "large_10", "large_clean", "small_full", "small_10", "small_clean"]
    small = json.loads((tmp_path / "study" / "runs" / "small_full" / "seed0" / "config.json").read_text())
    large = json.loads((tmp_path / "study" / "runs" / "large_full" / "seed0" / "config.json").read_text())
    assert small["model"]["text"]["hidden_size"] * 2 == large["model"]["text"]["hidden_size"]
    assert small["model"]["embed_dim"] == large["model"]["embed_dim"]
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Model size against data size" in report and "## smaller model" in report
    assert (tmp_path / "study" / "model_vs_data.png").stat().st_size > 0


def test_model_vs_data_on_your_shards_samples_them_with_data_fraction(tmp_path):
    import dataclasses

    from openalign import config as config_lib
    from openalign.study import model_data

    base = dataclasses.replace(presets.get("demo"), data=dataclasses.replace(presets.get("demo").data, train="SHARDS"))
    plan = model_data.variants(base)
    assert [v.name for v in plan] == ["large_full", "large_10", "small_full", "small_10"]  # no clean row
    for v in plan:
        cfg = config_lib.override(base, list(v.overrides))
        assert cfg.data.fraction == (0.1 if v.name.endswith("_10") else 1.0) and cfg.data.train == "SHARDS"
        assert cfg.data.corpus_options == base.data.corpus_options
    with pytest.raises(ConfigError, match="--data SHARDS"):
        model_data.variants(dataclasses.replace(base, data=dataclasses.replace(base.data, train="", corpus="shapes")))

    def row(recall):
        return {"group": "g", "mean": {"mean_recall": recall}, "std": {"mean_recall": 0.0}}

    lines = model_data.extra_report({"large_full": row(0.3), "large_10": row(0.2), "small_full": row(0.1),
                                     "small_10": row(0.1)}, tmp_path)
    assert "base model +0.100, smaller model +0.000: the larger model gains more" in "\n".join(lines)
    assert (tmp_path / "model_vs_data.png").stat().st_size > 0


def test_compositional_pipeline(tmp_path):
    variants = run_study("compositional", tmp_path / "study", f"data.data_dir={tmp_path / 'data'}",
                         "data.corpus=shapes", "data.corpus_options=per_combo=1,eval_seen=1,eval_unseen=2")
    assert list(variants) == ["noise0", "noise0.2", "noise0.5"]
    # oracle: each run's saved model, evaluated afresh on its own corpus's held-out split (one seed: mean = run)
    from openalign import config as config_lib
    from openalign.corpora import resolve_data
    from openalign.eval.options import EvalOptions
    from openalign.eval.tasks import configure, run_tasks
    from openalign.model.hub import load_pretrained

    for name, row in variants.items():
        run = tmp_path / "study" / "runs" / name / "seed0"
        cfg = config_lib.load(run / "config.json")
        model, tokenizer, _ = load_pretrained(run / "model")
        common = EvalOptions(encode_batch=cfg.eval.encode_batch, max_length=cfg.model.text.max_length,
                             resize=cfg.model.vision.resize_size, crop=cfg.model.vision.image_size)
        fresh, _ = run_tasks(model, tokenizer, resolve_data(cfg.data, progress=False)[1], ["compositional"], common,
                             configure(["compositional"], templates=cfg.eval.templates), progress=False)
        assert row["mean"]["compositional_unseen_top1"] == pytest.approx(fresh["compositional_unseen_top1"])
        assert row["chance"]["compositional_unseen_top1"] == 1 / 64
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Unseen colour-shape pairs" in report and "arithmetic R@10" in report
    assert (tmp_path / "study" / "compositional.png").stat().st_size > 0


def test_temperature_settles_where_it_stays_within_the_band():
    from openalign.study.dynamics import settle_step

    temps = [(10, 1.0), (20, 0.5), (30, 0.1), (40, 0.2), (50, 0.11), (60, 0.1)]
    assert settle_step(temps) == 50  # 0.2 at step 40 is outside 1.2x of 0.1
    assert settle_step(temps, near=2.5) == 30 and settle_step([(5, 0.3)]) == 5


def test_dynamics_pipeline_plots_temperature_and_geometry_over_steps(shapes, tmp_path):
    variants = run_study("dynamics", tmp_path / "study", "--data", str(shapes["train"]), "--eval-data",
                         str(shapes["eval"]), "train.steps=4", "train.eval_every=2", "--seeds", "2")
    assert list(variants) == ["t_init1", "t_init0.07"]
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Over the steps of training" in report and "Mean ± std over 2 seed(s)" in report
    row = next(line for line in report.splitlines() if line.startswith("| init T = 1 (paper) | ") and "→" in line)
    finals = [r["temperature"] for r in variants["t_init1"]["runs"]]
    assert row.split(" | ")[1].startswith(f"{sum(finals) / 2:.4f} ± ")  # the mean over both seeds
    assert (tmp_path / "study" / "dynamics.png").stat().st_size > 0


def test_noise_vs_scale_on_shapes_scales_distinct_drawings_and_reports_zero_shot(tmp_path):
    from openalign import config as config_lib
    from openalign.corpora import corpus_options
    from openalign.study import STUDIES, noise_scale

    base = config_lib.override(presets.get("demo"), ["data.corpus=shapes", "data.corpus_options=per_combo=10"])
    plan = noise_scale.variants(base)
    sizes = [corpus_options("shapes", config_lib.override(base, list(v.overrides)).data.corpus_options)["per_combo"]
             for v in plan]
    assert sizes == [10, 10, 20, 40]
    assert all("retrieval" not in config_lib.override(base, list(v.overrides)).eval.tasks for v in plan)
    assert STUDIES["noise-vs-scale"].headline(base) == ("zeroshot_top1", "zero-shot top-1")
    assert STUDIES["noise-vs-scale"].headline(presets.get("demo")) == ("mean_recall", "mean recall")

    def row(top1):
        return {"mean": {"zeroshot_top1": top1}, "std": {"zeroshot_top1": 0.0}}

    results = {"clean_x1": row(0.5), "noisy_x1": row(0.2), "noisy_x2": row(0.4), "noisy_x4": row(0.6)}
    assert "reaches the clean corpus's zero-shot top-1 (0.500) at 4x" in "\n".join(
        noise_scale.extra_report(results, tmp_path))


def test_an_interrupted_run_starts_again_or_resumes(shapes, tmp_path, monkeypatch):
    from openalign import config as config_lib
    from openalign.study import runner

    cfg = config_lib.override(presets.get("tiny"), [f"data.train={shapes['train']}", f"data.eval={shapes['eval']}",
                                                  "train.steps=2", "train.checkpoint_every=0"])
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 99.0, "temperature": 9.0}\n')  # killed, no checkpoint
    row = runner.run_one(cfg, out)
    assert row["final_loss"] != 99.0 and len(read_jsonl(out / "metrics.jsonl")) == 3  # two steps and the eval
    (out / "result.json").unlink()
    (out / "checkpoint.pt").write_bytes(b"")  # now with a checkpoint: the run resumes from it
    import openalign.train.trainer as trainer

    def fake_train(c, resume=False, progress=True):
        raise RuntimeError(f"resume={resume}")

    monkeypatch.setattr(trainer, "train", fake_train)
    with pytest.raises(RuntimeError, match="resume=True"):
        runner.run_one(cfg, out)
    assert (out / "metrics.jsonl").is_file()  # kept for the resumed run


def test_a_finished_run_is_reused_only_for_the_same_config_and_data(shapes, tmp_path, monkeypatch):
    # Before: run_one returned an earlier result.json whatever the config it was now asked to run.
    from openalign import config as config_lib
    from openalign.study import runner

    base = [f"data.train={shapes['train']}", f"data.eval={shapes['eval']}", "train.steps=2", "train.checkpoint_every=0"]
    cfg = config_lib.override(presets.get("tiny"), base)
    out = tmp_path / "run"
    first = runner.run_one(cfg, out)
    import openalign.train.trainer as trainer

    calls = []
    real = trainer.train
    monkeypatch.setattr(trainer, "train", lambda c, **k: calls.append(c) or real(c, **k))
    assert runner.run_one(cfg, out) == first and calls == []  # the same config: reused
    changed = runner.run_one(config_lib.override(cfg, ["seed=1"]), out)
    assert len(calls) == 1 and calls[0].seed == 1 and changed["final_loss"] != first["final_loss"]


def test_loss_batch_plan_sees_the_same_examples_at_every_batch(tmp_path):
    from openalign import config as config_lib
    from openalign.config import check
    from openalign.study import QUICK, loss_batch

    base = config_lib.override(presets.get("demo"), list(QUICK))
    plan = loss_batch.variants(base)
    assert [v.name for v in plan] == [f"{k}_b{b}" for k in ("softmax", "sigmoid") for b in (32, 64, 128, 256, 512)]
    for v in plan:
        cfg = config_lib.override(base, list(v.overrides))
        check(cfg)  # every run is a valid config
        assert cfg.train.steps * cfg.data.global_batch == base.train.steps * base.data.global_batch == 12_800
        assert cfg.model == base.model and cfg.optim.lr == base.optim.lr
        assert cfg.optim.warmup_steps <= cfg.train.steps
        if v.name.startswith("sigmoid"):
            assert (cfg.loss.kind, cfg.loss.label_smoothing, cfg.loss.temperature.init) == ("sigmoid", 0.0, 0.1)
    assert [v.name for v in plan if v.baseline] == ["softmax_b128", "sigmoid_b128"]

    def row(recall):
        return {"mean": {"mean_recall": recall}, "std": {"mean_recall": 0.01}}

    results = {f"{k}_b{b}": row(0.05 + (0.02 if k == "sigmoid" and b < 128 else 0.0)) for k in ("softmax", "sigmoid")
               for b in (32, 64, 128, 256, 512)}
    lines = loss_batch.extra_report(results, tmp_path)
    assert "| 32 | 0.050 ± 0.010 | 0.070 ± 0.010 | +0.020 |" in lines and "| 512 | 0.050 ± 0.010 | 0.050 ± 0.010 | +0.000 |" in lines
    assert (tmp_path / "loss_batch.png").stat().st_size > 0


@needs_emoji_data
def test_noise_vs_scale_with_distinct_sources_measures_each_sources_heldout_split(tmp_path):
    """--sources: clean emoji against emoji + openclipart (a small synthetic tree in its layout) + shapes, every arm
    evaluated on each source's held-out split and on their union."""
    import numpy as np
    from PIL import Image

    root = tmp_path / "png" / "animals" / "birds"
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(24):
        Image.fromarray(rng.integers(0, 255, (240, 260, 3), dtype=np.uint8)).save(root / f"bird_{i}_author.png")
    options = (f"data.corpus_options=emoji.limit=60,openclipart.root={tmp_path / 'png'},openclipart.image_size=64,"
               "openclipart.heldout=0.25,shapes.per_combo=1,shapes.eval_seen=1,shapes.eval_unseen=1")
    assert cli.main(["study", "noise-vs-scale", "--sources", "--out", str(tmp_path / "study"), *TINY,
                     f"data.data_dir={tmp_path / 'data'}", options]) == 0
    variants = json.loads((tmp_path / "study" / "results.json").read_text())["variants"]
    assert list(variants) == ["clean_x1", "noisy_x2", "noisy_x4"]
    runs = {name: row["runs"][0] for name, row in variants.items()}
    for row in runs.values():  # the same held-out splits for every arm, each alone and together
        assert row["n_images"] == sum(row[f"{s}/n_images"] for s in ("emoji", "openclipart", "shapes"))
    assert len({(r["emoji/n_images"], r["openclipart/n_images"], r["shapes/n_images"]) for r in runs.values()}) == 1
    assert runs["clean_x1"]["openclipart/n_images"] > 0
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Clean data against noisy sources added" in report and "| openclipart |" in report
    assert (tmp_path / "study" / "noise_vs_sources.png").stat().st_size > 0
    trained = {d.name for d in (tmp_path / "data").iterdir()}
    assert any(d.startswith("emoji-") for d in trained) and any(d.startswith("shapes-") for d in trained)
    assert cli.main(["study", "ablation", "--sources", "--out", str(tmp_path / "x"), *TINY]) == 2  # its own flag


def test_several_corpora_options_name_their_corpus(tmp_path):
    from openalign.config import override
    from openalign.corpora import resolve_data

    cfg = override(presets.get("tiny"), ["data.corpus=emoji+shapes", "data.corpus_options=noise=0.5"])
    with pytest.raises(ConfigError, match="each option names its corpus, as emoji.noise=0.5"):
        resolve_data(cfg.data, progress=False)
    with pytest.raises(ConfigError, match="unknown built-in corpus 'shape'.*did you mean shapes"):
        resolve_data(override(cfg, ["data.corpus=emoji+shape"]).data, progress=False)


def test_failure_modes_composition_toy_through_main(tmp_path, capsys):
    """The teaching's composition toy at its smallest: both towers trained, the held-out pairs scored, a report with
    the table, the teaching's figures beside ours, and a plot."""
    out = tmp_path / "fm"
    assert cli.main(["study", "failure-modes", "--only", "composition-toy", "--seeds", "2", "--out", str(out), "--quiet",
                     "toy_steps=300", "toy_test=20"]) == 0
    results = json.loads((out / "results.json").read_text())["composition-toy"]
    for tower in ("linear", "hidden"):
        row = results["towers"][tower]
        assert 0 <= row["mean"]["heldout_accuracy"] <= 1 and len(row["curves"]) == 2
        assert row["curves"][0][-1] < row["curves"][0][0]  # it learned
        assert row["mean"]["logit_scale"] <= 100.0 + 1e-6  # the cap
    report = (out / "report.md").read_text()
    assert "| one linear map (32→8) |" in report and "| 96% |" in report and "Composition:" in report
    assert (out / "composition_toy.png").stat().st_size > 0
    assert "held-out pairs recognised" in capsys.readouterr().out
    assert cli.main(["study", "failure-modes", "--only", "nosuch", "--out", str(out), "--quiet"]) == 2


def test_composition_toy_captions_are_bags_of_its_fifteen_words():
    import torch

    from openalign.study import failure_modes as fm

    assert len(fm.VOCAB) == 15 and len(fm.HELD_OUT) == 4
    ids, offsets = fm._captions([("red", "cone"), ("blue", "star")], torch.Generator().manual_seed(0), 2)
    first = ids[:offsets[1]].tolist()
    assert first[:2] == [fm.VOCAB.index("red"), fm.VOCAB.index("cone")] and len(first) <= 4
    assert all(fm.VOCAB[i] in fm.FILLERS for i in first[2:])


def test_failure_modes_generic_captions_score_near_pmi_not_by_frequency(tmp_path):
    """A caption that goes with every image (half of all pairs): the most frequent caption of every image by count,
    never an image's best by the contrastive scores, which sit near its PMI (zero)."""
    out = tmp_path / "fm"
    assert cli.main(["study", "failure-modes", "--only", "generic-captions", "--out", str(out), "--quiet",
                     "generic_steps=400"]) == 0
    result = json.loads((out / "results.json").read_text())["generic-captions"]
    assert result["count_generic_best_share"] > 0.9 and result["pmi_generic_best_share"] == 0.0
    assert result["mean"]["generic_best_share"] < 0.05
    assert abs(result["mean"]["generic_score"]) < 0.5 < result["mean"]["specific_best"]
    assert abs(result["pmi_generic"]) < 0.05
    assert "## Generic captions" in (out / "report.md").read_text()
    assert (out / "generic_captions.png").stat().st_size > 0


def test_failure_modes_rerank_cost_measures_pooled_search_and_reranking(tmp_path):
    from conftest import save_tiny_model, shape_images

    model = save_tiny_model(tmp_path / "model", ["a red circle", "a blue square"])
    images = shape_images(tmp_path / "images")
    out = tmp_path / "fm"
    assert cli.main(["study", "failure-modes", "--only", "rerank-cost", "--out", str(out), "--quiet",
                     f"rerank_model={model}", f"rerank_images={images}", "rerank_shortlists=2,5",
                     "rerank_queries=3"]) == 0
    result = json.loads((out / "results.json").read_text())["rerank-cost"]
    assert result["images"] == 12 and set(result["rerank_seconds"]) == {"2", "5"}
    assert result["pooled_seconds"] > 0 and result["embed_seconds_per_image"] > 0
    assert result["break_even_queries"]["5"] == pytest.approx(
        12 * result["embed_seconds_per_image"] / result["rerank_seconds"]["5"])
    assert "## Pooled search against late-interaction" in (out / "report.md").read_text()
    assert (out / "rerank_cost.png").stat().st_size > 0
    assert cli.main(["study", "failure-modes", "--only", "rerank-cost", "--out", str(out), "--quiet",
                     f"rerank_model={tmp_path / 'none'}"]) == 2  # no model: one sentence


def test_failure_modes_concept_frequency_bins_accuracy_by_training_frequency(shapes, tmp_path):
    from conftest import save_tiny_model

    model = save_tiny_model(tmp_path / "model", ["a red circle", "a blue square"])
    out = tmp_path / "fm"
    assert cli.main(["study", "failure-modes", "--only", "concept-frequency", "--out", str(out), "--quiet",
                     f"frequency_models={model}", f"frequency_train={shapes['train']}",
                     f"frequency_eval={shapes['eval']}"]) == 0
    (name, row), = json.loads((out / "results.json").read_text())["concept-frequency"]["sets"].items()
    assert row["images"] > 0 and 0 <= row["accuracy"] <= 1 and row["chance"] == pytest.approx(1 / row["classes"])
    assert sum(b["images"] for b in row["bins"]) == row["images"]
    assert "## Zero-shot accuracy against concept frequency" in (out / "report.md").read_text()
    assert (out / "concept_frequency.png").stat().st_size > 0
    # a second part run into the same study keeps the first one's results, each with its own options
    assert cli.main(["study", "failure-modes", "--only", "generic-captions", "--out", str(out), "--quiet",
                     "generic_steps=50"]) == 0
    both = json.loads((out / "results.json").read_text())
    assert set(both) == {"concept-frequency", "generic-captions"}
    assert both["generic-captions"]["options"]["generic_steps"] == 50
    assert "## Zero-shot accuracy" in (out / "report.md").read_text() and "## Generic captions" in \
        (out / "report.md").read_text()


def test_failure_modes_relations_and_several_objects_train_on_shape_scenes(tmp_path):
    """The two parts that train openalign's towers (tiny preset, a few steps) on the shapes corpus's scenes: the
    caption against its swapped twin for the paper's loss and FILIP's, and the split of probability between the
    shapes a scene shows."""
    out = tmp_path / "fm"
    budget = (f"scene_overrides=train.steps=2,train.eval_every=0,train.checkpoint_every=0,"
              f"data.data_dir={tmp_path / 'data'}")
    assert cli.main(["study", "failure-modes", "--only", "relations", "--only", "several-objects", "--out", str(out),
                     "--quiet", "scene_preset=tiny", "scene_per_combo=1", "scene_scales=1,100", budget]) == 0
    results = json.loads((out / "results.json").read_text())
    relations = results["relations"]["losses"]
    assert set(relations) == {"softmax", "filip"} and relations["filip"]["scenes"] == 56 * 6
    assert all(0 <= row["mean"][k] <= 1 for row in relations.values() for k in ("pooled", "late"))
    objects = results["several-objects"]
    assert 0 <= objects["objects_found"] <= 1 and 0 < objects["chance_found"] < 0.06
    split = objects["split"]
    assert split["100"]["top_share"] >= split["1"]["top_share"]  # a larger scale concentrates the probability
    report = (out / "report.md").read_text()
    assert "## Relations and word order" in report and "## Several objects" in report
    assert (out / "relations.png").stat().st_size > 0


def test_shapes_scenes_name_their_objects_and_the_swapped_caption(tmp_path):
    from openalign.corpora import shapes
    from openalign.data.tars import list_shards, read_samples, sample_meta

    shapes.build(tmp_path / "rel", per_combo=1, eval_seen=1, scene="relation")
    meta = [sample_meta(s) for s in read_samples(list_shards(str(tmp_path / "rel" / "eval")))]
    a, b = meta[0]["objects"]
    assert meta[0]["texts"][0] == f"a {a} {meta[0]['relation']} a {b}"
    assert meta[0]["swapped"] == f"a {b} {meta[0]['relation']} a {a}"
    assert all(m["objects"][0].split()[0] != m["objects"][1].split()[0] for m in meta)  # colours differ
    shapes.build(tmp_path / "obj", per_combo=1, eval_seen=1, scene="objects")
    meta = [sample_meta(s) for s in read_samples(list_shards(str(tmp_path / "obj" / "eval")))]
    assert {len(m["objects"]) for m in meta} == {2, 3} and all(m["texts"][0] == f"a {m['objects'][0]}" for m in meta)
    with pytest.raises(ConfigError, match="scene must be one of"):
        shapes.build(tmp_path / "x", scene="crowd")


def test_failure_modes_deeper_tower_trains_each_depth_on_shapes(tmp_path):
    out = tmp_path / "fm"
    budget = (f"scene_overrides=train.steps=2,train.eval_every=0,train.checkpoint_every=0,"
              f"data.data_dir={tmp_path / 'data'}")
    assert cli.main(["study", "failure-modes", "--only", "deeper-tower", "--out", str(out), "--quiet",
                     "scene_preset=tiny", "depths=0.25,0.5", budget,
                     "depth_overrides=train.steps=3,optim.lr=2e-3,optim.warmup_steps=1"]) == 0
    depths = json.loads((out / "results.json").read_text())["deeper-tower"]["depths"]
    assert set(depths) == {"0.25", "0.5"} and depths["0.25"]["chance"] == pytest.approx(1 / 64)
    assert all(0 <= row["mean"]["compositional_unseen_top1"] <= 1 for row in depths.values())
    # the deeper tower's own recipe goes after the scenes' budget, for every depth alike
    for depth in ("0.25", "0.5"):
        cfg = json.loads((out / "runs" / f"depth{depth}" / "seed0" / "config.json").read_text())
        assert (cfg["train"]["steps"], cfg["optim"]["lr"], cfg["optim"]["warmup_steps"]) == (3, 2e-3, 1)
    assert "## Composition with openalign's towers" in (out / "report.md").read_text()
    assert (out / "deeper_tower.png").stat().st_size > 0


def test_failure_modes_deeper_tower_reading_needs_both_depths_trained():
    """The reading compares composition only once both depths fit the seen pairs, and calls a gap only outside the
    seeds' spread."""
    from openalign.study.failure_modes import _depth_reading

    def row(unseen, seen, spread=0.02):
        return {"mean": {"compositional_unseen_top1": unseen, "compositional_seen_top1": seen, "final_loss": 4.0},
                "std": {"compositional_unseen_top1": spread}, "chance": 1 / 64}

    untrained = _depth_reading({"depths": {"0.25": row(0.97, 1.0), "1": row(0.06, 0.53)}})[0]
    assert "untrained" in untrained and "composes worse" not in untrained
    worse = _depth_reading({"depths": {"1": row(0.60, 1.0, 0.13), "0.25": row(0.87, 0.99)}})[0]
    assert "60.0% against 87.0%" in worse and "composes worse" in worse  # the deeper first, whatever the order
    within = _depth_reading({"depths": {"0.25": row(0.87, 0.99), "1": row(0.80, 1.0, 0.13)}})[0]
    assert "no difference outside" in within


def test_failure_modes_report_states_how_an_older_result_ran(tmp_path):
    """A results.json written before `depth_overrides` existed ran the deeper tower at the scenes' budget alone; the
    report must say so, not credit it with today's recipe."""
    from dataclasses import asdict

    from openalign.study.failure_modes import FailureOptions, write_report

    row = {"mean": {"compositional_unseen_top1": 0.58, "compositional_seen_top1": 0.93, "final_loss": 5.4},
           "std": {"compositional_unseen_top1": 0.0, "compositional_seen_top1": 0.0, "final_loss": 0.0},
           "chance": 1 / 64}
    options = asdict(FailureOptions())
    old = {k: v for k, v in options.items() if k != "depth_overrides"}
    write_report({"deeper-tower": {"depths": {"0.25": row, "1": row}, "options": old, "seeds": 1}}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "train.steps=300" in report and "recipe" not in report and "optim.lr=2e-3" not in report
    write_report({"deeper-tower": {"depths": {"0.25": row, "1": row}, "options": options, "seeds": 1}}, tmp_path)
    assert "recipe (train.steps=1000, optim.lr=2e-3" in (tmp_path / "report.md").read_text()
