import dataclasses

import pytest
import torch

from openalign.config import ConfigError
from openalign.eval import features, retrieval, tasks, zeroshot
from openalign.eval.features import Context
from openalign.eval.options import EvalOptions


def test_one_registry_declares_every_task_and_derives_the_held_out_ones():
    assert list(tasks.TASKS) == ["retrieval", "zeroshot", "knn", "linear-probe", "cxc", "multilingual", "arithmetic",
                                 "compositional", "word-sim", "sts", "finetune", "vtab"]
    assert tasks.HELD_OUT_TASKS == ("retrieval", "zeroshot", "knn", "multilingual", "arithmetic", "compositional")
    assert {n for n, t in tasks.TASKS.items() if t.reads == "path"} == {"word-sim", "sts", "finetune", "vtab"}
    assert tasks.TASKS["linear-probe"].prefix == "linear_probe_" and tasks.TASKS["retrieval"].prefix == ""
    for task in tasks.TASKS.values():  # frozen options with a default for every field
        options = task.options()
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.x = 1


def test_task_options_from_shared_values_and_dotted_overrides():
    options = tasks.configure(["knn", "linear-probe", "zeroshot", "finetune"],
                              ["knn.k=5", "finetune.recipe.lr=0.5", "linear_probe.train_data=other"],
                              train_data="train/", templates=("a {}",), k=None)
    assert options["knn"] == tasks.KnnOptions(train_data="train/", k=5)
    assert options["linear-probe"].train_data == "other" and options["zeroshot"].templates == ("a {}",)
    assert options["finetune"].recipe.lr == 0.5 and options["finetune"].train_data == "train/"
    with pytest.raises(ConfigError, match="did you mean k"):
        tasks.configure(["knn"], ["knn.kk=5"])
    with pytest.raises(ConfigError, match="names no selected task"):
        tasks.configure(["knn"], ["cxc.positive_score=4"])
    with pytest.raises(ConfigError, match="unknown eval task 'knnn'"):
        tasks.configure(["knnn"])


def test_tasks_return_metrics_and_figures_and_mutate_nothing(monkeypatch):
    import copy

    from openalign.eval.features import EvalData

    vectors = torch.eye(4)
    monkeypatch.setattr(features, "encode_texts", lambda model, tok, texts, batch_size, max_length: torch.stack(
        [vectors[int(t.split()[-1])] for t in texts]))
    data = EvalData(vectors.clone(), [f"caption {i}" for i in range(4)], torch.arange(4), ["0", "1", "2", "3"])
    before = copy.deepcopy(data)
    ctx = Context(None, None, EvalOptions(), data)
    metrics, figures = retrieval.retrieval(ctx)
    assert metrics["i2t_r1"] == metrics["t2i_r1"] == 1.0 and set(figures) == {"retrieval"}
    metrics, figures = zeroshot.zeroshot(ctx, tasks.ZeroshotOptions(templates=("label {}",)))
    assert metrics["top1"] == 1.0 and figures["zeroshot"]["classes"] == ["0", "1", "2", "3"]
    assert all(torch.equal(getattr(data, f), getattr(before, f)) if torch.is_tensor(getattr(data, f))
               else getattr(data, f) == getattr(before, f) for f in ("image_embeds", "captions", "text_to_image",
                                                                     "labels", "keys", "meta"))
