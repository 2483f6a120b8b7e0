"""Public dual encoders (model/families.py): a tiny random CLIPModel and SiglipModel, built offline with
transformers (`save_pretrained`, a tokenizer trained here, the family's PIL image processor), give through openalign
the embeddings transformers' own `get_image_features` / `get_text_features` give with the directory's processor
and tokenizer conventions."""

import dataclasses
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import transformers
from PIL import Image

import openalign
from openalign import cli, presets
from openalign.config import ConfigError, check, override
from openalign.data import sources, transforms
from openalign.model.encode import encode_images, encode_texts
from openalign.model.dual_encoder import DualEncoder
from openalign.model.hub import init_towers, load_pretrained

TEXTS = ["a red circle", "two blue squares on a green field", "a", "the small yellow triangle next to a big red one"]
CORPUS = TEXTS * 3 + ["a photo of a cat", "a photo of a dog", "blue green red yellow", "circle square triangle"]
SIZES = [(50, 37), (37, 61), (64, 64), (90, 45)]  # non-square: CLIP's shortest-side resize and crop matter


def clip_tokenizer():
    """CLIP's tokenizer class around a byte-level BPE trained here on CORPUS (CLIP's specials at the end)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator([t.lower() for t in CORPUS], trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=alphabet, end_of_word_suffix="</w>", show_progress=False))
    vocab = dict(bpe.get_vocab())
    for char in alphabet:  # every byte alone at a word's end
        vocab.setdefault(char + "</w>", len(vocab))
    vocab = {token: i for i, token in enumerate(sorted(vocab, key=vocab.get))}
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    return transformers.CLIPTokenizer(vocab=vocab, merges=merges)


def siglip_tokenizer(tmp_path):
    """SigLIP's tokenizer class around a SentencePiece model trained here on CORPUS."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=40, hard_vocab_limit=False,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   character_coverage=1.0, minloglevel=2)
    (tmp_path / "spiece.model").write_bytes(model.getvalue())
    return transformers.SiglipTokenizer(vocab_file=str(tmp_path / "spiece.model"))


TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def clip_dir(root):
    tokenizer = clip_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = transformers.CLIPConfig(
        text_config=TOWER | dict(vocab_size=len(tokenizer), max_position_embeddings=77, eos_token_id=eos,
                                 bos_token_id=eos - 1, pad_token_id=eos),
        vision_config=TOWER | dict(image_size=32, patch_size=8), projection_dim=16)
    torch.manual_seed(0)
    model = transformers.CLIPModel(config).eval()
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    processor = transformers.CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32})
    processor.save_pretrained(root)
    return root, model, transformers.CLIPImageProcessorPil.from_pretrained(root), {"padding": True}


def siglip_dir(root):
    tokenizer = siglip_tokenizer(root.parent)
    config = transformers.SiglipConfig(
        text_config=TOWER | dict(vocab_size=len(tokenizer), max_position_embeddings=64, pad_token_id=0,
                                 bos_token_id=1, eos_token_id=1),
        vision_config=TOWER | dict(image_size=32, patch_size=8))
    torch.manual_seed(0)
    model = transformers.SiglipModel(config).eval()
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(root)
    # as transformers' zero-shot pipeline tokenizes for SigLIP (it was trained so)
    return root, model, transformers.SiglipImageProcessorPil.from_pretrained(root), \
        {"padding": "max_length", "max_length": 64, "truncation": True}


FAMILIES = {"clip": clip_dir, "siglip": siglip_dir}


def pictures(folder):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate(SIZES):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pixels[: h // 2] //= 2  # some structure, so that a crop or a shift changes the features
        Image.fromarray(pixels).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(TEXTS[i])
    return [Image.open(folder / f"{i}.png").convert("RGB") for i in range(len(SIZES))]


def reference(model, processor, tokenizer_kwargs, root, images):
    """transformers' own features: the directory's processor and tokenizer, the model's get_*_features."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(root)
    with torch.no_grad():
        pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
        image = model.get_image_features(pixel_values=pixel_values).pooler_output
        text = model.get_text_features(**tokenizer(TEXTS, return_tensors="pt", **tokenizer_kwargs)).pooler_output
    return F.normalize(image, dim=-1), F.normalize(text, dim=-1)


def ours(root, folder, **vision_changes):
    """openalign's embeddings of the folder's images and of TEXTS, through the encoding every command uses."""
    model, tokenizer, cfg = load_pretrained(root)
    vision = dataclasses.replace(cfg.model.vision, **vision_changes)
    model.cfg = dataclasses.replace(model.cfg, vision=vision)  # (the rescale and normalization are the model's)
    items = sources.items(str(folder), "", "all", {})
    pixels = torch.stack([transforms.vision_transform(vision)(image)
                          for _, image in sources.decoded(items, alpha=vision.alpha)])
    return encode_images(model, pixels), encode_texts(model, tokenizer, TEXTS, 2, cfg.model.text.max_length)


def cosines(a, b):
    return (F.normalize(a, dim=-1) * F.normalize(b, dim=-1)).sum(-1)


@pytest.fixture(params=list(FAMILIES))
def family(request, tmp_path):
    root = tmp_path / request.param
    root.mkdir()
    built = FAMILIES[request.param](root)
    images = pictures(tmp_path / "images")
    return request.param, built, tmp_path / "images", images


def test_a_public_checkpoint_embeds_as_transformers_does_with_its_own_processor_and_tokenizer(family, tmp_path):
    name, (root, model, processor, tokenizer_kwargs), folder, images = family
    want_images, want_texts = reference(model, processor, tokenizer_kwargs, root, images)
    got_images, got_texts = ours(root, folder)
    assert cosines(got_images, want_images).min() >= 0.9999
    assert cosines(got_texts, want_texts).min() >= 0.9999

    # and through `openalign embed`
    assert cli.main(["embed", str(root), "--images", str(folder), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    stored = torch.from_numpy(np.load(tmp_path / "emb" / "part-000000.npy"))
    paths = pq.read_table(tmp_path / "emb" / "meta-000000.parquet")["path"].to_pylist()
    order = [int(p.rsplit("/", 1)[-1].split(".")[0]) for p in paths]
    assert cosines(stored, want_images[order]).min() >= 0.9999


def test_each_preprocessing_convention_is_what_makes_the_match(family):
    """The parity above fails when a convention is changed on purpose (so it tests them)."""
    name, (root, model, processor, tokenizer_kwargs), folder, images = family
    want_images, want_texts = reference(model, processor, tokenizer_kwargs, root, images)
    wrong = {"the wrong mean": {"pixel_mean": (0.3, 0.3, 0.3)}, "bilinear": {"resample": "bilinear"}}
    if name == "clip":
        wrong["crop off (a square resize)"] = {"resize_mode": "square"}
    for what, change in wrong.items():
        got_images, _ = ours(root, folder, **change)
        assert cosines(got_images, want_images).min() < 0.9999, what
    if name == "siglip":  # padded to the longest text of the batch, as `padding=True` does
        model_, tokenizer, cfg = load_pretrained(root)
        model_.cfg = dataclasses.replace(cfg.model, text=dataclasses.replace(cfg.model.text, padding="longest"))
        got_texts = encode_texts(model_, tokenizer, TEXTS, 4, cfg.model.text.max_length)
        assert cosines(got_texts, want_texts).min() < 0.9999


def test_the_directory_tells_the_preprocessing(family):
    name, (root, *_), _, _ = family
    _, _, cfg = load_pretrained(root)
    v = cfg.model.vision
    expected = {"clip": ("shortest_edge", 40, 32, (0.48145466, 0.4578275, 0.40821073)),
                "siglip": ("square", 32, 32, (0.5, 0.5, 0.5))}[name]
    assert (v.resize_mode, v.resize_size, v.image_size, v.pixel_mean) == expected
    assert (v.resample, v.alpha, cfg.model.family) == ("bicubic", "drop", name)
    assert cfg.model.text.padding == ("max_length" if name == "siglip" else "longest")


def test_a_public_checkpoint_is_not_a_starting_point_for_training_and_an_unknown_family_is_named(tmp_path):
    (tmp_path / "clip").mkdir()
    root, *_ = clip_dir(tmp_path / "clip")
    with pytest.raises(ConfigError, match="model.family=clip is a public checkpoint's format"):
        check(override(presets.get("tiny"), ["model.family=clip"]))  # (without --init)
    with pytest.raises(ConfigError, match="loss.kind=sigmoid learns a logit bias, which a CLIPModel has no place"):
        check(override(presets.get("tiny"), ["model.family=clip", f"model.init_from={root}", "loss.kind=sigmoid"]))
    with pytest.raises(ConfigError, match="is a CLIPModel directory; start from it with `openalign train --init "):
        init_towers(DualEncoder(presets.get("tiny").model), root)
    (root / "preprocessor_config.json").rename(tmp_path / "kept.json")
    with pytest.raises(ConfigError, match="has no preprocessor_config.json or processor_config.json: a CLIPModel's "
                                          "preprocessing"):
        load_pretrained(root)
    (root / "config.json").write_text('{"model_type": "blip"}')
    with pytest.raises(ConfigError, match="holds a blip model; openalign loads AlignModel, VisionTextDualEncoderModel, "
                                          "CLIPModel, SiglipModel and Siglip2Model directories"):
        load_pretrained(root)


def test_eval_embed_index_and_search_run_on_a_public_checkpoint(family, tmp_path, capsys):
    name, (root, *_), folder, _ = family
    assert cli.main(["eval", str(root), "--data", str(folder), "--task", "retrieval", "--out",
                     str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["n_images"] == 4 and 0 <= metrics["i2t_r1"] <= 1
    assert cli.main(["embed", str(root), "--images", str(folder), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--text", "a red circle", "-k", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3  # a header and two hits
    assert cli.main(["search", str(tmp_path / "idx"), "--image", str(folder / "1.png"), "--plus", "blue", "-k", "4"]) == 0
    hits = capsys.readouterr().out.strip().splitlines()[1:]
    assert len(hits) == 4


def class_folders(tmp_path, labels):
    """A class-folder set of 4 pictures per label (each tinted by its class, sizes of SIZES) and the pipeline's one
    template in tmp_path/one.txt; returns (the set's folder, {image path: label})."""
    data = tmp_path / "classes"
    rng = np.random.default_rng(1)
    truth = {}
    for c, label in enumerate(labels):
        (data / label).mkdir(parents=True)
        for i in range(4):
            w, h = SIZES[(c + i) % len(SIZES)]
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            pixels[..., c] = 255 - pixels[..., c] // 4
            Image.fromarray(pixels).save(data / label / f"{i}.png")
            truth[data / label / f"{i}.png"] = label
    (tmp_path / "one.txt").write_text("This is a photo of {}.\n")
    return data, truth


def test_zero_shot_top1_equals_transformers_zero_shot_pipeline(family, tmp_path):
    """A class-folder set, the pipeline's one template: openalign's top-1 is the pipeline's; the probabilities are
    the model's own head's (SigLIP's a per-pair sigmoid with its bias)."""
    name, (root, model, *_), _, _ = family
    data, truth = class_folders(tmp_path, ["red", "blue", "cat"])
    assert cli.main(["eval", str(root), "--data", str(data), "--task", "zeroshot", "--templates",
                     str(tmp_path / "one.txt"), "--out", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    classify = transformers.pipeline("zero-shot-image-classification", model=str(root))
    hits = [classify(Image.open(path), candidate_labels=["blue", "cat", "red"])[0]["label"] == label
            for path, label in truth.items()]
    assert metrics["zeroshot_top1"] == pytest.approx(sum(hits) / len(hits))
    assert metrics["zeroshot_temperature"] == pytest.approx(float(torch.exp(-model.logit_scale.detach())))
    if name == "siglip":
        assert metrics["zeroshot_sigmoid_head"] == 1
        assert metrics["zeroshot_bias"] == pytest.approx(float(model.logit_bias.detach()))
    else:
        assert "zeroshot_sigmoid_head" not in metrics and "zeroshot_bias" not in metrics


def test_openalign_load_gives_transformers_features_and_its_pipelines_probabilities(family):
    name, (root, model, processor, tokenizer_kwargs), folder, images = family
    want_images, want_texts = reference(model, processor, tokenizer_kwargs, root, images)
    m = openalign.load(root, device="cpu")
    assert cosines(m.encode_images(sorted(folder.glob("*.png"))), want_images).min() >= 0.9999
    assert cosines(m.encode_texts(TEXTS), want_texts).min() >= 0.9999
    assert m.head == ("sigmoid" if name == "siglip" else "softmax")
    labels = ["red", "blue", "cat"]
    ours = m.classify(images, labels, templates=["This is a photo of {}."])
    classify = transformers.pipeline("zero-shot-image-classification", model=str(root))
    for row, image in zip(ours, images):
        theirs = {r["label"]: r["score"] for r in classify(image, candidate_labels=labels)}
        assert row.tolist() == pytest.approx([theirs[label] for label in labels], abs=1e-5)


def test_a_command_on_a_public_checkpoint_prints_no_load_report(family, tmp_path):
    """transformers' loading bars and reports (e.g. about keys it did not use) stay out of a command's output."""
    import subprocess
    import sys

    name, (root, *_), folder, _ = family
    run = subprocess.run([sys.executable, "-m", "openalign.cli", "embed", str(root), "--images", str(folder), "--out",
                          str(tmp_path / "emb"), "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for said in ("LOAD REPORT", "Loading weights", "MISSING", "UNEXPECTED"):
        assert said not in run.stdout + run.stderr


def test_dedup_by_embedding_with_a_public_checkpoint(family, tmp_path):
    name, (root, *_), folder, _ = family
    held = tmp_path / "held"
    held.mkdir()
    (held / "copy.png").write_bytes((folder / "1.png").read_bytes())
    assert cli.main(["ingest", str(folder), "--out", str(tmp_path / "pairs.parquet"), "--quiet", "--workers", "1"]) == 0
    assert cli.main(["dedup", str(tmp_path / "pairs.parquet"), "--against", str(held), "--out", str(tmp_path / "d"),
                     "--mode", "embedding", "--model", str(root), "--threshold", "0.99999", "--quiet"]) == 0
    report = json.loads((tmp_path / "d" / "dedup_report.json").read_text())
    assert report["removed_images"] == 1 and report["examples"][0]["train"].endswith("/1.png")


def test_finetune_trains_a_copy_of_a_public_image_tower(family, tmp_path):
    """`--task finetune` (and vtab, through the same classifier) fine-tunes the image tower of a CLIP or SigLIP
    checkpoint with a linear head on its image embedding; the directory's model is left as it was."""
    from openalign.eval import finetune as finetune_lib
    from openalign.eval.options import EvalOptions

    name, (root, *_), _, _ = family
    rng = np.random.default_rng(2)
    for split, n in (("train", 4), ("test", 2)):
        for c, label in enumerate(["red", "green", "blue"]):
            (tmp_path / split / label).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 80, (40, 48, 3), dtype=np.uint8)
                pixels[..., c] += 170
                Image.fromarray(pixels).save(tmp_path / split / label / f"{i}.png")
    assert cli.main(["eval", str(root), "--task", "finetune", "--data", str(tmp_path / "test"), "--train-data",
                     str(tmp_path / "train"), "--ft", "steps=3", "--ft", "batch_size=4", "--ft", "lr=0.01",
                     "--out", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert (metrics["finetune_n_train"], metrics["finetune_n_test"], metrics["finetune_n_classes"]) == (12, 6, 3)
    model, _, cfg = load_pretrained(root)
    before = {k: v.clone() for k, v in model.hf.vision_model.state_dict().items()}
    train = finetune_lib.load_labeled(str(tmp_path / "train"), EvalOptions(), cfg.model.vision.resize_size)
    tuned = finetune_lib.fit(model, train, {"blue": 0, "green": 1, "red": 2},
                             finetune_lib.parse_options(["steps=3", "batch_size=4", "lr=0.01"]), seed=0,
                             crop=cfg.model.vision.image_size)
    assert tuned.head.in_features == cfg.model.embed_dim
    changed = [k for k, v in tuned.tower.hf.vision_model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all(torch.equal(v, before[k]) for k, v in model.hf.vision_model.state_dict().items())


def karpathy(root, n=8):
    """A Karpathy-split JSON of n coloured pictures of several sizes, two captions each (half of them test)."""
    (root / "imgs").mkdir()
    rng = np.random.default_rng(3)
    entries = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        pixels = rng.integers(0, 80, (h, w, 3), dtype=np.uint8)
        pixels[..., i % 3] += 170
        Image.fromarray(pixels).save(root / "imgs" / f"{i}.jpg")
        entries.append({"filename": f"{i}.jpg", "split": "test" if i % 2 else "train",
                        "sentences": [{"raw": TEXTS[i % 4], "sentid": 2 * i}, {"raw": CORPUS[-1 - i % 4], "sentid": 2 * i + 1}]})
    (root / "dataset_flickr30k.json").write_text(json.dumps({"images": entries}))
    return root / "dataset_flickr30k.json"


def test_train_init_fine_tunes_a_clip_model_and_saves_one_that_transformers_reads(tmp_path):
    """`train --init` a CLIPModel directory: its towers, tokenizer and processor train as they are, and the saved
    model is a CLIPModel whose AutoProcessor and get_image_features / get_text_features give openalign's embeddings,
    with the learned temperature in its logit_scale. A SiglipModel directory is refused in one sentence."""
    (tmp_path / "clip").mkdir()
    root, start, _, _ = clip_dir(tmp_path / "clip")
    data = karpathy(tmp_path)
    run_dir = tmp_path / "run"
    common = ["--preset", "finetune-flickr30k", "--data", str(data), "--eval-data", str(data), "--images",
              str(tmp_path / "imgs"), "--quiet", "train.steps=3", "data.global_batch=4", "data.workers=0",
              "data.shuffle_buffer=4", f"data.data_dir={tmp_path / 'data'}", "train.eval_every=0", "optim.lr=1e-2"]
    assert cli.main(["train", "--init", str(root), "--out", str(run_dir), *common]) == 0
    saved = run_dir / "model"
    assert json.loads((saved / "config.json").read_text())["model_type"] == "clip"
    metrics = json.loads((run_dir / "final_metrics.json").read_text())
    assert (metrics["n_images"], metrics["n_texts"]) == (4, 8)

    tuned = transformers.CLIPModel.from_pretrained(saved).eval()
    changed = [k for k, v in tuned.state_dict().items() if not torch.equal(v, start.state_dict()[k])]
    assert any(k.startswith("vision_model.") for k in changed) and any(k.startswith("text_model.") for k in changed)
    assert "logit_scale" in changed  # the learned temperature, saved where CLIP keeps it
    processor = transformers.AutoProcessor.from_pretrained(saved)
    assert type(processor).__name__ == "CLIPProcessor"
    assert processor.image_processor.size == {"shortest_edge": 40} and processor.image_processor.crop_size == {
        "height": 32, "width": 32}

    model = openalign.load(saved)
    images = [Image.open(tmp_path / "imgs" / f"{i}.jpg").convert("RGB") for i in range(4)]
    pil = transformers.CLIPImageProcessorPil.from_pretrained(saved)
    with torch.no_grad():
        want_images = tuned.get_image_features(**pil(images, return_tensors="pt")).pooler_output
        want_texts = tuned.get_text_features(**processor.tokenizer(TEXTS, padding=True, return_tensors="pt")).pooler_output
    assert cosines(model.encode_images(images), want_images).min() >= 0.9999
    assert cosines(model.encode_texts(TEXTS), want_texts).min() >= 0.9999
    assert model.model.temperature.item() == pytest.approx(float(torch.exp(-tuned.logit_scale.detach())), rel=1e-6)

    (tmp_path / "siglip").mkdir()
    siglip_root, *_ = siglip_dir(tmp_path / "siglip")
    assert cli.main(["train", "--init", str(siglip_root), "--out", str(tmp_path / "x"), *common]) == 2
