"""The paper's figures in one data file (eval/paper_tables.csv) and how an evaluation is read against them."""

import pytest

from openalign.eval import paper


def test_the_data_file_holds_each_table_once_with_its_model():
    cells = paper.cells()
    assert {c.table for c in cells} == set(range(1, 12))
    keys = [(c.table, c.row, c.column, c.model) for c in cells]
    assert len(keys) == len(set(keys))  # no cell twice
    assert paper.cell(1, "ALIGN zero-shot", "Flickr30K image-text R@1").value == 88.6
    assert paper.cell(3, "ALIGN", "SITS").std == 1.2 and paper.cell(6, "ALIGN", "All tasks").std == 0.15
    assert paper.cell(5, "ALIGN", "Acc@1 w/ frozen features").model == "EfficientNet-L2"
    assert paper.row_values(9, "ALIGN full data", "EfficientNet-B3 + BERT-mini") == {
        "MSCOCO I2T R@1": 37.4, "MSCOCO T2I R@1": 24.5, "ImageNet KNN R@1": 56.5}
    with pytest.raises(KeyError):
        paper.cell(9, "ALIGN full data", "MSCOCO I2T R@1")  # two models have that row: say which


@pytest.mark.parametrize("path,name", [
    ("data/flickr30k/dataset_flickr30k.json", "Flickr30K"), ("coco/dataset_coco.json", "MSCOCO"),
    ("/data/imagenet/val", "ImageNet"), ("/data/imagenet-r", "ImageNet-R"), ("imagenet_a/", "ImageNet-A"),
    ("imagenetv2-matched-frequency", "ImageNet-V2"), ("oxford_flowers/test", "Oxford Flowers"),
    ("/d/pets/test", "Oxford Pets"), ("food101", "Food101"), ("emoji-eval/classes/test", ""),
])
def test_datasets_are_recognised_by_the_paths_that_name_them(path, name):
    assert paper.dataset(path) == name


def test_an_evaluation_is_read_against_the_cells_of_its_task_and_dataset():
    metrics = {"i2t_r1": 0.5, "t2i_r1": 0.4, "zeroshot_top1": 0.3, "cxc_sts_spearman_boot_mean": 0.7}
    coco = paper.beside(metrics, "coco/dataset_coco.json")
    assert coco["i2t_r1"] == [{"value": 0.586, "std": None, "cell": "Table 1, ALIGN zero-shot, MSCOCO image-text R@1 "
                                                                   "(EfficientNet-L2 + BERT-Large)"}]
    assert coco["cxc_sts_spearman_boot_mean"][0]["std"] == 0.004 and "zeroshot_top1" not in coco
    assert paper.beside(metrics, "imagenet-r/")["zeroshot_top1"][0]["value"] == 0.922
    assert paper.beside(metrics, "my-icons/") == {}  # not one of the paper's sets: nothing to stand beside
    probe = paper.beside({"linear_probe_top1": 0.2}, "my-icons/", protocol="imagenet-probe")
    assert probe["linear_probe_top1"][0]["cell"].startswith("Table 5")  # the protocol says which cell
    lines = paper.lines(probe, {"linear_probe_top1": 0.2})
    assert "0.2000" in lines[1] and "paper 0.8550" in lines[1]
