"""The evaluation tasks end to end through `main(argv)` on a tiny saved model and generated data."""

import json

import pytest
import torch

from conftest import save_code_running_pickle, save_tiny_model, shape_image
from openalign import cli
from openalign.eval import finetune as finetune_lib
from openalign.model.dual_encoder import DualEncoder

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    words = [f"a {c} {s}" for c in COLOURS for s in SHAPES] + ["ein roter kreis", "un cercle rouge"]
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", words)


def run(model_dir, tmp_path, *args) -> dict:
    out = tmp_path / "m.json"
    assert cli.main(["eval", str(model_dir), *args, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def text_spearman(model_dir, pairs) -> float:
    """Oracle: Spearman of the cosines of the texts' embeddings against the human scores."""
    from scipy.stats import spearmanr

    from openalign.model.encode import encode_texts
    from openalign.model.hub import load_pretrained

    model, tokenizer, cfg = load_pretrained(model_dir)
    texts = sorted({t for a, b, _ in pairs for t in (a, b)})
    vectors = dict(zip(texts, encode_texts(model, tokenizer, texts, max_length=cfg.model.text.max_length)))
    return float(spearmanr([float(vectors[a] @ vectors[b]) for a, b, _ in pairs], [s for _, _, s in pairs]).statistic)


def class_folders(root, per_class: int, seed: int = 0):
    for c in COLOURS[:3]:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            shape_image(c, SHAPES[(i + seed) % 3], size=32 + (i % 3) * 4).save(root / c / f"{i}.png")
    return root


def test_multilingual_multi30k_layout(model_dir, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    names = []
    for i, (c, s) in enumerate([(c, s) for c in COLOURS[:2] for s in SHAPES]):
        shape_image(c, s).save(tmp_path / "images" / f"{i}.jpg")
        names.append(f"{i}.jpg")
    (tmp_path / "images" / "broken.jpg").write_bytes(b"nope")
    split = tmp_path / "image_splits"
    split.mkdir()
    (split / "test_2016_flickr.txt").write_text("\n".join(names + ["broken.jpg"]) + "\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "test_2016_flickr.en").write_text("\n".join(f"a caption {i}" for i in range(7)) + "\n")
    import gzip

    with gzip.open(raw / "test_2016_flickr.de.gz", "wt") as f:
        f.write("\n".join(f"eine beschriftung {i}" for i in range(7)) + "\n")
    m = run(model_dir, tmp_path, "--task", "multilingual", "--data", str(split / "test_2016_flickr.txt"),
            "--images", str(tmp_path / "images"), "--captions", str(raw))
    assert m["multilingual_languages"] == "de,en" and m["n_skipped"] == 1
    assert m["multilingual_en_n_images"] == 6 and m["multilingual_de_n_texts"] == 6  # the unreadable image's line
                                                                                     # dropped
    assert m["multilingual_mean_recall"] == pytest.approx(
        (m["multilingual_en_mean_recall"] + m["multilingual_de_mean_recall"]) / 2)
    assert m["multilingual_chance_en_t2i_r1"] == pytest.approx(1 / 6)
    assert "multilingual_de_mean_recall" in capsys.readouterr().out
    (raw / "test_2016_flickr.fr").write_text("une seule ligne\n")
    assert cli.main(["eval", str(model_dir), "--task", "multilingual", "--data", str(split / "test_2016_flickr.txt"),
                     "--images", str(tmp_path / "images"), "--captions", str(raw), "--out", str(tmp_path / "x.json")]) == 2


def test_cxc_on_a_karpathy_json_and_a_report_png(model_dir, tmp_path):
    (tmp_path / "imgs").mkdir()
    entries, sentid = [], 0
    for i, (c, s) in enumerate([(c, s) for c in COLOURS for s in SHAPES[:2]]):
        shape_image(c, s).save(tmp_path / "imgs" / f"COCO_val2014_{i:012d}.jpg")
        sentences = [{"raw": f"a {c} {s} {j}", "sentid": sentid + j} for j in range(2)]
        sentid += 2
        entries.append({"filename": f"COCO_val2014_{i:012d}.jpg", "filepath": "", "split": "test",
                        "sentences": sentences})
    (tmp_path / "coco.json").write_text(json.dumps({"images": entries}))
    cxc = tmp_path / "cxc"
    cxc.mkdir()
    (cxc / "sts_test.csv").write_text("caption1,caption2,agg_score,sampling_method\n" + "".join(
        f"COCO_val2014:sentid:{i},COCO_val2014:sentid:{i + 2},{(i % 5) + 0.5},c2c\n" for i in range(10)))
    (cxc / "sis_test.csv").write_text("image1,image2,agg_score,sampling_method\n" + "".join(
        f"COCO_val2014_{i:012d}.jpg,COCO_val2014_{i + 1:012d}.jpg,{(i * 2) % 5},i2i\n" for i in range(7)))
    m = run(model_dir, tmp_path, "--task", "retrieval", "--task", "cxc", "--data", str(tmp_path / "coco.json"),
            "--images", str(tmp_path / "imgs"), "--cxc", str(cxc))
    assert m["n_images"] == 8 and m["cxc_sts_n_pairs"] == 10 and m["cxc_sis_n_pairs"] == 7
    assert 0 < m["cxc_t2t_n_queries"] <= 16 and "cxc_i2i_r10" in m and "cxc_sits_spearman" not in m
    # oracle: STS is Spearman of the captions' cosines against the ratings; the mean is over STS and SIS
    captions = {e["sentences"][j]["sentid"]: e["sentences"][j]["raw"] for e in entries for j in range(2)}
    pairs = [(captions[i], captions[i + 2], (i % 5) + 0.5) for i in range(10)]
    assert m["cxc_sts_spearman"] == pytest.approx(text_spearman(model_dir, pairs))
    assert m["cxc_mean_spearman"] == pytest.approx((m["cxc_sts_spearman"] + m["cxc_sis_spearman"]) / 2)
    assert (tmp_path / "m.png").stat().st_size > 10_000 and "| cxc_t2t_r1 |" in (tmp_path / "m.md").read_text()


def test_finetune_with_a_head_and_frozen_batchnorm(model_dir, tmp_path):
    train, test = class_folders(tmp_path / "train", 4), class_folders(tmp_path / "test", 2, seed=1)
    (test / "green" / "1.png").unlink()  # an unbalanced test split: its top-1 is not the training split's
    m = run(model_dir, tmp_path, "--task", "finetune", "--data", str(test), "--train-data", str(train),
            "--ft", "steps=3", "--ft", "batch_size=4", "--ft", "lr=0.001", "--ft", "freeze_bn=true")
    assert (m["finetune_n_train"], m["finetune_n_test"], m["finetune_n_classes"]) == (12, 5, 3)
    assert m["finetune_freeze_bn"] is True and m["finetune_top5"] == 1.0
    # oracle: the same fit (a pure function of model, data, recipe and seed), scored on the test split
    from openalign.eval.options import EvalOptions
    from openalign.model.hub import load_pretrained

    model, _, cfg = load_pretrained(model_dir)
    resize, crop = cfg.model.vision.resize_size, cfg.model.vision.image_size
    ft = finetune_lib.parse_options(["steps=3", "batch_size=4", "lr=0.001", "freeze_bn=true"])
    train_set, test_set = (finetune_lib.load_labeled(str(d), EvalOptions(), resize) for d in (train, test))
    classes = {c: i for i, c in enumerate(sorted(set(train_set.labels)))}
    tuned = finetune_lib.fit(model, train_set, classes, ft, seed=0, crop=crop)
    predicted = finetune_lib.predict(tuned, test_set, crop).argmax(dim=1).tolist()
    expected = sum(p == classes[label] for p, label in zip(predicted, test_set.labels)) / len(predicted)
    assert m["finetune_top1"] == pytest.approx(expected)
    assert cli.main(["eval", str(model_dir), "--task", "finetune", "--data", str(test), "--ft", "stpes=3",
                     "--train-data", str(train), "--out", str(tmp_path / "x.json")]) == 2  # a typo: one sentence


def test_vtab_protocol_sweeps_retrains_and_reports_mean_and_std(model_dir, tmp_path):
    for task in ("shapes_a", "shapes_b"):
        class_folders(tmp_path / "vtab" / task / "train", 5)
        class_folders(tmp_path / "vtab" / task / "test", 2, seed=2)
    m = run(model_dir, tmp_path, "--task", "vtab", "--data", str(tmp_path / "vtab"), "--ft", "batch_size=4",
            "--sweep", "lr=0.01,0.001", "--sweep", "steps=1,2", "--runs", "2")
    assert m["vtab_n_tasks"] == 2 and m["vtab_shapes_a_n_train"] == 15 and m["vtab_shapes_b_n_test"] == 6
    assert m["vtab_shapes_a_lr"] in (0.01, 0.001) and m["vtab_shapes_a_steps"] in (1, 2)
    # one point of the sweep, two seeds: the mean and population std of the two one-seed runs
    one_point = ("--ft", "batch_size=4", "--sweep", "lr=0.01", "--sweep", "steps=2")
    pair = run(model_dir, tmp_path, "--task", "vtab", "--data", str(tmp_path / "vtab"), *one_point, "--runs", "2")
    seeds = [run(model_dir, tmp_path, "--task", "vtab", "--data", str(tmp_path / "vtab"), *one_point, "--runs", "1",
                 "--seed", str(seed))["vtab_shapes_a_top1_mean"] for seed in (0, 1)]
    assert pair["vtab_shapes_a_top1_mean"] == pytest.approx(sum(seeds) / 2)
    assert pair["vtab_shapes_a_top1_std"] == pytest.approx(abs(seeds[0] - seeds[1]) / 2)
    assert m["vtab_mean_top1"] == pytest.approx((m["vtab_shapes_a_top1_mean"] + m["vtab_shapes_b_top1_mean"]) / 2)


def test_vtab_groups_its_19_tasks_as_natural_specialized_and_structured():
    groups = finetune_lib.VTAB_GROUPS
    assert [len(groups[g]) for g in ("natural", "specialized", "structured")] == [7, 4, 8]
    assert len({t for names in groups.values() for t in names}) == 19
    assert finetune_lib.vtab_group("oxford_iiit_pet") == finetune_lib.vtab_group("Oxford-IIIT-Pet") == "natural"
    assert finetune_lib.vtab_group("pets") == "natural" and finetune_lib.vtab_group("SVHN") == "natural"
    assert finetune_lib.vtab_group("patch_camelyon") == finetune_lib.vtab_group("pcam") == "specialized"
    assert finetune_lib.vtab_group("diabetic-retinopathy") == "specialized"
    assert finetune_lib.vtab_group("dSprites_location") == finetune_lib.vtab_group("smallnorb_elevation") == "structured"
    assert finetune_lib.vtab_group("clevr_count_all") == "structured" and finetune_lib.vtab_group("icons") == ""


def test_vtab_reports_each_groups_mean_and_the_benchmarks_std_over_runs(model_dir, tmp_path):
    for task in ("dtd", "eurosat", "Resisc45"):
        class_folders(tmp_path / "vtab" / task / "train", 4)
        class_folders(tmp_path / "vtab" / task / "test", 2, seed=1)
    m = run(model_dir, tmp_path, "--task", "vtab", "--data", str(tmp_path / "vtab"), "--ft", "batch_size=4",
            "--sweep", "lr=0.01", "--sweep", "steps=1", "--runs", "2")
    assert (m["vtab_n_natural"], m["vtab_n_specialized"], "vtab_structured_top1" in m) == (1, 2, False)
    assert m["vtab_natural_top1"] == m["vtab_dtd_top1_mean"]
    assert m["vtab_specialized_top1"] == pytest.approx((m["vtab_eurosat_top1_mean"] + m["vtab_Resisc45_top1_mean"]) / 2)
    assert m["vtab_mean_top1"] == pytest.approx(sum(m[f"vtab_{t}_top1_mean"] for t in ("dtd", "eurosat", "Resisc45")) / 3)
    assert m["vtab_runs"] == 2 and 0 <= m["vtab_mean_top1_std"] <= max(m[f"vtab_{t}_top1_std"]
                                                                        for t in ("dtd", "eurosat", "Resisc45"))
    assert {c["cell"].split(",")[2].strip().split(" ")[0] for key in ("vtab_natural_top1", "vtab_specialized_top1")
            for c in m["paper"][key]} == {"Natural", "Specialized"}


def test_fit_is_a_pure_function_and_leaves_the_model_alone(model_dir):
    from openalign.model.hub import load_pretrained

    model, _, cfg = load_pretrained(model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images = [shape_image(c, "circle", 36) for c in COLOURS[:2]] * 3
    data = finetune_lib.Labeled(images, ["red", "green"] * 3)
    ft = finetune_lib.parse_options(["steps=2", "batch_size=4", "lr=0.1"])
    a = finetune_lib.fit(model, data, {"green": 0, "red": 1}, ft, seed=3, crop=32)
    b = finetune_lib.fit(model, data, {"green": 0, "red": 1}, ft, seed=3, crop=32)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert a.head.weight.abs().sum() > 0  # the head moved
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_head_learns_ten_times_faster_and_frozen_batchnorm_keeps_statistics(model_dir, monkeypatch):
    from openalign.model.hub import load_pretrained

    model, _, _ = load_pretrained(model_dir)
    data = finetune_lib.Labeled([shape_image(c, "square", 36) for c in COLOURS[:2]] * 2, ["red", "green"] * 2)
    seen = []
    real_step = torch.optim.SGD.step

    def spy(self, *args, **kwargs):
        seen.append([g["lr"] for g in self.param_groups])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    ft = finetune_lib.parse_options(["steps=4", "batch_size=2", "lr=0.002", "warmup_fraction=0", "freeze_bn=true"])
    tuned = finetune_lib.fit(model, data, {"green": 0, "red": 1}, ft, seed=0, crop=32)
    assert seen[0] == pytest.approx([0.002, 0.002, 0.02]) and seen[-1] == pytest.approx([0.0005, 0.0005, 0.005])
    stats = lambda m: [b.running_mean for b in m.modules() if isinstance(b, torch.nn.BatchNorm2d)]  # noqa: E731
    assert all(torch.equal(x, y) for x, y in zip(stats(tuned.tower), stats(model)))


def test_two_stage_fine_tune_moves_the_head_alone_then_every_layer_at_a_tenth_of_the_heads_lr(model_dir,
                                                                                             monkeypatch):
    from openalign.model.hub import load_pretrained

    model, _, _ = load_pretrained(model_dir)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    data = finetune_lib.Labeled([shape_image(c, "square", 36) for c in COLOURS[:2]] * 2, ["red", "green"] * 2, crop=32)
    made, seen = [], []
    real_forward, real_step = finetune_lib.Classifier.forward, torch.optim.SGD.step

    def forward(self, pixels, frozen_tower=False):
        made.append(self)
        return real_forward(self, pixels, frozen_tower)

    def spy(self, *args, **kwargs):
        out = real_step(self, *args, **kwargs)
        tower = made[-1].tower.state_dict()  # the copy's weights and BatchNorm statistics
        seen.append((len(self.param_groups), [g["lr"] for g in self.param_groups],
                     all(torch.equal(v, original[k]) for k, v in tower.items()), float(made[-1].head.weight.detach().abs().sum())))
        return out

    monkeypatch.setattr(finetune_lib.Classifier, "forward", forward)
    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    ft = finetune_lib.parse_options(["head_steps=2", "steps=2", "batch_size=2", "lr=0.002", "warmup_fraction=0"])
    finetune_lib.fit(model, data, {"green": 0, "red": 1}, ft, seed=0, crop=32)
    first, second = [s for s in seen if s[0] == 1], [s for s in seen if s[0] == 3]
    assert len(first) == 2 and len(second) == 2 and len(seen) == 4
    assert all(unchanged for *_, unchanged, _ in first) and first[-1][3] > 0  # stage 1: the head alone moved
    assert first[0][1] == pytest.approx([0.02])  # at the head's lr (lr x head_lr_scale)
    assert not second[-1][2]  # stage 2: every layer
    assert all(lrs[2] == pytest.approx(10 * lrs[0]) and lrs[0] == lrs[1] for _, lrs, *_ in second)


def test_stage_schedules_step_down_or_follow_a_cosine():
    step = finetune_lib.parse_options(["schedule=step", "decay=0.2", "decay_every=0.3", "warmup_fraction=0"])
    assert [finetune_lib.stage_lr(s, 0.01, 100, step) for s in (0, 29, 30, 60, 90, 99)] == pytest.approx(
        [0.01, 0.01, 0.002, 0.0004, 0.00008, 0.00008])
    cosine = finetune_lib.parse_options(["schedule=cosine", "warmup_fraction=0.1"])
    assert finetune_lib.stage_lr(5, 1e-3, 100, cosine) == pytest.approx(0.5e-3)  # warming up
    assert [finetune_lib.stage_lr(s, 1e-3, 100, cosine) for s in (10, 55, 100)] == pytest.approx([1e-3, 0.5e-3, 0.0])


FEW_STEPS = ("--ft", "steps=2", "--ft", "head_steps=1", "--ft", "batch_size=4")


@pytest.fixture(scope="module")
def builtin_shapes(tmp_path_factory):
    from openalign.corpora import CORPORA

    out = tmp_path_factory.mktemp("shapes")
    CORPORA["shapes"](out, per_combo=2, eval_seen=1, eval_unseen=1)  # 112 training and 64 held-out drawings
    return out


@pytest.mark.parametrize("protocol,args,key,table", [
    ("imagenet-probe", ("linear-probe.sgd.epochs=3",), "linear_probe_top1", "Table 5"),
    ("imagenet-finetune", FEW_STEPS, "finetune_top1", "Table 5"),
    ("fine-grained", FEW_STEPS + ("--runs", "2"), "finetune_top1", "Table 7"),
    ("vtab", ("--ft", "batch_size=4", "--sweep", "lr=0.01,0.001", "--sweep", "steps=1,2", "--trials", "1", "--runs",
              "1"), "vtab_mean_top1", "Table 6"),
])
def test_each_protocol_runs_end_to_end_with_the_papers_figure_beside_ours(model_dir, builtin_shapes, tmp_path, capsys,
                                                                           protocol, args, key, table):
    # the built-in shapes corpus: its training split to learn from, its held-out split to score (labels: the pairs)
    data = ["--data", str(builtin_shapes / "eval"), "--train-data", str(builtin_shapes / "train")]
    if protocol == "vtab":  # one VTAB-style task of the same splits
        (tmp_path / "vtab" / "shapes").mkdir(parents=True)
        (tmp_path / "vtab" / "shapes" / "train").symlink_to(builtin_shapes / "train")
        (tmp_path / "vtab" / "shapes" / "test").symlink_to(builtin_shapes / "eval")
        data = ["--data", str(tmp_path / "vtab")]
    m = run(model_dir, tmp_path, "--protocol", protocol, *data, *args)
    assert m["protocol"] == protocol and 0 <= m[key] <= 1
    assert [c["cell"].startswith(table) for c in m["paper"][key]] == [True] * len(m["paper"][key])
    assert table in (tmp_path / "m.md").read_text() and "beside the paper" in capsys.readouterr().out
    size = 32  # the tiny model's image size: the paper's resolutions at 32/289 of their scale
    if protocol == "imagenet-probe":
        assert (m["linear_probe_solver"], m["linear_probe_epochs"]) == ("sgd", 3)
        assert (m["linear_probe_train_resolution"], m["linear_probe_eval_resolution"]) == (size, round(360 * size / 289))
    elif protocol == "imagenet-finetune":
        assert (m["finetune_train_resolution"], m["finetune_eval_resolution"]) == (round(475 * size / 289),
                                                                                   round(600 * size / 289))
        assert (m["finetune_crop"], m["finetune_schedule"], m["finetune_lr"], m["finetune_head_lr_scale"]) == (
            "inception", "step", 0.001, 10.0)
    elif protocol == "fine-grained":
        assert m["finetune_runs"] == 2 and m["finetune_freeze_bn"] is True  # --runs overrides the protocol's 3
        assert (m["finetune_head_stage_lr"], m["finetune_lr"], m["finetune_weight_decay"]) == (0.01, 0.001, 1e-5)
        assert len(m["paper"][key]) == 4  # folders named for none of the four sets: all of Table 7's row
    else:  # one trial drawn from the 4-point grid
        assert m["vtab_trials"] == m["vtab_shapes_sweep_points"] == 1
        assert (m["vtab_shapes_lr"], m["vtab_shapes_steps"]) in {(lr, st) for lr in (0.01, 0.001) for st in (1, 2)}
    assert cli.main(["eval", str(model_dir), "--protocol", protocol, "--task", "zeroshot", *data,
                     "--out", str(tmp_path / "x.json")]) == 2  # a protocol names its own task


def test_finetuned_retrieval_preset_trains_from_a_model_on_a_karpathy_json(model_dir, tmp_path):
    from openalign.model.hub import load_pretrained

    (tmp_path / "imgs").mkdir()
    entries = []
    for i, (c, s) in enumerate([(c, s) for c in COLOURS for s in SHAPES]):
        shape_image(c, s).save(tmp_path / "imgs" / f"{1000 + i}.jpg")
        entries.append({"filename": f"{1000 + i}.jpg", "split": "test" if i % 4 == 0 else "train",
                        "sentences": [{"raw": f"a {c} {s}", "sentid": 10 * i}, {"raw": f"{s}, {c}", "sentid": 10 * i + 1}]})
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"images": entries}))
    run_dir = tmp_path / "run"
    args = ["train", "--preset", "finetune-flickr30k", "--init", str(model_dir), "--data", str(tmp_path / "dataset_flickr30k.json"),
            "--eval-data", str(tmp_path / "dataset_flickr30k.json"), "--images", str(tmp_path / "imgs"), "--out", str(run_dir),
            "--quiet", "train.steps=3", "data.global_batch=4", "data.workers=0", "data.shuffle_buffer=4",
            f"data.data_dir={tmp_path / 'data'}", "train.eval_every=0", "optim.lr=1e-3"]
    assert cli.main(args) == 0
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["model"]["init_from"] == str(model_dir) and cfg["data"]["tokenizer"] == str(model_dir)
    assert cfg["optim"]["warmup_steps"] == 0 and cfg["model"]["text"]["hidden_size"] == 32
    metrics = json.loads((run_dir / "final_metrics.json").read_text())
    assert (metrics["n_images"], metrics["n_texts"]) == (3, 6)  # the test split, every caption
    shards = json.loads((tmp_path / "data" / "karpathy" / "dataset_flickr30k" / "train-restval" / "manifest.json").read_text())
    assert shards["n_samples"] == 9
    before, _, _ = load_pretrained(model_dir)
    after, _, _ = load_pretrained(run_dir / "model")
    changed = [k for k, v in after.state_dict().items() if not torch.equal(v, before.state_dict()[k])]
    assert changed and "align.temperature" in changed
    bare = ["train", "--preset", "finetune-coco", "--data", str(tmp_path / "dataset_flickr30k.json"), "--out", str(tmp_path / "x")]
    assert cli.main(bare) == 2  # no --init: one sentence


def test_embedding_cache_is_reused_and_keyed_by_the_data(model_dir, tmp_path, monkeypatch):
    train, test = class_folders(tmp_path / "train", 3), class_folders(tmp_path / "test", 2, seed=1)
    args = ["--data", str(test), "--train-data", str(train), "--task", "knn", "--task", "linear-probe",
            "--cache", str(tmp_path / "cache")]
    first = run(model_dir, tmp_path, *args)
    assert len(list((tmp_path / "cache").glob("embeddings-*.pt"))) == 2  # the test and the train split

    def no_encoding(*a, **k):
        raise AssertionError("embedded again despite the cache")

    monkeypatch.setattr(DualEncoder, "encode_image", no_encoding)
    assert run(model_dir, tmp_path, *args) == first
    shape_image("red", "circle", 40).save(tmp_path / "test" / "red" / "new.png")  # the data changed: embed again
    with pytest.raises(AssertionError, match="embedded again"):
        run(model_dir, tmp_path, *args)


def test_a_cache_file_with_a_pickled_object_is_embedded_again_not_run(model_dir, tmp_path, capsys):
    # Before: `eval --cache` loaded embeddings-<hash>.pt with torch.load(weights_only=False): the payload ran.
    test = class_folders(tmp_path / "test", 2, seed=1)
    args = ["--data", str(test), "--task", "zeroshot", "--cache", str(tmp_path / "cache")]
    first = run(model_dir, tmp_path, *args)
    [cached] = (tmp_path / "cache").glob("embeddings-*.pt")
    marker = tmp_path / "pwned"
    save_code_running_pickle(cached, marker, **torch.load(cached, weights_only=True))
    assert run(model_dir, tmp_path, *args) == first  # embedded again, the same numbers
    assert not marker.exists(), "the cache file's pickled object ran"
    assert "holds Python objects besides tensors" in capsys.readouterr().err
    cached.write_bytes(cached.read_bytes()[:100])  # damaged: embedded again too
    assert run(model_dir, tmp_path, *args) == first


def test_finetune_that_diverges_stops_with_one_sentence(model_dir, tmp_path, capsys):
    # Before: the loss went NaN, the logits NaN, and top-1 came out 1.000.
    train, test = class_folders(tmp_path / "train", 4), class_folders(tmp_path / "test", 2, seed=1)
    (test / "green" / "1.png").unlink()  # an unbalanced test split: its top-1 is not the training split's
    assert cli.main(["eval", str(model_dir), "--task", "finetune", "--data", str(test), "--train-data", str(train),
                     "--ft", "steps=6", "--ft", "batch_size=4", "--ft", "lr=1e30", "--ft", "warmup_fraction=0",
                     "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "fine-tuning diverged at step" in err and "lower --ft lr" in err and "Traceback" not in err
    assert not (tmp_path / "x.json").exists()


def test_vtab_drops_a_diverged_sweep_point(model_dir, tmp_path):
    class_folders(tmp_path / "vtab" / "t" / "train", 5)
    class_folders(tmp_path / "vtab" / "t" / "test", 2, seed=2)
    m = run(model_dir, tmp_path, "--task", "vtab", "--data", str(tmp_path / "vtab"), "--ft", "batch_size=4",
            "--ft", "warmup_fraction=0", "--sweep", "lr=1e30,0.001", "--sweep", "steps=4", "--runs", "1")
    assert m["vtab_t_sweep_diverged"] == 1 and m["vtab_t_sweep_points"] == 2
    assert m["vtab_t_lr"] == 0.001  # the diverged point cannot win with a NaN score
    assert cli.main(["eval", str(model_dir), "--task", "vtab", "--data", str(tmp_path / "vtab"), "--ft",
                     "batch_size=4", "--ft", "warmup_fraction=0", "--sweep", "lr=1e30", "--sweep", "steps=4",
                     "--out", str(tmp_path / "y.json")]) == 2


def test_finetune_scored_against_permuted_labels_falls_to_chance(model_dir, tmp_path):
    train, test = class_folders(tmp_path / "train", 6), class_folders(tmp_path / "test", 3, seed=1)
    # lr 0.003: at 0.01 thirty steps of SGD on the random tiny tower are chaotic (a 1e-7 change in one
    # layer's gradient arithmetic moved the honest top-1 from 1.0 to 0.33); at 0.003 they are not (0.89 both ways)
    args = ("--task", "finetune", "--train-data", str(train), "--ft", "steps=30", "--ft", "batch_size=6",
            "--ft", "lr=0.003")
    honest = run(model_dir, tmp_path, "--data", str(test), *args)
    permuted = tmp_path / "permuted"
    permuted.mkdir()
    for i, c in enumerate(COLOURS[:3]):  # every test class's images moved into the next class's folder
        (test / c).rename(permuted / COLOURS[(i + 1) % 3])
    shuffled = run(model_dir, tmp_path, "--data", str(permuted), *args)
    assert honest["finetune_top1"] > 1.5 * honest["finetune_chance_top1"]  # it learned the colours
    assert shuffled["finetune_top1"] < honest["finetune_chance_top1"]  # so permuted labels score below chance


def test_multilingual_reads_the_task2_release_layout_as_it_is(model_dir, tmp_path):
    # Multi30k task 2: image_splits/train_images.txt beside raw/train.{1..5}.{en,de}.gz; before, nothing matched
    import gzip

    (tmp_path / "images").mkdir()
    names = []
    for i, (c, s) in enumerate([(c, s) for c in COLOURS[:2] for s in SHAPES]):
        shape_image(c, s).save(tmp_path / "images" / f"{i}.jpg")
        names.append(f"{i}.jpg")
    (tmp_path / "image_splits").mkdir()
    (tmp_path / "image_splits" / "train_images.txt").write_text("\n".join(names) + "\n")
    (tmp_path / "raw").mkdir()
    for n in range(1, 6):
        for lang in ("en", "de"):
            with gzip.open(tmp_path / "raw" / f"train.{n}.{lang}.gz", "wt") as f:
                f.write("\n".join(f"{lang} description {n} of image {i}" for i in range(6)) + "\n")
    m = run(model_dir, tmp_path, "--task", "multilingual", "--data", str(tmp_path / "image_splits" / "train_images.txt"),
            "--images", str(tmp_path / "images"))  # no --captions: ../raw/ is found
    assert m["multilingual_languages"] == "de,en"
    assert m["multilingual_en_n_images"] == 6 and m["multilingual_en_n_texts"] == 30  # 5 descriptions each


def test_word_sim_scores_only_pairs_the_vocabulary_covers(model_dir, tmp_path):
    # The tiny model knows colours and shapes; Cyrillic words are all [UNK] pieces and cannot be measured.
    (tmp_path / "combined.csv").write_text("Word 1,Word 2,Human (mean)\nred,blue,6.0\ncircle,square,5.0\n"
                                           "red,circle,1.0\nблин,щука,3.0\nred,щука,2.0\n")
    m = run(model_dir, tmp_path, "--task", "word-sim", "--data", str(tmp_path / "combined.csv"))
    assert (m["word_sim_n_pairs"], m["word_sim_n_covered"], m["word_sim_n_out_of_vocabulary"]) == (5, 3, 2)
    assert m["word_sim_spearman"] == pytest.approx(text_spearman(
        model_dir, [("red", "blue", 6.0), ("circle", "square", 5.0), ("red", "circle", 1.0)]))
    (tmp_path / "none.csv").write_text("Word 1,Word 2,Human (mean)\nблин,щука,3.0\nщука,блин,2.0\n")
    assert cli.main(["eval", str(model_dir), "--task", "word-sim", "--data", str(tmp_path / "none.csv"),
                     "--out", str(tmp_path / "x.json")]) == 2


def test_word_sim_reports_simlex_sub_tasks_on_their_covered_pairs(model_dir, tmp_path):
    rows = [("red", "blue", "A", 6.0, 1, 0), ("green", "yellow", "A", 4.0, 1, 1), ("red", "green", "A", 2.0, 2, 1),
            ("circle", "square", "N", 5.0, 4, 1), ("circle", "triangle", "N", 7.0, 4, 0),
            ("square", "triangle", "N", 1.0, 3, 1), ("блин", "щука", "N", 3.0, 3, 1)]  # not covered: in no score
    header = "word1\tword2\tPOS\tSimLex999\tconc(w1)\tconc(w2)\tconcQ\tAssoc(USF)\tSimAssoc333\tSD(SimLex)\n"
    (tmp_path / "SimLex-999.txt").write_text(header + "".join(
        f"{a}\t{b}\t{pos}\t{s}\t3\t3\t{q}\t1\t{h}\t1\n" for a, b, pos, s, q, h in rows))
    m = run(model_dir, tmp_path, "--task", "word-sim", "--data", str(tmp_path / "SimLex-999.txt"))
    pick = lambda keep: [(a, b, s) for a, b, pos, s, q, h in rows[:6] if keep(pos, q, h)]  # noqa: E731
    assert m["word_sim_spearman"] == pytest.approx(text_spearman(model_dir, pick(lambda *_: True)))
    assert m["word_sim_spearman_adjectives"] == pytest.approx(text_spearman(model_dir, pick(lambda p, q, h: p == "A")))
    assert m["word_sim_spearman_nouns"] == pytest.approx(text_spearman(model_dir, pick(lambda p, q, h: p == "N")))
    assert m["word_sim_spearman_hard"] == pytest.approx(text_spearman(model_dir, pick(lambda p, q, h: h == 1)))
    assert m["word_sim_spearman_conc_q1"] == pytest.approx(text_spearman(model_dir, pick(lambda p, q, h: q == 1)))
    assert m["word_sim_n_covered_nouns"] == 3 and m["word_sim_n_covered_hard"] == 4
    assert "word_sim_spearman_verbs" not in m and "word_sim_spearman_conc_q2" not in m  # fewer than 2 pairs


def test_zeroshot_reports_calibration_and_fits_a_temperature(model_dir, tmp_path):
    test = class_folders(tmp_path / "test", 3, seed=1)
    m = run(model_dir, tmp_path, "--task", "zeroshot", "--data", str(test), "--calibrate", str(test),
            "zeroshot.templates={}")
    assert 0 <= m["zeroshot_ece"] <= 1 and m["zeroshot_temperature"] > 0 and m["zeroshot_calibration_images"] == 9
    # fitted on the evaluated images themselves, the temperature minimizes their NLL: never worse than the model's
    assert m["zeroshot_nll_calibrated"] <= m["zeroshot_nll"] + 1e-9
    assert m["zeroshot_calibrated_temperature"] != pytest.approx(m["zeroshot_temperature"])
    assert (tmp_path / "m.png").stat().st_size > 10_000  # the reliability diagram
    assert m["zeroshot_calibrated_on_evaluation_data"] == 1  # before: accepted without a word
    held = class_folders(tmp_path / "held", 2, seed=4)
    assert run(model_dir, tmp_path, "--task", "zeroshot", "--data", str(test), "--calibrate", str(held),
               "zeroshot.templates={}")["zeroshot_calibrated_on_evaluation_data"] == 0


def test_options_of_tasks_not_selected_and_bad_values_are_refused_before_embedding(model_dir, tmp_path, capsys,
                                                                                   monkeypatch):
    # Before: `--rerank` with `--task zeroshot` was ignored without a word, and `--rerank -1` was refused only
    # after every image had been embedded.
    test = class_folders(tmp_path / "test", 2, seed=1)

    def no_embedding(*a, **k):
        raise AssertionError("embedded before the options were checked")

    monkeypatch.setattr(DualEncoder, "encode_image", no_embedding)
    assert cli.main(["eval", str(model_dir), "--task", "zeroshot", "--data", str(test), "--rerank", "5",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert "--rerank is an option of --task retrieval, which is not selected" in capsys.readouterr().err
    assert cli.main(["eval", str(model_dir), "--task", "retrieval", "--data", str(test), "--rerank", "-1",
                     "--out", str(tmp_path / "x.json")]) == 2
    assert "retrieval.rerank=-1 must be 0 (off)" in capsys.readouterr().err


def test_rerank_over_the_whole_gallery_ranks_by_late_interaction(model_dir, shapes, tmp_path):
    from openalign.eval.features import embed_split
    from openalign.eval.options import EvalOptions
    from openalign.loss import late_interaction
    from openalign.model.encode import encode_text_tokens
    from openalign.model.hub import load_pretrained

    data = ["--data", str(shapes["eval"]), "--task", "retrieval"]
    everything = run(model_dir, tmp_path, *data, "--rerank", "1000")
    assert everything["rerank_k"] == 1000 and everything["rerank_ms_per_query"] > everything["ms_per_query"]
    # oracle: rank every text's image, and every image's captions, by FILIP scores over the whole gallery
    model, tok, cfg = load_pretrained(model_dir)
    split = embed_split(model, str(shapes["eval"]), EvalOptions(resize=cfg.model.vision.resize_size,
                                                                crop=cfg.model.vision.image_size), False, patches=True)
    tokens, mask = encode_text_tokens(model, tok, split.captions)
    i2t, t2i = late_interaction(split.image_patches, torch.ones(split.image_patches.shape[:2], dtype=torch.bool),
                                tokens, mask)
    owner = split.text_to_image
    text_rank = [(t2i[:, j] >= t2i[owner[j], j]).sum().item() - 1 for j in range(len(owner))]
    image_rank = []
    for i in range(len(split.labels)):
        mine = owner == i
        best = i2t[i, mine].max()
        image_rank.append(((i2t[i] >= best) & ~mine).sum().item())
    for k in (1, 5, 10):
        assert everything[f"t2i_r{k}_rerank"] == pytest.approx(sum(r < k for r in text_rank) / len(text_rank))
        assert everything[f"i2t_r{k}_rerank"] == pytest.approx(sum(r < k for r in image_rank) / len(image_rank))


def test_zeroshot_reports_the_single_prompt_top1_beside_the_ensemble(model_dir, tmp_path):
    """With several templates, zeroshot also reports CLIP's one prompt ("a photo of a {}.") alone and the ensemble's
    gain over it; the single-prompt figure is what a run with that prompt alone reports as its top-1."""
    data = class_folders(tmp_path / "test", 3)
    (tmp_path / "many.txt").write_text("a photo of a {}.\na drawing of a {}.\nthe {} shape.\n")
    (tmp_path / "one.txt").write_text("a photo of a {}.\n")
    ensemble = run(model_dir, tmp_path, "--data", str(data), "--task", "zeroshot", "--templates", str(tmp_path / "many.txt"))
    alone = run(model_dir, tmp_path, "--data", str(data), "--task", "zeroshot", "--templates", str(tmp_path / "one.txt"))
    assert ensemble["zeroshot_top1_single_prompt"] == pytest.approx(alone["zeroshot_top1"])
    assert ensemble["zeroshot_ensemble_gain"] == pytest.approx(ensemble["zeroshot_top1"] - alone["zeroshot_top1"])
    assert "zeroshot_top1_single_prompt" not in alone  # one prompt: nothing to compare
