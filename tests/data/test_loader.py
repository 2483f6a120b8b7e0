import pytest
import torch

from openalign.config import ConfigError
from openalign.data import tars
from openalign.data.loader import Position, StreamSpec, epoch_plan, train_loader
from openalign.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(["a red circle", "a blue square", "green triangle, yellow"], vocab_size=60)


def spec_for(shapes, workers=0, rank_batch=8, seed=0):
    return StreamSpec(shards=tuple(tars.list_shards(str(shapes["train"]))), rank_batch=rank_batch, resize=36,
                      crop=32, max_length=16, seed=seed, shuffle_buffer=16, workers=workers)


def stream(spec, tokenizer, position=None, epochs=1):
    """The batches of `epochs` whole epochs from the start of position's epoch, from `position` on."""
    position = position or Position()
    counts = {s: tars.count_samples(s, spec.fraction) for s in spec.shards}
    per_epoch = epoch_plan(spec, counts, Position(epoch=position.epoch), 1)[0] * max(1, spec.workers)
    plan = epoch_plan(spec, counts, position, epochs * per_epoch - position.batch)
    return list(train_loader(spec, tokenizer, plan, position))


def epoch_batches(spec, tokenizer, epoch=0, position=None):
    return stream(spec, tokenizer, position or Position(epoch=epoch))


def test_batches_are_decoded_augmented_tokenized_and_corrupt_samples_counted(shapes, tokenizer):
    batches = epoch_batches(spec_for(shapes), tokenizer)
    assert len(batches) == 12  # 96 samples // 8 on one reader; 2 corrupt ones are made up by wrapping around
    b = batches[0]
    assert b["pixel_values"].shape == (8, 3, 32, 32) and b["pixel_values"].dtype == torch.uint8
    assert b["input_ids"].shape == b["attention_mask"].shape and (b["input_ids"][:, 0] == tokenizer.cls_token_id).all()
    assert sum(x["skipped"] for x in batches) == 2
    keys = [k for x in batches for k in x["keys"]]
    assert len(set(keys)) == 94 and all(len(set(x["keys"])) == 8 for x in batches)  # never twice in a batch


def test_stream_is_a_pure_function_of_seed_and_epoch(shapes, tokenizer):
    spec = spec_for(shapes)
    first, again = epoch_batches(spec, tokenizer), epoch_batches(spec, tokenizer)
    assert [b["keys"] for b in first] == [b["keys"] for b in again]
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(first, again))
    other_epoch = epoch_batches(spec, tokenizer, epoch=1)
    assert [b["keys"] for b in other_epoch] != [b["keys"] for b in first]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_from_any_position_continues_the_same_stream(shapes, tokenizer, workers):
    spec = spec_for(shapes, workers=workers)
    full = epoch_batches(spec, tokenizer)
    for cut in (1, 3, 4):
        position = Position()
        for batch in full[:cut]:
            position.advance(batch)
        rest = epoch_batches(spec, tokenizer, position=position)
        assert [b["keys"] for b in rest] == [b["keys"] for b in full[cut:]]
        assert torch.equal(rest[0]["pixel_values"], full[cut]["pixel_values"])


@pytest.mark.parametrize("workers", [0, 2])
def test_one_loader_runs_epoch_after_epoch_and_resumes_in_any_of_them(shapes, tokenizer, workers):
    spec = spec_for(shapes, workers=workers)
    three = stream(spec, tokenizer, epochs=3)  # one DataLoader, its workers started once
    per_epoch = [epoch_batches(spec, tokenizer, epoch=e) for e in range(3)]
    assert [b["keys"] for b in three] == [b["keys"] for epoch in per_epoch for b in epoch]
    assert [b["epoch"] for b in three] == [e for e in range(3) for _ in per_epoch[e]]
    for cut in (len(per_epoch[0]), len(per_epoch[0]) + 3):  # at the end of epoch 0, and inside epoch 1
        position = Position()
        for batch in three[:cut]:
            position.advance(batch)
        assert position.epoch == three[cut - 1]["epoch"]
        rest = stream(spec, tokenizer, position, epochs=3 - position.epoch)
        assert [b["keys"] for b in rest] == [b["keys"] for b in three[cut:]]
        assert torch.equal(rest[0]["pixel_values"], three[cut]["pixel_values"])


def test_the_epoch_plan_covers_exactly_the_steps_left(shapes):
    spec = spec_for(shapes)
    counts = {s: tars.count_samples(s) for s in spec.shards}
    assert epoch_plan(spec, counts, Position(), 12) == (12,)  # 12 batches an epoch
    assert epoch_plan(spec, counts, Position(), 13) == (12, 12)
    assert epoch_plan(spec, counts, Position(epoch=4, batch=12), 1) == (12, 12)  # the finished epoch, then one
    assert epoch_plan(spec, counts, Position(), 0) == ()


def test_a_fraction_is_a_fixed_nested_subset_the_counts_and_the_stream_agree_on(shapes, tokenizer):
    import dataclasses

    spec = spec_for(shapes)
    every = {b for batch in epoch_batches(spec, tokenizer) for b in batch["keys"]}
    half = {k for k in every if tars.in_fraction(k, 0.5)}
    quarter = {k for k in every if tars.in_fraction(k, 0.25)}
    assert quarter < half < every and 0.3 < len(half) / len(every) < 0.7  # nested, about the share asked for
    stored = {sample["__key__"] for sample in tars.read_samples(list(spec.shards))}  # (corrupt ones too)
    kept = sum(tars.count_samples(s, 0.5) for s in spec.shards)
    assert kept == sum(tars.in_fraction(k, 0.5) for k in stored) < len(stored)
    batches = epoch_batches(dataclasses.replace(spec, fraction=0.5), tokenizer)
    streamed = [k for batch in batches for k in batch["keys"]]
    assert len(batches) == kept // 8 and set(streamed) == half  # (the two corrupt samples made up by wrapping)
    texts = list(tars.all_texts(list(spec.shards), 0.5))
    assert 0 < len(texts) < len(list(tars.all_texts(list(spec.shards))))


def test_two_workers_split_the_shards_and_yield_equal_counts(shapes, tokenizer):
    batches = epoch_batches(spec_for(shapes, workers=2), tokenizer)
    roles = [b["role"] for b in batches]
    assert roles == [0, 1] * (len(roles) // 2)  # round robin: batch b comes from role b % 2
    keys = [k for b in batches for k in b["keys"]]
    assert len(set(keys)) == 94 and len(batches) == 12


def test_too_large_a_batch_is_a_clear_error(shapes, tokenizer):
    with pytest.raises(ConfigError, match="lower data.global_batch"):
        epoch_batches(spec_for(shapes, rank_batch=1000), tokenizer)


def test_missing_shards_are_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no .tar shards"):
        tars.list_shards(str(tmp_path))


def bad_shards(root):
    """Two shards of 24 good shape samples each, plus one of each kind of bad sample, and a third shard cut
    short in the middle of a sample (a truncated download)."""
    import io
    import tarfile

    from conftest import write_shapes

    write_shapes(root, 72, 24, seed=3)
    (root / "manifest.json").unlink()  # counts come from the tars themselves
    with tarfile.open(root / "shapes-000000.tar", "a") as tar:
        good = jpeg_bytes()
        for name, data in (("notext.jpg", good), ("badjson.jpg", good), ("badjson.json", b"{not json"),
                           ("latin1.jpg", good), ("latin1.txt", "caf\xe9 cr\xe8me".encode("latin-1"))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    third = root / "shapes-000002.tar"
    data = third.read_bytes()
    third.write_bytes(data[:len(data) // 2 + 700])  # mid-member
    return root


def jpeg_bytes():
    from conftest import jpeg, shape_image

    return jpeg(shape_image("red", "circle"))


def test_every_reader_skips_and_counts_the_same_bad_samples(tmp_path):
    root = bad_shards(tmp_path / "bad")
    shards = tars.list_shards(str(root))
    counter: dict = {}
    texts = list(tars.all_texts(shards, counter=counter))
    reasons = counter["reasons"]
    assert reasons == {"no_text": 1, "bad_json": 1, "truncated_tar": 1}
    assert "café crème" not in texts and "caf\ufffd cr\ufffdme" in texts  # invalid UTF-8 -> U+FFFD, kept
    complete = len(list(tars.read_samples(shards)))
    # the header count agrees with what the reader yields: the sample cut in half is not counted
    assert sum(tars.count_samples(s) for s in shards) == complete


def test_training_with_its_own_tokenizer_survives_bad_shards(tmp_path, capsys):
    # Before: tarfile.ReadError in count_samples, KeyError/ValueError/UnicodeDecodeError in the tokenizer texts.
    from conftest import read_jsonl
    from openalign import cli

    root = bad_shards(tmp_path / "bad")
    assert cli.main(["train", "--preset", "tiny", "--data", str(root), "--out", str(tmp_path / "run"), "--quiet",
                     "train.steps=12", "train.checkpoint_every=0", "data.global_batch=8"]) == 0
    out = capsys.readouterr().out
    assert "tokenizer: skipped 3 (bad_json 1, no_text 1, truncated_tar 1) unusable training samples" in out
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert rows[-1]["skipped"] >= 3  # the loader met them too, and counted them


@pytest.mark.parametrize("workers", [0, 1])
def test_shards_without_a_usable_sample_are_one_sentence(tmp_path, capsys, workers):
    # Before: a RuntimeError and, from a DataLoader worker, the worker's whole traceback
    from conftest import write_shapes
    from openalign import cli

    write_shapes(tmp_path / "bad", 16, 8, corrupt=16)  # every image undecodable
    assert cli.main(["train", "--preset", "tiny", "--data", str(tmp_path / "bad"), "--out", str(tmp_path / "run"),
                     "--quiet", "train.steps=2", f"data.workers={workers}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "no usable sample in 2 shard(s)" in err and "skipped 16 (undecodable_image 16)" in err


def test_a_tar_cut_at_a_member_boundary_is_truncated_too(tmp_path):
    """tarfile ends quietly when the file ends between two members; only the missing end-of-archive blocks
    tell. The sample the cut went through (its .txt lost) is counted, not yielded without it."""
    import tarfile

    from conftest import write_shapes

    write_shapes(tmp_path, 10, 10, seed=3)
    (tmp_path / "manifest.json").unlink()  # counted from the tar itself
    tar = tmp_path / "shapes-000000.tar"
    with tarfile.open(tar) as t:
        members = t.getmembers()
    cut = members[-1].offset  # the header of the last sample's last member
    tar.write_bytes(tar.read_bytes()[:cut])
    counter: dict = {}
    samples = list(tars.read_samples([str(tar)], counter=counter))
    assert len(samples) == 9 and counter["reasons"] == {"truncated_tar": 1}
    assert all({"jpg", "json", "txt"} <= set(s) for s in samples)
    assert tars.count_samples(str(tar)) == 9
    whole = tmp_path / "whole"
    write_shapes(whole, 10, 10, seed=3)
    assert len(list(tars.read_samples([str(whole / "shapes-000000.tar")], counter=(c := {})))) == 10 and not c


REDNESS = '''
import numpy as np

def redness(images):
    return [float((np.asarray(im, dtype=np.float32)[..., 0] - np.asarray(im, dtype=np.float32)[..., 1]).mean() / 255)
            for im in images]
'''


def test_training_reads_the_original_shards_through_keep_lists(shapes, tokenizer, tmp_path, capsys):
    """data.keep: the stream, the counts and the tokenizer texts skip what the keep-lists drop (here: the red
    shapes, by a screen classifier), without a rewritten corpus; each reader loads one shard's keys at a time."""
    import dataclasses
    import json

    from openalign.cli import main
    from openalign.data.pairs import build_keep_index, open_keep_index
    from test_cli import train_args

    shard_files = sorted(str(p) for p in shapes["train"].glob("*.tar"))
    assert main(["ingest", *shard_files, "--out", str(tmp_path / "pairs.parquet"), "--workers", "1", "--quiet"]) == 0
    (tmp_path / "clf.py").write_text(REDNESS)
    assert main(["screen", str(tmp_path / "pairs.parquet"), "--classifier", f"{tmp_path / 'clf.py'}:redness",
                 "--threshold", "0.1", "--out", str(tmp_path / "screen"), "--quiet"]) == 0
    names = {s["__key__"]: json.loads(s["json"])["name"] for s in tars.read_samples(shard_files)}
    red = {k for k, name in names.items() if name.startswith("red")}
    assert 10 < len(red) < 40

    keep = build_keep_index([str(tmp_path / "screen")], tmp_path / "data")
    assert build_keep_index([str(tmp_path / "screen")], tmp_path / "data") == keep  # built once
    spec = dataclasses.replace(spec_for(shapes), keep=keep)
    streamed = {k for batch in epoch_batches(spec, tokenizer) for k in batch["keys"]}
    usable = set(names) - {"s00000", "s00001"}  # the two corrupt samples were never ingested
    assert streamed and streamed <= usable - red and len(streamed) > len(usable - red) - 8  # one epoch, full batches
    assert sum(tars.count_samples(s, keep=keep) for s in spec.shards) == len(usable - red)
    index = open_keep_index(keep)
    assert index.keys(shard_files[1]) == {k for k in usable - red if k in {s["__key__"] for s in tars.read_samples([shard_files[1]])}}
    assert len(index.allowed) < len(usable - red)  # one shard's keys, not the corpus's
    texts = set(tars.all_texts(shard_files, keep=keep))
    assert texts and not any(t.startswith("a red") or t.endswith(", red") for t in texts)

    capsys.readouterr()
    assert main(train_args(shapes, tmp_path / "run", "train.steps=2", f"data.keep={tmp_path / 'screen'}",
                           f"data.data_dir={tmp_path / 'data'}")) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["keep"] == [str(tmp_path / "screen")]
    # keep-lists of a pair table these shards were never ingested into keep nothing of them: one sentence
    import shutil

    shutil.copytree(shapes["train"], tmp_path / "copy")
    capsys.readouterr()
    assert main(train_args({"train": tmp_path / "copy", "eval": shapes["eval"]}, tmp_path / "other",
                           f"data.keep={tmp_path / 'screen'}", f"data.data_dir={tmp_path / 'data'}")) == 2
    assert "data.keep keeps 0 of the 96 samples in data.train" in capsys.readouterr().err


def test_the_inception_crop_is_a_training_option_as_deterministic_as_the_papers(shapes, tokenizer):
    import dataclasses

    spec = spec_for(shapes)
    inception = dataclasses.replace(spec, augment="inception", min_area=0.25)
    first, again = epoch_batches(inception, tokenizer), epoch_batches(inception, tokenizer)
    paper = epoch_batches(spec, tokenizer)
    assert [b["keys"] for b in first] == [b["keys"] for b in paper]  # the same samples, cropped otherwise
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(first, again))
    assert first[0]["pixel_values"].shape == (8, 3, 32, 32)
    assert not all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(first, paper))


def test_the_training_crop_follows_the_config():
    import openalign.loss  # noqa: F401 - registers the loss kinds check() validates
    from openalign import presets
    from openalign.config import check, override

    cfg = override(presets.tiny(), ["data.crop=inception", "data.crop_min_area=0.3"])
    spec = StreamSpec.for_config(cfg, ["a.tar"])
    assert (spec.augment, spec.min_area) == ("inception", 0.3)
    assert StreamSpec.for_config(presets.tiny(), ["a.tar"]).augment == "pretraining"
    with pytest.raises(ConfigError, match=r"data.crop_min_area=0.0 must be in \(0, 1\]"):
        check(override(presets.tiny(), ["data.crop_min_area=0"]))
    with pytest.raises(ConfigError, match="data.crop=random must be pretraining or inception"):
        check(override(presets.tiny(), ["data.crop=random"]))


def test_text_templates_put_each_text_in_one_drawn_at_random(shapes, tokenizer):
    import dataclasses

    seen = []

    def recording(texts, **kwargs):
        seen.append(list(texts))
        return tokenizer(texts, **kwargs)

    spec = spec_for(shapes)
    plain = epoch_batches(spec, recording)
    plain_texts, seen[:] = [t for batch in seen for t in batch], []
    templates = ("{}", "a picture of {}.", "the {}, drawn.")
    worded = dataclasses.replace(spec, templates=templates)
    first = epoch_batches(worded, recording)
    texts, seen[:] = [t for batch in seen for t in batch], []
    again = epoch_batches(worded, recording)
    assert [b["keys"] for b in first] == [b["keys"] for b in plain]  # the same samples, the same text of each
    assert all(any(t == template.replace("{}", p) for template in templates) for t, p in zip(texts, plain_texts))
    assert {t == p for t, p in zip(texts, plain_texts)} == {True, False}  # some as they are, some in a template
    assert all(any(t.startswith(head) for t in texts) for head in ("a picture of ", "the "))
    assert [t for batch in seen for t in batch] == texts and all(
        torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))  # a function of the seed


def test_text_templates_follow_the_config_and_teach_the_tokenizer_their_words(shapes, tmp_path):
    import openalign.loss  # noqa: F401 - registers the loss kinds check() validates
    from openalign import presets
    from openalign.config import check, override
    from openalign.prepare import prepare_tokenizer

    shards = tars.list_shards(str(shapes["train"]))
    cfg = override(presets.tiny(), ["data.text_templates={},a picture of {}."])
    assert StreamSpec.for_config(cfg, shards).templates == ("{}", "a picture of {}.")
    assert StreamSpec.for_config(presets.tiny(), shards).templates == ()
    worded = prepare_tokenizer(cfg, shards, tmp_path / "worded")
    plain = prepare_tokenizer(presets.tiny(), shards, tmp_path / "plain")
    assert "picture" in worded.tokenize("a picture of a red circle")
    assert "picture" not in plain.tokenize("a picture of a red circle")  # pieces: the shapes never say it
    for bad in ("a picture of", "{} and {}", "{0.__class__}"):
        with pytest.raises(ConfigError, match="must be templates with one {} each"):
            check(override(presets.tiny(), [f"data.text_templates={bad}"]))
