import json

import pytest
from PIL import Image

from openalign.config import ConfigError
from openalign.eval.datasets import eval_stream


@pytest.fixture
def image_dir(tmp_path):
    root = tmp_path / "imgs"
    (root / "val2014").mkdir(parents=True)
    for i, colour in enumerate(["red", "green", "blue"]):
        Image.new("RGB", (50, 40), colour).save(root / "val2014" / f"{i}.jpg")
    (root / "val2014" / "broken.jpg").write_bytes(b"nope")
    return root


def test_karpathy_json_test_split_with_several_captions(tmp_path, image_dir):
    entries = [{"filepath": "val2014", "filename": f"{i}.jpg", "split": split,
                "sentences": [{"raw": f"caption {j} of {i}"} for j in range(5)]}
               for i, split in enumerate(["test", "train", "test"])]
    entries.append({"filepath": "val2014", "filename": "broken.jpg", "split": "test", "sentences": [{"raw": "x"}]})
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": entries}))
    counter = {}
    samples = list(eval_stream(str(tmp_path / "dataset_coco.json"), 36, 32, counter, str(image_dir)))
    assert [s.texts[0] for s in samples] == ["caption 0 of 0", "caption 0 of 2"]
    assert all(len(s.texts) == 5 and s.pixels.shape == (3, 32, 32) for s in samples)
    assert counter == {"skipped": 1}
    with pytest.raises(ConfigError, match="splits are test, train"):
        list(eval_stream(str(tmp_path / "dataset_coco.json"), 36, 32, {}, str(image_dir), split="val"))


def test_caption_tables_group_rows_by_image(tmp_path, image_dir):
    (tmp_path / "caps.csv").write_text("image,caption\nval2014/0.jpg,a red one\nval2014/1.jpg,green\n"
                                       "val2014/0.jpg,another red\n")
    samples = list(eval_stream(str(tmp_path / "caps.csv"), 36, 32, {}, str(image_dir)))
    assert [s.texts for s in samples] == [["a red one", "another red"], ["green"]]
    (tmp_path / "caps.jsonl").write_text(json.dumps({"image": "val2014/2.jpg", "captions": ["blue", "sky"]}) + "\n")
    samples = list(eval_stream(str(tmp_path / "caps.jsonl"), 36, 32, {}, str(image_dir)))
    assert samples[0].texts == ["blue", "sky"]
    (tmp_path / "bad.csv").write_text("file,text\na,b\n")
    with pytest.raises(ConfigError, match="'image' column"):
        list(eval_stream(str(tmp_path / "bad.csv"), 36, 32, {}, str(image_dir)))


def test_classification_folders_tables_names_and_templates(tmp_path):
    from openalign.eval.datasets import load_classnames, load_templates

    root = tmp_path / "cls"
    for label, colour in (("n01", "red"), ("n02", "blue")):
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 40), colour).save(root / label / f"{i}.jpg")
    samples = list(eval_stream(str(root), 36, 32, {}))
    assert [s.meta["name"] for s in samples] == ["n01", "n01", "n02", "n02"] and samples[0].texts == []
    (tmp_path / "labels.csv").write_text("image,label\nn02/0.jpg,n02\nn01/1.jpg,n01\n")
    samples = list(eval_stream(str(tmp_path / "labels.csv"), 36, 32, {}, str(root)))
    assert [s.meta["name"] for s in samples] == ["n02", "n01"]
    (tmp_path / "names.txt").write_text("tench\ngoldfish\n")  # one per sorted label
    assert load_classnames(str(tmp_path / "names.txt"), ["n02", "n01"]) == {"n01": "tench", "n02": "goldfish"}
    (tmp_path / "pairs.tsv").write_text("n02\tgoldfish\nn01\ttench\nn03\tshark\n")
    assert load_classnames(str(tmp_path / "pairs.tsv"), ["n01", "n02"])["n02"] == "goldfish"
    assert len(load_templates("imagenet80")) == 80 and load_templates("generic")[0] == "{}"
    with pytest.raises(ConfigError, match="2 names for 3 classes"):
        load_classnames(str(tmp_path / "names.txt"), ["a", "b", "c"])


@pytest.mark.parametrize("name,content", [
    ("SimLex-999.txt", "word1\tword2\tPOS\tSimLex999\tconc(w1)\nold\tnew\tA\t1.58\t2.72\nsmart\tintelligent\tA\t9.2\t1.75\n"),
    ("combined.csv", "Word 1,Word 2,Human (mean)\nold,new,1.58\nsmart,intelligent,9.2\n"),
    ("combined.tab", "Word 1\tWord 2\tHuman (mean)\nold\tnew\t1.58\nsmart\tintelligent\t9.2\n"),
    ("MEN_dataset_natural_form_full", "old new 1.58\nsmart intelligent 9.2\n"),
    ("MEN_dataset_lemma_form_full", "old-j new-j 1.58\nsmart-j intelligent-j 9.2\n"),
    ("rw.txt", "old\tnew\t1.58\t1\t2\t3\t4\t5\t6\t7\t8\t9\t10\nsmart\tintelligent\t9.2\t9\t9\t9\t9\t9\t9\t9\t9\t9\t9\n"),
])
def test_word_similarity_sets_are_read_as_released(tmp_path, name, content):
    # Before: only the SimLex column names were accepted, and .tab files were split on commas
    from openalign.eval.datasets import word_pairs

    (tmp_path / name).write_text(content)
    assert word_pairs(tmp_path / name) == [("old", "new", 1.58), ("smart", "intelligent", 9.2)]
