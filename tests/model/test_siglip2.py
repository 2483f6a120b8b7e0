"""Siglip2Model with its NaFlex processor (each image at its own aspect ratio, as a budget of patches): a tiny random
model saved with transformers (`save_pretrained`, `Siglip2ImageProcessorPil`, a SentencePiece tokenizer trained
here) gives through openalign the embeddings of transformers' own `get_image_features` / `get_text_features` on
the processor's pixel_values, pixel_attention_mask and spatial_shapes."""

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import openalign
from openalign import cli
from openalign.config import ConfigError
from openalign.data import transforms
from openalign.model.encode import encode_images, encode_texts
from openalign.model.families import unpack_naflex
from openalign.model.hub import load_pretrained

from tests.model.test_families import CORPUS, SIZES, TEXTS, TOWER, class_folders, cosines

PATCH, BUDGET = 8, 12  # a 12-patch budget: the 90 x 45 image becomes 2 x 5 patches, the 64 x 64 one 3 x 3


def siglip2_tokenizer() -> transformers.Siglip2Tokenizer:
    """Siglip2's tokenizer class (Gemma's: byte-pair merges over "▁"-joined words, padding on the left) around merges
    trained here on the texts and prompts these tests use."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    corpus = CORPUS + [f"This is a photo of {label}." for label in ("blue", "cat", "red")]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁")
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=150, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], show_progress=False))
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    return transformers.Siglip2Tokenizer(vocab=spec["vocab"], merges=merges)


@pytest.fixture(scope="module")
def siglip2(tmp_path_factory):
    root = tmp_path_factory.mktemp("siglip2")
    tokenizer = siglip2_tokenizer()
    assert tokenizer.padding_side == "left"  # as Siglip2's releases pad: the side openalign must follow
    config = transformers.Siglip2Config(
        text_config=TOWER | dict(vocab_size=len(tokenizer), max_position_embeddings=64, pad_token_id=0,
                                 bos_token_id=2, eos_token_id=1),
        vision_config=TOWER | dict(num_patches=16, patch_size=PATCH))
    torch.manual_seed(0)
    model = transformers.Siglip2Model(config).eval()
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    transformers.Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=BUDGET).save_pretrained(root)
    folder = root.parent / "siglip2-images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate(SIZES):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pixels[: h // 2] //= 2
        Image.fromarray(pixels).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(TEXTS[i])
    images = [Image.open(folder / f"{i}.png").convert("RGB") for i in range(len(SIZES))]
    processor = transformers.Siglip2ImageProcessorPil.from_pretrained(root)
    with torch.no_grad():
        inputs = processor(images=images, return_tensors="pt")
        want_images = model.get_image_features(**inputs).pooler_output
        ids = transformers.AutoTokenizer.from_pretrained(root)(TEXTS, padding="max_length", max_length=64,
                                                               return_tensors="pt")
        want_texts = model.get_text_features(**ids).pooler_output
    return root, folder, images, want_images, want_texts, inputs


def test_a_naflex_checkpoint_embeds_as_transformers_does(siglip2, tmp_path):
    root, folder, images, want_images, want_texts, inputs = siglip2
    model, tokenizer, cfg = load_pretrained(root)
    v = cfg.model.vision
    assert (v.resize_mode, v.max_num_patches, v.patch_size, v.resample) == ("naflex", BUDGET, PATCH, "bilinear")
    packed = torch.stack([transforms.vision_transform(v)(image) for image in images])
    patches, mask, shapes = unpack_naflex(packed)
    assert torch.equal(shapes, inputs["spatial_shapes"]) and torch.equal(mask, inputs["pixel_attention_mask"].long())
    assert cosines(encode_images(model, packed), want_images).min() >= 0.9999
    m = openalign.load(root, device="cpu")
    assert cosines(m.encode_images(images), want_images).min() >= 0.9999
    assert cosines(m.encode_texts(TEXTS), want_texts).min() >= 0.9999
    assert m.head == "sigmoid"

    assert cli.main(["embed", str(root), "--images", str(folder), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    import pyarrow.parquet as pq

    stored = torch.from_numpy(np.load(tmp_path / "emb" / "part-000000.npy"))
    paths = pq.read_table(tmp_path / "emb" / "meta-000000.parquet")["path"].to_pylist()
    order = [int(p.rsplit("/", 1)[-1].split(".")[0]) for p in paths]
    assert cosines(stored, want_images[order]).min() >= 0.9999


def test_the_patch_budget_the_filter_and_the_padding_side_are_what_make_the_match(siglip2):
    root, _, images, want_images, want_texts, _ = siglip2
    model, tokenizer, cfg = load_pretrained(root)
    tokenizer.padding_side = "right"  # padded on the other side than the tokenizer's (SigLIP pools the last position)
    assert cosines(encode_texts(model, tokenizer, TEXTS, 4, 64), want_texts).min() < 0.9999
    for what, change in {"another budget": {"max_num_patches": BUDGET + 8}, "bicubic": {"resample": "bicubic"},
                         "the wrong mean": {"pixel_mean": (0.3, 0.3, 0.3)}}.items():
        vision = cfg.model.vision.__class__(**{**cfg.model.vision.__dict__, **change})
        model.cfg = cfg.model.__class__(**{**cfg.model.__dict__, "vision": vision})  # (the mean is the model's)
        got = encode_images(model, torch.stack([transforms.vision_transform(vision)(image) for image in images]))
        assert cosines(got, want_images).min() < 0.9999, what


def test_eval_runs_on_a_naflex_checkpoint_and_finetuning_it_is_refused(siglip2, tmp_path, capsys):
    root, folder, *_ = siglip2
    assert cli.main(["eval", str(root), "--data", str(folder), "--task", "retrieval", "--task", "zeroshot",
                     "--out", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["n_images"] == 4 and metrics["zeroshot_sigmoid_head"] == 1
    from openalign.eval import finetune as finetune_lib
    from openalign.eval.options import EvalOptions

    model, _, cfg = load_pretrained(root)
    data = finetune_lib.load_labeled(str(folder), EvalOptions(), cfg.model.vision.resize_size)
    with pytest.raises(ConfigError, match="a NaFlex Siglip2Model takes each image at its own aspect ratio"):
        finetune_lib.fit(model, data, {"a": 0}, finetune_lib.parse_options(["steps=1"]), seed=0, crop=16)


def test_zero_shot_top1_equals_transformers_zero_shot_pipeline(siglip2, tmp_path):
    """transformers' zero-shot pipeline, given Siglip2's PIL image processor (its default one is torchvision-backed
    and does not import here): openalign's top-1 on a class-folder set is the pipeline's, and `openalign.load`'s
    probabilities are its (a per-pair sigmoid with the model's bias)."""
    root, *_ = siglip2
    labels = ["blue", "cat", "red"]
    data, truth = class_folders(tmp_path, labels)
    assert cli.main(["eval", str(root), "--data", str(data), "--task", "zeroshot", "--templates",
                     str(tmp_path / "one.txt"), "--out", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    classify = transformers.pipeline("zero-shot-image-classification", model=str(root),
                                     image_processor=transformers.Siglip2ImageProcessorPil.from_pretrained(root))
    answers = [classify(Image.open(path), candidate_labels=labels) for path in truth]
    hits = [answer[0]["label"] == label for answer, label in zip(answers, truth.values())]
    assert metrics["zeroshot_top1"] == pytest.approx(sum(hits) / len(hits))
    assert metrics["zeroshot_sigmoid_head"] == 1
    ours = openalign.load(root, device="cpu").classify([Image.open(p) for p in truth], labels,
                                                       templates=["This is a photo of {}."])
    for row, answer in zip(ours, answers):
        theirs = {r["label"]: r["score"] for r in answer}
        assert row.tolist() == pytest.approx([theirs[label] for label in labels], abs=1e-5)
