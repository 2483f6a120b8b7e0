"""The failure-modes study (experiments/failure_modes/): each part through the study's command, and each verdict
computed from the numbers."""

import json

import pytest

from tests.conftest import save_tiny_model, shape_images, shape_shards
from experiments import failure_modes
from experiments.failure_modes import captions, depth, frequency, objects, relations, rerank, toy


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return shape_shards(tmp_path_factory.mktemp("shapes"))


def test_failure_modes_composition_toy_through_main(tmp_path, capsys):
    """The teaching's composition toy at its smallest: both towers trained, the held-out pairs scored, a report with
    the table, the teaching's figures beside ours, and a plot."""
    out = tmp_path / "fm"
    assert failure_modes.main(["--only", "composition-toy", "--seeds", "2", "--out", str(out), "--quiet",
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
    with pytest.raises(SystemExit) as refused:  # argparse's one line, with the parts to choose from
        failure_modes.main(["--only", "nosuch", "--out", str(out), "--quiet"])
    assert refused.value.code == 2


def test_composition_toy_captions_are_bags_of_its_fifteen_words():
    import torch

    assert len(toy.VOCAB) == 15 and len(toy.HELD_OUT) == 4
    ids, offsets = toy.captions([("red", "cone"), ("blue", "star")], torch.Generator().manual_seed(0), 2)
    first = ids[:offsets[1]].tolist()
    assert first[:2] == [toy.VOCAB.index("red"), toy.VOCAB.index("cone")] and len(first) <= 4
    assert all(toy.VOCAB[i] in toy.FILLERS for i in first[2:])


def test_failure_modes_generic_captions_score_near_pmi_not_by_frequency(tmp_path):
    """A caption that goes with every image (half of all pairs): the most frequent caption of every image by count,
    never an image's best by the contrastive scores, which sit near its PMI (zero)."""
    out = tmp_path / "fm"
    assert failure_modes.main(["--only", "generic-captions", "--out", str(out), "--quiet",
                               "generic_steps=400"]) == 0
    result = json.loads((out / "results.json").read_text())["generic-captions"]
    assert result["count_generic_best_share"] > 0.9 and result["pmi_generic_best_share"] == 0.0
    assert result["mean"]["generic_best_share"] < 0.05
    assert abs(result["mean"]["generic_score"]) < 0.5 < result["mean"]["specific_best"]
    assert abs(result["pmi_generic"]) < 0.05
    assert "## Generic captions" in (out / "report.md").read_text()
    assert (out / "generic_captions.png").stat().st_size > 0


def test_failure_modes_rerank_cost_measures_pooled_search_and_reranking(tmp_path):
    model = save_tiny_model(tmp_path / "model", ["a red circle", "a blue square"])
    images = shape_images(tmp_path / "images")
    out = tmp_path / "fm"
    assert failure_modes.main(["--only", "rerank-cost", "--out", str(out), "--quiet",
                               f"rerank_model={model}", f"rerank_images={images}", "rerank_shortlists=2,5",
                               "rerank_queries=3"]) == 0
    result = json.loads((out / "results.json").read_text())["rerank-cost"]
    assert result["images"] == 12 and set(result["rerank_seconds"]) == {"2", "5"}
    assert result["pooled_seconds"] > 0 and result["embed_seconds_per_image"] > 0
    assert result["break_even_queries"]["5"] == pytest.approx(
        12 * result["embed_seconds_per_image"] / result["rerank_seconds"]["5"])
    assert "## Pooled search against late-interaction" in (out / "report.md").read_text()
    assert (out / "rerank_cost.png").stat().st_size > 0
    assert failure_modes.main(["--only", "rerank-cost", "--out", str(out), "--quiet",
                               f"rerank_model={tmp_path / 'none'}"]) == 2  # no model: one sentence


def test_failure_modes_concept_frequency_bins_accuracy_by_training_frequency(shapes, tmp_path):
    model = save_tiny_model(tmp_path / "model", ["a red circle", "a blue square"])
    out = tmp_path / "fm"
    assert failure_modes.main(["--only", "concept-frequency", "--out", str(out), "--quiet",
                               f"frequency_models={model}", f"frequency_train={shapes['train']}",
                               f"frequency_eval={shapes['eval']}"]) == 0
    (name, row), = json.loads((out / "results.json").read_text())["concept-frequency"]["sets"].items()
    assert row["images"] > 0 and 0 <= row["accuracy"] <= 1 and row["chance"] == pytest.approx(1 / row["classes"])
    assert sum(b["images"] for b in row["bins"]) == row["images"]
    assert "## Zero-shot accuracy against concept frequency" in (out / "report.md").read_text()
    assert (out / "concept_frequency.png").stat().st_size > 0
    # a second part run into the same study keeps the first one's results, each with its own options
    assert failure_modes.main(["--only", "generic-captions", "--out", str(out), "--quiet",
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
    assert failure_modes.main(["--only", "relations", "--only", "several-objects", "--out", str(out),
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


def test_failure_modes_deeper_tower_trains_each_depth_on_shapes(tmp_path):
    out = tmp_path / "fm"
    budget = (f"scene_overrides=train.steps=2,train.eval_every=0,train.checkpoint_every=0,"
              f"data.data_dir={tmp_path / 'data'}")
    assert failure_modes.main(["--only", "deeper-tower", "--out", str(out), "--quiet",
                               "scene_preset=tiny", "depths=0.25,0.5", budget,
                               "depth_overrides=train.steps=3,optim.lr=2e-3,optim.warmup_steps=1"]) == 0
    depths = json.loads((out / "results.json").read_text())["deeper-tower"]["depths"]
    assert set(depths) == {"0.25", "0.5"} and depths["0.25"]["chance"] == pytest.approx(1 / 64)
    assert all(0 <= row["mean"]["compositional_unseen_top1"] <= 1 for row in depths.values())
    # the deeper tower's own recipe goes after the scenes' budget, for every depth alike
    for coefficient in ("0.25", "0.5"):
        cfg = json.loads((out / "runs" / f"depth{coefficient}" / "seed0" / "config.json").read_text())
        assert (cfg["train"]["steps"], cfg["optim"]["lr"], cfg["optim"]["warmup_steps"]) == (3, 2e-3, 1)
    assert "## Composition with openalign's towers" in (out / "report.md").read_text()
    assert (out / "deeper_tower.png").stat().st_size > 0


def test_failure_modes_deeper_tower_reading_needs_both_depths_trained():
    """The reading compares composition only once both depths fit the seen pairs, and calls a gap only outside the
    seeds' spread."""
    def row(unseen, seen, spread=0.02):
        return {"mean": {"compositional_unseen_top1": unseen, "compositional_seen_top1": seen, "final_loss": 4.0},
                "std": {"compositional_unseen_top1": spread}, "chance": 1 / 64}

    untrained = depth.reading({"depths": {"0.25": row(0.97, 1.0), "1": row(0.06, 0.53)}})[0]
    assert "untrained" in untrained and "composes worse" not in untrained
    worse = depth.reading({"depths": {"1": row(0.60, 1.0, 0.13), "0.25": row(0.87, 0.99)}})[0]
    assert "60.0% against 87.0%" in worse and "composes worse" in worse  # the deeper first, whatever the order
    within = depth.reading({"depths": {"0.25": row(0.87, 0.99), "1": row(0.80, 1.0, 0.13)}})[0]
    assert "no difference outside" in within


def test_each_parts_verdict_follows_its_numbers():
    """No verdict is written in: the same sentence turns when the numbers do."""
    def towers(linear, hidden, spread):
        row = lambda acc, loss, sd: {"mean": {"final_loss": loss, "heldout_accuracy": acc},  # noqa: E731
                                     "std": {"heldout_accuracy": sd}}
        return {"towers": {"linear": row(linear, 0.10, 0.01), "hidden": row(hidden, 0.05, spread)}}

    assert "composes worse, as claimed, and its seeds spread wider" in toy.reading(towers(0.96, 0.85, 0.05))[0]
    assert "composes worse, as claimed." in toy.reading(towers(0.96, 0.85, 0.0))[0]
    assert "does not compose worse" in toy.reading(towers(0.85, 0.96, 0.05))[0]

    def relation(mean, std=0.01):
        return {"losses": {"softmax": {"mean": {"pooled": mean, "late": 0.5}, "std": {"pooled": std, "late": 0.0}}}}

    assert "near chance" in relations.reading(relation(0.52))[0]
    assert "near chance" in relations.reading(relation(0.5))[1]
    assert "above chance" in relations.reading(relation(0.75))[0]
    assert "near chance" in relations.reading(relation(0.75, std=0.2))[0]  # within two seed spreads

    def split(low, high):
        return {"split": {"1": {"top_share": low, "shown_mass": 0.1}, "100": {"top_share": high, "shown_mass": 0.9}}}

    assert "concentrates on one of them" in objects.reading(split(0.4, 0.9))
    assert "does not concentrate" in objects.reading(split(0.6, 0.5))

    timings = {"images": 1000, "pooled_seconds": 0.01, "rerank_seconds": {"10": 0.002, "200": 0.004},
               "embed_seconds_per_image": 0.02, "break_even_queries": {"10": 10_000, "200": 5_000}}
    said = " ".join(rerank.reading(timings))
    assert "slower than K grows" in said and "less than the towers' pass" in said
    timings |= {"rerank_seconds": {"10": 0.002, "200": 0.04}, "break_even_queries": {"10": 10_000, "200": 500}}
    said = " ".join(rerank.reading(timings))
    assert "in proportion to K" in said and "not cheap" in said

    bins = [{"low": 0, "high": 1, "accuracy": 0.1}, {"low": 10, "high": 100, "accuracy": 0.3}]
    assert "rises with how often" in frequency.reading("emoji", {"slope_per_decade": 0.05, "bins": bins})
    assert "does not rise" in frequency.reading("emoji", {"slope_per_decade": -0.01, "bins": bins})
    generic = {"mean": {"generic_best_share": 0.0, "generic_score": 0.01, "specific_best": 2.0},
               "pmi_generic": 0.0, "count_generic_best_share": 1.0}
    assert "The claim reproduces" in captions.reading(generic)
    generic["mean"]["generic_best_share"] = 0.3
    assert "does not reproduce" in captions.reading(generic)
