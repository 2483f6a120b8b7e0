"""CLIP_benchmark interoperability: its webdataset evaluation layout read as released, and its result JSON.

The layout is made here with webdataset's ShardWriter, called as `clip_benchmark.webdataset_builder.convert_dataset`
calls it (`SPLIT/%d.tar`, keys `s%07d`, the image under its format's extension, the class index as `cls`, which
webdataset's encoder writes as its decimal text), and the metadata files written as that function writes them
(`print(*names, sep="\\n", end="\\n")`; `nshards.txt` the shard count). CLIP_benchmark itself cannot be installed
here (it needs torchvision, which has no CPU build for torch 2.13)."""

import io
import json
from pathlib import Path

import pytest

from openalign.cli import main
from openalign.data import sources
from openalign.eval.datasets import load_classnames, load_templates
from conftest import COLORS, SHAPES, save_tiny_model, shape_image

CLASSES = ["red", "green", "blue", "yellow"]  # CLIP_benchmark's class indices 0..3
TEMPLATES = ["a photo of a {c}.", "a {c} shape.", "a drawing of the {c} thing."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    words = [f"a {c} {s}" for c in COLORS for s in SHAPES] + [t.replace("{c}", c) for t in TEMPLATES for c in CLASSES]
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", words)


def export_wds(root: Path, samples, split: str = "test", classes=CLASSES, templates=TEMPLATES, image_format="webp",
               max_count=4, dataset_type: str | None = None) -> Path:
    """`samples`: (PIL image, class index) or (PIL image, caption lines) for a retrieval set."""
    import webdataset

    (root / split).mkdir(parents=True)
    if classes:
        with open(root / "classnames.txt", "w") as f:
            print(*classes, sep="\n", end="\n", file=f)
    if templates:
        with open(root / "zeroshot_classification_templates.txt", "w") as f:
            print(*templates, sep="\n", end="\n", file=f)
    if dataset_type:
        (root / "dataset_type.txt").write_text(dataset_type + "\n")
    sink = webdataset.ShardWriter(str(root / split / "%d.tar"), maxcount=max_count, verbose=0)
    for index, (image, target) in enumerate(samples):
        buf = io.BytesIO()
        image.save(buf, format="webp", lossless=True)
        sink.write({"__key__": f"s{index:07d}", image_format: buf.getvalue(),
                    ("txt" if isinstance(target, str) else "cls"): target})
    shards = sink.shard
    sink.close()
    (root / split / "nshards.txt").write_text(f"{shards}\n")
    return root


def coloured(classes=("red", "green", "blue")):
    """Shapes of three of the four classes (yellow, class 3, is in classnames.txt but not in this split)."""
    return [(shape_image(color, shape, 44), CLASSES.index(color)) for color in classes for shape in SHAPES]


def test_templates_with_c_and_class_indices_read_as_released(tmp_path):
    (tmp_path / "t.txt").write_text("a photo of a {c}.\nitap of a {c}.\n")
    assert load_templates(str(tmp_path / "t.txt")) == ("a photo of a {}.", "itap of a {}.")
    (tmp_path / "names.txt").write_text("\n".join(f"class {i}" for i in range(12)) + "\n")
    # a split holding only some classes: names by index (before: "has 12 names for 2 classes")
    assert load_classnames(str(tmp_path / "names.txt"), ["11", "3"]) == {"11": "class 11", "3": "class 3"}


def test_the_layout_gives_the_items_of_a_split_with_their_class_index(tmp_path):
    root = export_wds(tmp_path / "wds_colors", coloured())
    assert sources.clip_benchmark_root(str(root)) == root and sources.is_shards(str(root))
    assert sorted(Path(s).name for s in sources.shard_list(str(root))) == ["0.tar", "1.tar", "2.tar"]
    items = list(sources.items(str(root), counter={}, captionless=False))  # as evaluation reads them: no text, a label
    assert [item.label for item in items] == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert all(item.data and not item.texts for item in items)
    with pytest.raises(Exception, match="has no split 'train'; it has test"):
        sources.shard_list(str(root), "train")
    (root / "test" / "nshards.txt").write_text("4\n")
    with pytest.raises(Exception, match="says 4 shards but .*3.tar does not exist"):
        sources.shard_list(str(root))


def test_zeroshot_on_the_layout_uses_its_classes_and_prompts(model_dir, tmp_path, capsys):
    """The dataset's classnames and templates are used and every class competes (yellow too, absent from the
    split): the numbers equal openalign.load's classifier over the four names with the same prompts."""
    import torch

    import openalign

    root = export_wds(tmp_path / "wds_colors", coloured())
    assert main(["eval", str(model_dir), "--data", str(root), "--task", "zeroshot", "--out",
                 str(tmp_path / "wds.json")]) == 0
    assert "the 3 prompts of" in capsys.readouterr().err
    wds = json.loads((tmp_path / "wds.json").read_text())
    images, labels = zip(*coloured())
    scores = openalign.load(model_dir, device="cpu").classify(list(images), CLASSES,
                                                              templates=[t.replace("{c}", "{}") for t in TEMPLATES])
    predicted, truth = torch.as_tensor(scores).argmax(dim=1), torch.tensor(labels)
    recalls = [float((predicted[truth == c] == c).float().mean()) for c in truth.unique()]
    assert wds["zeroshot_n_classes"] == 4 and wds["zeroshot_n_images"] == 9
    assert wds["zeroshot_top1"] == pytest.approx(float((predicted == truth).float().mean()))
    assert wds["zeroshot_mean_per_class_recall"] == pytest.approx(sum(recalls) / len(recalls))
    # --templates chooses others than the dataset's
    assert main(["eval", str(model_dir), "--data", str(root), "--task", "zeroshot", "--templates", "generic",
                 "--out", str(tmp_path / "generic.json")]) == 0
    assert "prompts of" not in capsys.readouterr().err


def clip_benchmark_build(paths: list[Path]) -> list[dict]:
    """The rows CLIP_benchmark's `clip_benchmark build` makes of result files (cli.py main_build, LAION-AI's
    release): the metrics, then every other key, `metrics` removed, and `model_fullname` = model + ' ' +
    pretrained."""
    rows = []
    for path in paths:
        data = json.load(open(path))
        row = {}
        row.update(data["metrics"])
        row.update(data)
        del row["metrics"]
        row["model_fullname"] = row["model"] + " " + row["pretrained"]
        rows.append(row)
    return rows


def test_results_in_clip_benchmarks_format(model_dir, tmp_path, capsys):
    root = export_wds(tmp_path / "wds_colors", coloured())
    out = str(tmp_path / "results" / "{dataset}_{model}_{task}.json")
    assert main(["eval", str(model_dir), "--data", str(root), "--task", "zeroshot", "--format", "clip_benchmark",
                 "--out", out]) == 0
    ours = json.loads((tmp_path / "metrics.json").read_text()) if (tmp_path / "metrics.json").exists() else None
    assert ours is None  # only CLIP_benchmark's file is written
    path = tmp_path / "results" / "wds_colors_model_zeroshot_classification.json"
    [row] = clip_benchmark_build([path])
    assert row["dataset"] == "wds_colors" and row["task"] == "zeroshot_classification" and row["language"] == "en"
    assert row["model_fullname"] == f"model {Path(model_dir).resolve()}"
    assert 0 <= row["acc1"] <= 1 and 0 <= row["mean_per_class_recall"] <= 1
    assert row["acc5"] is None  # 4 classes: CLIP_benchmark writes no top-5 under 5
    # a retrieval set (dataset_type.txt: retrieval, captions as .txt lines): image_ and text_retrieval_recall@K
    retrieval = export_wds(tmp_path / "wds_captions", [(shape_image(c, s, 44), f"a {c} {s}\n{s} that is {c}")
                                                       for c in ("red", "blue") for s in SHAPES],
                           classes=None, templates=None, dataset_type="retrieval")
    assert main(["eval", str(model_dir), "--data", str(retrieval), "--task", "retrieval", "--format", "clip_benchmark",
                 "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert set(result["metrics"]) == {f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10)}
    assert result["task"] == "zeroshot_retrieval"
    # two tasks need {task} in --out; a task without a place in the format is refused
    capsys.readouterr()
    assert main(["eval", str(model_dir), "--data", str(root), "--task", "knn", "--format", "clip_benchmark",
                 "--out", str(tmp_path / "k.json")]) == 2
    assert "--task knn has no place in it" in capsys.readouterr().err
