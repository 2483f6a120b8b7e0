"""End-to-end runs through `main(argv)` on tiny generated data."""

import contextlib
import io
import json

import pytest

from conftest import save_code_running_pickle, read_jsonl, save_tiny_model, shape_image
from openalign import cli
from openalign.model.hub import load_pretrained
from openalign.train import trainer


def train_args(shapes, out, *overrides):
    return ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--eval-data", str(shapes["eval"]),
            "--out", str(out), "--quiet", "train.steps=6", "train.checkpoint_every=2", *overrides]


def loss_rows(run):
    return [(r["step"], r["loss"], r["temperature"]) for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


@pytest.fixture(scope="module")
def trained(shapes, tmp_path_factory):
    """One tiny run (evaluated at steps 3 and 6), shared by the tests of what a trained model does next."""
    run = tmp_path_factory.mktemp("trained") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(train_args(shapes, run, "train.eval_every=3")) == 0
    return run, printed.getvalue()


def eval_json(model_dir, tmp_path, *args) -> dict:
    assert cli.main(["eval", str(model_dir), *args, "--out", str(tmp_path / "m.json")]) == 0
    return json.loads((tmp_path / "m.json").read_text())


def test_train_evaluates_saves_and_reports(trained):
    run, printed = trained
    assert "i2t_r10" in printed and "x chance" in printed
    metrics = json.loads((run / "final_metrics.json").read_text())
    for key in ("i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", "t2i_r5", "t2i_r10", "mean_recall", "zeroshot_top1",
                "zeroshot_top5", "n_images", "n_texts", "i2t_threshold_std", "t2i_youden_shared", "zeroshot_ece"):
        assert key in metrics
    assert metrics["n_images"] == 24 and metrics["n_texts"] == 48
    assert (run / "training.png").stat().st_size > 10_000 and (run / "report.md").is_file()
    assert json.loads((run / "config.json").read_text())["preset"] == "tiny"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "eval" in r] == [3, 6]
    model, tokenizer, cfg = load_pretrained(run / "model")
    assert tokenizer is not None and cfg.model.text.vocab_size == len(tokenizer)


def test_the_saved_model_evaluates_as_training_did(trained, shapes, tmp_path):
    run, _ = trained
    again = eval_json(trained[0] / "model", tmp_path, "--data", str(shapes["eval"]))
    final = json.loads((run / "final_metrics.json").read_text())
    assert again["i2t_r10"] == final["i2t_r10"] and again["zeroshot_top1"] == final["zeroshot_top1"]
    assert (tmp_path / "m.md").is_file()


def test_eval_on_a_karpathy_json_with_five_captions_per_image(trained, tmp_path):
    (tmp_path / "imgs").mkdir()
    entries = []
    for i, (colour, shape) in enumerate([("red", "circle"), ("blue", "square"), ("green", "triangle")]):
        shape_image(colour, shape).save(tmp_path / "imgs" / f"{i}.png")
        entries.append({"filename": f"{i}.png", "split": "test",
                        "sentences": [{"raw": f"a {colour} {shape} {j}"} for j in range(5)]})
    (tmp_path / "k.json").write_text(json.dumps({"images": entries}))
    karpathy = eval_json(trained[0] / "model", tmp_path, "--data", str(tmp_path / "k.json"), "--images", str(tmp_path / "imgs"),
                         "--task", "retrieval")
    assert (karpathy["n_images"], karpathy["n_texts"]) == (3, 15) and karpathy["chance_t2i_r1"] == 1 / 3


def colour_folders(root, shapes_):
    for colour in ("red", "blue", "green"):
        (root / colour).mkdir(parents=True)
        for shape in shapes_:
            shape_image(colour, shape).save(root / colour / f"{shape}.png")
    return root


def test_zeroshot_on_class_folders_with_80_templates_and_a_class_subset(trained, tmp_path):
    colour_folders(tmp_path / "cls", ["circle"])
    (tmp_path / "subset.txt").write_text("red\nblue\n")
    zeroshot = eval_json(trained[0] / "model", tmp_path, "--data", str(tmp_path / "cls"), "--templates", "imagenet80",
                         "--class-subset", str(tmp_path / "subset.txt"))
    assert (zeroshot["zeroshot_n_classes"], zeroshot["zeroshot_n_images"]) == (2, 2) and "i2t_r1" not in zeroshot


def test_knn_and_linear_probe_against_a_labeled_training_split(tmp_path):
    from openalign.eval.features import embed_split
    from openalign.eval.options import EvalOptions

    # a model whose image embeddings differ by colour (six steps of training embed these images alike)
    model_dir = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in ("red", "blue", "green")
                                                     for s in ("circle", "square", "triangle")])
    test = colour_folders(tmp_path / "cls", ["circle", "square", "triangle"])
    train = colour_folders(tmp_path / "cls_train", ["square", "triangle"])
    transfer = eval_json(model_dir, tmp_path, "--data", str(test), "--task", "knn", "--task",
                         "linear-probe", "--train-data", str(train))
    # oracle: each test image takes the label of its most similar training image (cosine, brute force)
    model, _, cfg = load_pretrained(model_dir)
    options = EvalOptions(resize=cfg.model.vision.resize_size, crop=cfg.model.vision.image_size)
    a, b = (embed_split(model, str(d), options, progress=False) for d in (test, train))
    nearest = (a.image_embeds @ b.image_embeds.T).argmax(dim=1).tolist()
    expected = sum(a.labels[i] == b.labels[j] for i, j in enumerate(nearest)) / len(nearest)
    assert len(set(nearest)) > 1 and expected > 1 / 3  # the oracle is not decided by ties
    assert transfer["knn_n_train"] == 6 and transfer["knn_top1"] == pytest.approx(expected)
    assert "linear_probe_top5" in transfer and transfer["linear_probe_chance_top1"] == 1 / 3
    # the default solver is CLIP's L-BFGS with its C search (docs/evaluation.md, "Choosing the probe's solver")
    assert transfer["linear_probe_solver"] == "lbfgs" and transfer["linear_probe_searched"] == 15
    # task options as dotted overrides
    three = eval_json(model_dir, tmp_path, "--data", str(test), "--task", "knn", "--train-data", str(train), "knn.k=3")
    assert three["knn_k"] == 3 and three["knn_n_train"] == 6
    # no --train-data: the split is its own pair, each colour's 3 images dealt to train, test, train
    alone = eval_json(model_dir, tmp_path, "--data", str(test), "--task", "knn")
    assert (alone["knn_pairs_from"], alone["knn_n_train"], alone["knn_n_test"]) == ("split", 6, 3)


def word_spearman(model_dir, pairs) -> float:
    """Oracle: Spearman of the cosines of the words' embeddings against the human scores."""
    from scipy.stats import spearmanr

    from openalign.model.encode import encode_texts

    model, tokenizer, cfg = load_pretrained(model_dir)
    words = sorted({w for a, b, _ in pairs for w in (a, b)})
    vectors = dict(zip(words, encode_texts(model, tokenizer, words, max_length=cfg.model.text.max_length)))
    cosines = [float(vectors[a] @ vectors[b]) for a, b, _ in pairs]
    return float(spearmanr(cosines, [s for _, _, s in pairs]).statistic)


def test_word_similarity_on_a_simlex_file(trained, tmp_path):
    (tmp_path / "simlex.txt").write_text("word1\tword2\tPOS\tSimLex999\nred\tblue\tA\t3.5\n"
                                         "circle\tsquare\tN\t2.0\nred\tcircle\tA\t0.5\n")
    words = eval_json(trained[0] / "model", tmp_path, "--data", str(tmp_path / "simlex.txt"), "--task", "word-sim")
    pairs = [("red", "blue", 3.5), ("circle", "square", 2.0), ("red", "circle", 0.5)]
    assert words["word_sim_n_pairs"] == 3
    assert words["word_sim_spearman"] == pytest.approx(word_spearman(trained[0] / "model", pairs))


def test_interrupted_run_resumes_with_identical_losses(shapes, tmp_path, monkeypatch):
    overrides = ("data.workers=2", "train.steps=16", "train.log_every=1")
    assert cli.main(train_args(shapes, tmp_path / "straight", *overrides)) == 0
    real_lr_at = trainer.lr_at

    def interrupt_at_step_7(step, *args):
        if step == 7:
            raise KeyboardInterrupt
        return real_lr_at(step, *args)

    monkeypatch.setattr(trainer, "lr_at", interrupt_at_step_7)
    try:
        cli.main(train_args(shapes, tmp_path / "resumed", *overrides))
        raise AssertionError("the run should have stopped")
    except SystemExit as stop:
        assert "--resume" in str(stop)
    monkeypatch.setattr(trainer, "lr_at", real_lr_at)
    assert cli.main(["train", "--out", str(tmp_path / "resumed"), "--resume", "--quiet"]) == 0
    straight, resumed = loss_rows(tmp_path / "straight"), loss_rows(tmp_path / "resumed")
    assert len(straight) == 16 and resumed == straight  # exactly the same numbers, across an epoch boundary


def test_deterministic_kernels_change_no_number_on_the_cpu_and_are_the_runs_alone(shapes, tmp_path, monkeypatch,
                                                                                  capsys):
    """train.deterministic=true: the CPU step is deterministic already, so the same losses; the process's setting is
    back to what it was after the run; an operator with no deterministic kernel is one sentence naming it."""
    import torch

    overrides = ("train.steps=3", "train.log_every=1")
    assert cli.main(train_args(shapes, tmp_path / "plain", *overrides)) == 0
    assert cli.main(train_args(shapes, tmp_path / "exact", *overrides, "train.deterministic=true")) == 0
    assert loss_rows(tmp_path / "exact") == loss_rows(tmp_path / "plain")
    assert not torch.are_deterministic_algorithms_enabled()

    real = trainer.forward_backward

    def with_a_nondeterministic_operator(*args, **kwargs):
        torch.zeros(4).put_(torch.tensor([0, 0]), torch.ones(2))  # put_ without accumulate: no deterministic kernel
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "forward_backward", with_a_nondeterministic_operator)
    capsys.readouterr()
    assert cli.main(train_args(shapes, tmp_path / "refused", *overrides, "train.deterministic=true")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "train.deterministic=true, but" in err and "put_" in err and "train without train.deterministic" in err
    assert not torch.are_deterministic_algorithms_enabled()


def test_user_errors_are_one_sentence(shapes, tmp_path, capsys):
    assert cli.main(["train", "--preset", "tiny", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
    assert cli.main(["train", "--preset", "tiny", "optim.lrr=1"]) == 2
    assert cli.main(["train", "--preset", "nope"]) == 2
    assert cli.main(["train", "--out", str(tmp_path / "empty"), "--resume", "--preset", "tiny", "--data",
                     str(shapes["train"])]) == 2
    assert cli.main(["eval", str(tmp_path), "--data", str(shapes["eval"])]) == 2
    assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "knn"),
                     "eval.tasks=retrieval,linear-probe"]) == 2
    assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "f"),
                     "data.fraction=0"]) == 2
    assert cli.main(["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "f2"),
                     "data.fraction=0.01"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 8 and all(e.startswith("openalign: error: ") for e in errors)
    assert "data.fraction=0.01 keeps 1 of 96 training samples, fewer than one batch of 8" in errors[7]
    assert "did you mean optim.lr" in errors[1] and "Traceback" not in "".join(errors)
    assert "'linear-probe' is not a held-out task" in errors[5]
    assert "data.fraction=0.0 must be the share of the training samples to use, in (0, 1]" in errors[6]


def test_the_whole_config_is_validated_before_any_work(shapes, tmp_path, capsys):
    # Before: batch_size=-1 hung in epoch_plan, 0 raised ZeroDivisionError, steps=-5 trained 0 steps with rc 0,
    # lr=nan trained NaN losses, embed_dim=0 trained a constant loss; each now a sentence, all in one message.
    argv = ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "run"), "--quiet"]
    assert cli.main(argv + ["data.global_batch=-1", "train.steps=-5", "optim.lr=nan", "model.embed_dim=0",
                            "optim.name=adamx"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "5 config values are invalid" in err
    for phrase in ("data.global_batch=-1 must be a positive integer", "train.steps=-5 must be a positive integer",
                   "optim.lr=nan must be a finite number", "model.embed_dim=0 must be a positive integer",
                   "optim.name=adamx must be lamb or adamw"):
        assert phrase in err
    assert cli.main(argv + ["data.global_batch=0"]) == 2
    assert cli.main(argv + ["data.global_batch=8", "train.micro_batch=3"]) == 2
    assert "train.micro_batch=3 must divide each process's batch of 8" in capsys.readouterr().err
    assert cli.main(argv + ["train.device=cuda"]) == 2  # no CUDA here
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing was written


def test_a_loss_kind_takes_its_own_default_for_an_option_it_does_not_read_unless_the_user_set_it(shapes, tmp_path,
                                                                                                   capsys):
    # Before: `train loss.kind=sigmoid` stopped with "loss.label_smoothing=0.1 smooths the softmax's targets ... set
    # loss.label_smoothing=0.0": a value the user never gave (LossConfig's default).
    argv = ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "run"), "--quiet"]
    assert cli.main(argv + ["loss.kind=sigmoid", "--show-config"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["loss"]["label_smoothing"] == 0.0
    assert captured.err.count("\n") == 1 and "loss.kind=sigmoid does not read loss.label_smoothing" in captured.err
    assert cli.main(argv + ["loss.kind=sigmoid", "loss.label_smoothing=0.1"]) == 2  # given by the user: refused
    assert "loss.label_smoothing=0.1 smooths the softmax's targets" in capsys.readouterr().err
    assert cli.main(argv + ["--show-config"]) == 0  # the softmax keeps its default
    assert json.loads(capsys.readouterr().out)["loss"]["label_smoothing"] == 0.1


def test_resume_and_tokenizer_mistakes_are_caught_before_any_work(shapes, tmp_path, capsys):
    # --resume into a new directory: before, it built the corpus and trained a tokenizer, then gave up
    assert cli.main(["train", "--preset", "tiny", "--out", str(tmp_path / "new"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err and not (tmp_path / "new").exists()
    # a mistyped local tokenizer never reaches a hub
    assert cli.main(train_args(shapes, tmp_path / "t", "data.tokenizer=nosuchtok")) == 2
    assert cli.main(train_args(shapes, tmp_path / "t", "data.tokenizer=/nonexistent/tok")) == 2
    err = capsys.readouterr().err
    assert err.count("no tokenizer directory at") == 2 and "Traceback" not in err
    # a truncated checkpoint is called corrupt; a partial last line of metrics.jsonl does not block --resume
    assert cli.main(train_args(shapes, tmp_path / "run")) == 0
    run = tmp_path / "run"
    good = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(good[:len(good) // 2])
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet", "train.steps=8"]) == 2
    assert "checkpoint.pt is corrupt" in capsys.readouterr().err
    (run / "checkpoint.pt").write_bytes(good)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 7, "lo')  # a crash in the middle of a write
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet", "train.steps=8"]) == 0
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r][-1] == 8


def test_a_checkpoint_with_a_pickled_object_is_refused_without_running_it(shapes, tmp_path, capsys):
    # Before: torch.load(weights_only=False) ran the payload on `train --resume` (and in its check before work).
    run = tmp_path / "run"
    assert cli.main(train_args(shapes, run)) == 0
    import torch

    state = torch.load(run / "checkpoint.pt", weights_only=True)
    marker = tmp_path / "pwned"
    save_code_running_pickle(run / "checkpoint.pt", marker, **state)
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet", "train.steps=8"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists(), "the checkpoint's pickled object ran"
    assert "holds Python objects besides tensors" in err and "Traceback" not in err and err.count("\n") == 1
    torch.save(state, run / "checkpoint.pt")  # the real checkpoint, tensors and plain values: loads as before
    assert cli.main(["train", "--out", str(run), "--resume", "--quiet", "train.steps=8"]) == 0


def test_train_into_an_existing_run_is_refused_unless_overwrite(shapes, tmp_path, capsys):
    # Before: `train --out EXISTING` without --resume overwrote the checkpoint and appended to metrics.jsonl, so
    # steps 1-6 appeared twice; the old run's tokenizer was reused whatever the data.
    run = tmp_path / "run"
    assert cli.main(train_args(shapes, run)) == 0
    first = loss_rows(run)
    capsys.readouterr()
    assert cli.main(train_args(shapes, run)) == 2
    err = capsys.readouterr().err
    assert "holds a run already (checkpoint.pt, metrics.jsonl)" in err and "--overwrite" in err
    assert loss_rows(run) == first
    (run / "tokenizer" / "tokenizer.json").write_text("{}")  # an old run's tokenizer is never reused by a new run
    assert cli.main(train_args(shapes, run) + ["--overwrite"]) == 0
    assert loss_rows(run) == first  # one run's rows, the same numbers


def test_inputs_of_the_wrong_kind_are_one_sentence(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    shape_image("red", "circle").save(tmp_path / "a.png")
    pq.write_table(pa.table({"uid": ["1"], "text": ["x"]}), tmp_path / "thin.parquet")
    (tmp_path / "file").write_text("x")
    calls = [
        ["train", "--preset", "tiny", "--data", str(tmp_path / "a.png"), "--out", str(tmp_path / "r")],
        ["filter", str(tmp_path / "thin.parquet"), "--out", str(tmp_path / "f")],
        ["filter", str(tmp_path / "a.png"), "--out", str(tmp_path / "f")],
        ["shard", str(tmp_path / "thin.parquet"), "--out", str(tmp_path / "s")],
        ["ingest", str(tmp_path), "--out", str(tmp_path / "file" / "p.parquet"), "--quiet"],
        ["filter", str(tmp_path / "thin.parquet"), "--out", str(tmp_path / "f"), "max_aspect=0.5"],
    ]
    for argv in calls:
        assert cli.main(argv) == 2, argv
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == len(calls) and all(e.startswith("openalign: error: ") for e in errors)
    assert "a.png is not a webdataset shard (.tar)" in errors[0]
    assert "lacks the columns image_key, width, height" in errors[1]
    assert "a.png is not a Parquet pair table" in errors[2]
    assert "lacks the columns image_key, path, member, url" in errors[3]
    assert "is a file, not a directory" in errors[4]
    assert "max_aspect=0.5 must be at least 1" in errors[5]


def test_python_dash_m_and_version():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "openalign", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("openalign ") and result.stdout.split()[1][0].isdigit()


def test_a_diverging_run_stops_with_one_sentence(shapes, tmp_path, monkeypatch, capsys):
    import torch

    real = trainer.forward_backward

    def nan_from_step_3(*args, **kwargs):
        loss = real(*args, **kwargs)
        return loss * float("nan") if len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) >= 2 else loss

    monkeypatch.setattr(trainer, "forward_backward", nan_from_step_3)
    assert cli.main(train_args(shapes, tmp_path / "run", "train.log_every=1")) == 2
    err = capsys.readouterr().err
    assert "training diverged: the loss is nan at step 3" in err and "Traceback" not in err
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["step"] == 2  # kept, from before


def test_sizes_on_the_command_line():
    import pytest

    from openalign.config import ConfigError
    from openalign.sizes import parse_size as _bytes

    assert [_bytes(t, "--memory") for t in ("4G", "512M", "1.5GiB", "1000", "", "2k")] == \
        [4 * 2**30, 512 * 2**20, int(1.5 * 2**30), 1000, 0, 2048]
    with pytest.raises(ConfigError, match="--memory 'four' is not a size"):
        _bytes("four", "--memory")


def test_activation_checkpointing_on_a_transformers_without_it_is_one_sentence(shapes, tmp_path, monkeypatch,
                                                                              capsys):
    """transformers 5.18 (inside the supported range) has no activation_checkpointing_enable, and its
    gradient_checkpointing_enable recomputes the CLS-only last layer with other shapes (CheckpointError): the
    option is refused there, before any work, with what to do."""
    import transformers

    monkeypatch.delattr(transformers.PreTrainedModel, "activation_checkpointing_enable", raising=False)
    argv = ["train", "--preset", "tiny", "--data", str(shapes["train"]), "--out", str(tmp_path / "run"), "--quiet"]
    assert cli.main(argv + ["train.grad_checkpointing=true"]) == 2
    err = capsys.readouterr().err
    assert "train.grad_checkpointing=true needs a newer transformers" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(not hasattr(__import__("transformers").PreTrainedModel, "activation_checkpointing_enable"),
                    reason="an older transformers: the option is refused there (the test above)")
def test_activation_checkpointing_trains_the_same_steps_without_deprecated_calls(shapes, tmp_path):
    """train.grad_checkpointing recomputes the text tower's activations in backward: the same losses as without,
    through transformers' current call (its old name warns it will be removed in v6)."""
    import warnings

    plain = tmp_path / "plain"
    assert cli.main(train_args(shapes, plain, "train.steps=3")) == 0
    checkpointed = tmp_path / "checkpointed"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(train_args(shapes, checkpointed, "train.steps=3", "train.grad_checkpointing=true")) == 0
    assert not [w for w in caught if "checkpointing_enable" in str(w.message)]

    def flat(run):
        return [x for row in loss_rows(run) for x in row]

    assert len(loss_rows(plain)) == 3 and flat(checkpointed) == pytest.approx(flat(plain), rel=1e-5)


def test_a_command_whose_extra_is_missing_says_so_with_the_pip_command(tmp_path, monkeypatch, capsys):
    """`openalign serve` needs [serve], `--engine spark` needs [spark]: one sentence before any work (the whole
    install without them: tests/test_install.py)."""
    import importlib.util

    real = importlib.util.find_spec
    missing = {"fastapi", "pyspark"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    for argv, says in ((["serve", str(tmp_path)], "openalign serve needs fastapi, which is not installed: "
                                                   "pip install 'openalign[serve]'"),
                       (["filter", str(tmp_path / "p.parquet"), "--out", str(tmp_path / "k"), "--engine", "spark"],
                        "--engine spark needs pyspark, which is not installed: pip install 'openalign[spark]'"),
                       (["ingest", str(tmp_path), "--out", str(tmp_path / "d.parquet"), "--engine", "spark"],
                        "pip install 'openalign[spark]'")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "k").exists() and not (tmp_path / "d.parquet").exists()
