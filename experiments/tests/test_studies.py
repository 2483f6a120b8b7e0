"""The studies of variants (experiments/*.py): every variant over seeds, resumable, summarized as tables, a plot and
JSON."""

import json

import pytest

from openalign import presets
from openalign.config import ConfigError
from tests.conftest import needs_emoji_data, shape_shards, two_small_sources
from experiments import ablation, compositional, dynamics, model_data, multilingual, noise_scale


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return shape_shards(tmp_path_factory.mktemp("shapes"))


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
    argv = ["--out", str(tmp_path / "study"), "--preset", "tiny", "--data", str(shapes["train"]),
            "--eval-data", str(shapes["eval"]), "--only", "label smoothing", "--only", "rows_only", "--seeds", "2",
            "--quiet",
            "train.steps=3", "train.eval_every=0", "train.checkpoint_every=0"]
    assert ablation.main(argv) == 0
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
    import openalign.prepare as prepare

    monkeypatch.setattr(prepare, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    assert ablation.main(argv) == 0
    assert json.loads((tmp_path / "study" / "results.json").read_text())["variants"] == results["variants"]


def test_a_bad_override_or_preset_is_one_line(tmp_path, capsys):
    assert ablation.main(["--out", str(tmp_path), "--preset", "tiny", "optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean optim.lr" in err and len(err.strip().splitlines()) == 1
    assert ablation.main(["--out", str(tmp_path), "--preset", "nosuch"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_noise_vs_scale_plan_varies_only_the_corpus():
    from openalign import config as config_lib
    from openalign.corpora import corpus_dir, corpus_options
    from experiments import noise_scale

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
    from experiments import noise_scale

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


def run_study(study, out, *overrides: str) -> dict:
    assert study.main(["--out", str(out), *TINY, *overrides]) == 0
    return json.loads((out / "results.json").read_text())["variants"]


def run_built_corpus_study(study, tmp_path, option: str, plot: str) -> tuple[dict, str]:
    """`study` into tmp_path/study, its corpus built into tmp_path/data with `option`: its variants and its report,
    once its plot is drawn."""
    variants = run_study(study, tmp_path / "study", f"data.data_dir={tmp_path / 'data'}", *option.split())
    assert (tmp_path / "study" / plot).stat().st_size > 0
    return variants, (tmp_path / "study" / "report.md").read_text()


@needs_emoji_data
def test_noise_vs_scale_pipeline_on_a_tiny_corpus(tmp_path):
    variants, report = run_built_corpus_study(noise_scale, tmp_path, "data.corpus_options=limit=120",
                                              "noise_vs_scale.png")
    assert list(variants) == ["clean_x1", "noisy_x1", "noisy_x2", "noisy_x4"]
    built = {json.loads((d / "train" / "manifest.json").read_text())["n_samples"]
             for d in (tmp_path / "data").iterdir()}
    assert len(built) == 3  # 1x (clean and noisy), 2x and 4x the training images
    assert variants["noisy_x4"]["paper"]["MSCOCO I2T R@1"] == 23.8
    # KNN's classes are the held-out emoji families; 120 emoji hold no family of two, so there is no KNN, not a crash
    assert not any("knn_top1" in v["mean"] for v in variants.values())
    assert "paper: MSCOCO I2T R@1" in report and "Table 10" in report


@needs_emoji_data
def test_multilingual_pipeline_reports_every_language(tmp_path):
    variants, report = run_built_corpus_study(multilingual, tmp_path, "data.corpus_options=limit=150",
                                              "multilingual.png")
    languages = multilingual.TRAIN_LANGUAGES + multilingual.HELDOUT_LANGUAGES
    for name in ("english", "multilingual"):
        assert all(f"multilingual_{lang}_mean_recall" in variants[name]["mean"] for lang in languages)
    trained = json.loads((tmp_path / "study" / "runs" / "multilingual" / "seed0" / "config.json").read_text())
    assert trained["model"]["text"]["vocab_size"] > 0
    assert "## Mean recall per language (held-out emoji)" in report and "| ko | **no** |" in report


@needs_emoji_data
def test_model_vs_data_pipeline(tmp_path):
    variants, report = run_built_corpus_study(model_data, tmp_path, "data.corpus_options=limit=300",
                                              "model_vs_data.png")
    assert list(variants) == ["large_full", "large_10", "large_clean", "small_full", "small_10", "small_clean"]
    small = json.loads((tmp_path / "study" / "runs" / "small_full" / "seed0" / "config.json").read_text())
    large = json.loads((tmp_path / "study" / "runs" / "large_full" / "seed0" / "config.json").read_text())
    assert small["model"]["text"]["hidden_size"] * 2 == large["model"]["text"]["hidden_size"]
    assert small["model"]["embed_dim"] == large["model"]["embed_dim"]
    assert "## Model size against data size" in report and "## smaller model" in report


def test_model_vs_data_on_your_shards_samples_them_with_data_fraction(tmp_path):
    import dataclasses

    from openalign import config as config_lib
    from experiments import model_data

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
    variants, report = run_built_corpus_study(
        compositional, tmp_path, "data.corpus=shapes data.corpus_options=per_combo=1,eval_seen=1,eval_unseen=2",
        "compositional.png")
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
    assert "## Unseen colour-shape pairs" in report and "arithmetic R@10" in report


def test_temperature_settles_where_it_stays_within_the_band():
    from experiments.dynamics import settle_step

    temps = [(10, 1.0), (20, 0.5), (30, 0.1), (40, 0.2), (50, 0.11), (60, 0.1)]
    assert settle_step(temps) == 50  # 0.2 at step 40 is outside 1.2x of 0.1
    assert settle_step(temps, near=2.5) == 30 and settle_step([(5, 0.3)]) == 5


def test_dynamics_pipeline_plots_temperature_and_geometry_over_steps(shapes, tmp_path):
    variants = run_study(dynamics, tmp_path / "study", "--data", str(shapes["train"]), "--eval-data",
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
    from experiments import noise_scale

    base = config_lib.override(presets.get("demo"), ["data.corpus=shapes", "data.corpus_options=per_combo=10"])
    plan = noise_scale.variants(base)
    sizes = [corpus_options("shapes", config_lib.override(base, list(v.overrides)).data.corpus_options)["per_combo"]
             for v in plan]
    assert sizes == [10, 10, 20, 40]
    assert all("retrieval" not in config_lib.override(base, list(v.overrides)).eval.tasks for v in plan)
    assert noise_scale.STUDY.headline(base) == ("zeroshot_top1", "zero-shot top-1")
    assert noise_scale.STUDY.headline(presets.get("demo")) == ("mean_recall", "mean recall")

    def row(top1):
        return {"mean": {"zeroshot_top1": top1}, "std": {"zeroshot_top1": 0.0}}

    results = {"clean_x1": row(0.5), "noisy_x1": row(0.2), "noisy_x2": row(0.4), "noisy_x4": row(0.6)}
    assert "reaches the clean corpus's zero-shot top-1 (0.500) at 4x" in "\n".join(
        noise_scale.extra_report(results, tmp_path))


def test_loss_batch_plan_sees_the_same_examples_at_every_batch(tmp_path):
    from openalign import config as config_lib
    from openalign.config import check
    from experiments import loss_batch
    from experiments.lab.command import QUICK

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
    assert "| 32 | 0.050 ± 0.010 | 0.070 ± 0.010 | +0.020 |" in lines
    assert "| 512 | 0.050 ± 0.010 | 0.050 ± 0.010 | +0.000 |" in lines
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
    assert noise_scale.main(["--sources", "--out", str(tmp_path / "study"), *TINY, f"data.data_dir={tmp_path / 'data'}",
                             options]) == 0
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
    with pytest.raises(SystemExit) as refused:  # --sources is noise-vs-scale's own flag
        ablation.main(["--sources", "--out", str(tmp_path / "x"), *TINY])
    assert refused.value.code == 2


def test_the_studies_read_their_rows_from_the_data_file():
    from openalign.eval import paper

    assert ablation._paper("fixed_t32") == {"MSCOCO I2T R@1": 39.6, "MSCOCO T2I R@1": 26.9, "ImageNet KNN R@1": 61.2}
    assert model_data.TABLE_9["large", "clean"] == (18.9, 15.5, 48.7)
    assert paper.row_values(10, noise_scale.TABLE_10["noisy_x4"]) == {
        "MSCOCO I2T R@1": 23.8, "MSCOCO T2I R@1": 17.5, "ImageNet KNN R@1": 51.4}


def test_transfer_plan_leaves_each_source_out_and_evaluates_on_all():
    from experiments import transfer

    base = presets.configure("demo", ["data.corpus=emoji+shapes+icons"])
    plan = transfer.variants(base)
    assert [v.name for v in plan] == ["all", "without_emoji", "without_shapes", "without_icons"]
    assert plan[0].baseline and plan[0].overrides == ("data.eval_corpus=emoji+shapes+icons",)
    assert plan[2].overrides == ("data.corpus=emoji+icons", "data.eval_corpus=emoji+shapes+icons")
    with pytest.raises(ConfigError, match="two or more"):
        transfer.variants(presets.configure("demo", ["data.corpus=emoji"]))


def test_transfer_report_reads_multiples_of_chance_and_names_the_weakest(tmp_path):
    from experiments import transfer

    def group(values: dict, runs: int = 1) -> dict:  # {source: (i2t, t2i, top1)}, chance 0.1 / 0.05 / 0.25
        mean, chance = {}, {}
        for source, (i2t, t2i, top1) in values.items():
            mean |= {f"{source}/i2t_r10": i2t, f"{source}/t2i_r10": t2i, f"{source}/zeroshot_top1": top1}
            chance |= {f"{source}/i2t_r10": 0.1, f"{source}/t2i_r10": 0.05, f"{source}/zeroshot_top1": 0.25}
        return {"mean": mean, "std": {k: 0.0 for k in mean}, "chance": chance, "runs": [{}] * runs}

    results = {"all": group({"emoji": (0.8, 0.5, 1.0), "icons": (0.6, 0.3, 0.5)}),
               "without_emoji": group({"emoji": (0.3, 0.1, 0.5), "icons": (0.6, 0.3, 0.5)}),
               "without_icons": group({"emoji": (0.8, 0.5, 1.0), "icons": (0.25, 0.15, 0.25)})}
    rows = {row["source"]: row for row in transfer.table(results)}
    flat = lambda pairs: [x for pair in pairs for x in pair]  # noqa: E731
    assert flat(rows["emoji"]["i2t_r10"]) == pytest.approx([8.0, 0.0, 3.0, 0.0])
    assert flat(rows["icons"]["t2i_r10"]) == pytest.approx([6.0, 0.0, 3.0, 0.0])
    assert flat(rows["icons"]["zeroshot_top1"]) == pytest.approx([2.0, 0.0, 1.0, 0.0])
    text = "\n".join(transfer.extra_report(results, tmp_path))
    assert "| icons | 6.0x | 6.0x | 2.0x | 2.5x | 3.0x | 1.0x |" in text
    assert "The weakest transfer is to emoji: 2.0x chance R@10" in text and "2.4x to 2.7x" in text
    assert (tmp_path / "transfer.png").stat().st_size > 0


def test_transfer_pipeline_on_two_small_sources(tmp_path):
    """Two sources in their packages' layouts: every run evaluated on both held-out splits, the left-out one's words
    absent from its tokenizer, and the table written."""
    options = two_small_sources(tmp_path)
    variants = run_study(transfer_module(), tmp_path / "study", "--sources", "tuxpaint+icons",
                         f"data.data_dir={tmp_path / 'data'}", options, "data.global_batch=4")
    assert list(variants) == ["all", "without_tuxpaint", "without_icons"]
    for row in variants.values():
        run = row["runs"][0]
        assert run["tuxpaint/n_images"] > 0 and run["icons/n_images"] > 0 and "tuxpaint/zeroshot_top1" in run
        assert run["tuxpaint/zeroshot_n_classes"] == 2 and run["icons/zeroshot_n_classes"] == 2
    vocab = json.loads((tmp_path / "study" / "runs" / "without_tuxpaint" / "seed0" / "tokenizer" /
                        "tokenizer.json").read_text())["model"]["vocab"]
    assert "gadget" in vocab and not {"duck", "apple", "storm"} & set(vocab)
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Leave one source out" in report and "| tuxpaint |" in report and "| icons |" in report
    assert (tmp_path / "study" / "transfer.png").stat().st_size > 0


def transfer_module():
    from experiments import transfer

    return transfer


def test_transfer_levers_change_one_thing_each_from_a_baseline_without_the_left_out_source():
    from experiments import transfer_levers

    base = presets.configure("demo", ["data.corpus=emoji+openclipart+icons", "data.eval_corpus=emoji+openclipart+"
                                      "icons+tuxpaint", "train.steps=600"])
    plan = {v.name: v for v in transfer_levers.variants(base)}
    assert list(plan) == ["baseline", "fewer_sources", "letters", "symbola", "gcompris", "all_more", "inception",
                          "inception35", "px96", "text_tower", "vocab2x", "sentences", "steps2x"]
    assert plan["baseline"].baseline and plan["baseline"].overrides == ()
    assert plan["fewer_sources"].overrides == ("data.corpus=openclipart+emoji",)
    assert plan["letters"].overrides == ("data.corpus=emoji+openclipart+icons+letters",)  # one more source
    assert plan["symbola"].overrides == ("data.corpus=emoji+openclipart+icons+symbola",)
    assert plan["all_more"].overrides == ("data.corpus=emoji+openclipart+icons+letters+symbola+gcompris",)
    assert plan["px96"].overrides == ("model.vision.image_size=96", "model.vision.resize_size=108")
    assert plan["text_tower"].overrides == ("model.text.num_layers=6", "model.text.hidden_size=384",
                                            "model.text.intermediate_size=1536")  # the clipart preset's tower
    assert plan["vocab2x"].overrides == ("model.text.vocab_size=16000",)
    assert plan["steps2x"].overrides == ("train.steps=1200",)
    worded = presets.configure("demo", list(plan["sentences"].overrides)).data.text_templates
    assert worded.count("{}") == len(worded) / 2 and "a picture of {}." in worded  # half of the texts as they are
    assert "fewer_sources" not in [v.name for v in transfer_levers.variants(
        presets.configure("demo", ["data.corpus=emoji+icons", "data.eval_corpus=emoji+icons+tuxpaint"]))]
    assert "letters" not in [v.name for v in transfer_levers.variants(  # already trained on (or left out)
        presets.configure("demo", ["data.corpus=emoji+letters", "data.eval_corpus=emoji+letters+tuxpaint"]))]
    with pytest.raises(ConfigError, match="leaves built-in sources out of training"):
        transfer_levers.variants(presets.configure("demo", ["data.corpus=emoji+icons"]))  # nothing left out


def test_transfer_levers_refuse_leaving_out_what_is_not_there(tmp_path):
    from experiments import transfer_levers

    out = str(tmp_path / "study")
    assert transfer_levers.main(["--out", out, "--sources", "emoji+icons", "--left-out", "tuxpaint"]) == 2
    assert transfer_levers.main(["--out", out, "--sources", "emoji+icons", "--left-out", "emoji+icons"]) == 2


def test_transfer_levers_report_reads_the_left_out_sources_and_names_the_best_lever(tmp_path):
    from experiments import transfer_levers

    def group(label: str, i2t: float, t2i: float, minutes: float) -> dict:  # tuxpaint's chance 0.05 both ways
        mean = {"tuxpaint/i2t_r10": i2t, "tuxpaint/t2i_r10": t2i, "tuxpaint/zeroshot_top1": 0.2, "minutes": minutes,
                "emoji/i2t_r10": 0.9, "emoji/t2i_r10": 0.9}
        chance = {"tuxpaint/i2t_r10": 0.05, "tuxpaint/t2i_r10": 0.05, "tuxpaint/zeroshot_top1": 0.1,
                  "emoji/i2t_r10": 0.1, "emoji/t2i_r10": 0.1}
        return {"label": label, "mean": mean, "std": {k: 0.0 for k in mean}, "chance": chance, "runs": [{}, {}]}

    for variant in ("baseline", "inception", "steps2x"):
        run = tmp_path / "runs" / variant / "seed0"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"data": {"corpus": "emoji", "eval_corpus": "emoji+tuxpaint"}}))
    results = {"baseline": group("baseline", 0.10, 0.15, 6.0), "inception": group("crop", 0.30, 0.20, 6.0),
               "steps2x": group("steps", 0.25, 0.25, 12.0)}
    results["steps2x"]["mean"].update({"emoji/i2t_r10": 1.0, "emoji/t2i_r10": 0.95})  # 9.5x in source
    text = "\n".join(transfer_levers.extra_report(results, tmp_path))
    # emoji (trained on) is not a left-out column: it is the in-source contrast (the weaker direction, 9.0x)
    assert "| crop | 6.0 ± 0.0x | 4.0 ± 0.0x | 2.0 ± 0.0x | 9.0x | 6.0 |" in text
    assert "the baseline reads 2.0x chance; the best lever is steps at 5.0x (2.50x the baseline, at 2.00x its " \
           "minutes)" in text
    assert "In source the baseline reads 9.0x; the lever that buys most there is steps (1.06x the baseline), which " \
           "on the left-out sources gives 2.50x the baseline." in text
    assert (tmp_path / "levers.png").stat().st_size > 0


def test_transfer_levers_pipeline_on_two_small_sources(tmp_path):
    """Trained on icons alone, evaluated on both: the report's columns are tuxpaint's, the lever's run is cropped
    otherwise."""
    from experiments import transfer_levers

    variants = run_study(transfer_levers, tmp_path / "study", "--sources", "tuxpaint+icons", "--only", "inception",
                         f"data.data_dir={tmp_path / 'data'}", two_small_sources(tmp_path), "data.global_batch=4")
    assert list(variants) == ["baseline", "inception"]
    assert all(row["runs"][0]["tuxpaint/n_images"] > 0 for row in variants.values())
    config = json.loads((tmp_path / "study" / "runs" / "inception" / "seed0" / "config.json").read_text())
    assert (config["data"]["corpus"], config["data"]["crop"]) == ("icons", "inception")
    report = (tmp_path / "study" / "report.md").read_text()
    assert "## Levers on the left-out sources" in report and "Trained without tuxpaint" in report
    assert "tuxpaint R@10 image→text" in report and "icons R@10" not in report
    assert (tmp_path / "study" / "levers.png").stat().st_size > 0
