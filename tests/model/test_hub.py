import subprocess
import sys

import torch
import transformers

from openalign import presets
from openalign.model.dual_encoder import DualEncoder, Encoding
from openalign.model.hub import init_towers, load_pretrained, save_pretrained
from openalign.tokenizer import train_tokenizer

PROBE = """
import sys, torch
from openalign.model.hub import load_pretrained
model, tok, cfg = load_pretrained(sys.argv[1])
x = torch.load(sys.argv[2])
with torch.no_grad():
    img = model.encode_image(x["pixels"]).embeds
    t = tok(["a red circle", "blue"], padding=True, return_tensors="pt")
    txt = model.encode_text(t["input_ids"], t["attention_mask"]).embeds
torch.save({"img": img, "txt": txt}, sys.argv[3])
"""


def trained_like_model():
    cfg = presets.get("tiny")
    model = DualEncoder(cfg.model).eval()
    with torch.no_grad():  # move BatchNorm statistics and the temperature away from their init
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
        model.set_temperature(0.05)
    return cfg, model


def test_encode_returns_one_dataclass_type():
    cfg, model = trained_like_model()
    img = model.encode_image(torch.randn(2, 3, 32, 32))
    txt = model.encode_text(torch.tensor([[2, 7, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert type(img) is Encoding and type(txt) is Encoding
    assert img.embeds.shape == (2, 80) and txt.embeds.shape == (1, 80)
    torch.testing.assert_close(img.embeds.norm(dim=-1), torch.ones(2))


def test_save_then_load_in_a_new_process_gives_identical_embeddings(tmp_path):
    cfg, model = trained_like_model()
    tok = train_tokenizer(["a red circle", "a blue square"] * 5, vocab_size=40)
    save_pretrained(model, tok, tmp_path / "model", cfg)
    pixels = torch.randn(3, 3, 32, 32)
    torch.save({"pixels": pixels}, tmp_path / "x.pt")
    subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "model"), str(tmp_path / "x.pt"),
                    str(tmp_path / "y.pt")], check=True)
    got = torch.load(tmp_path / "y.pt")
    with torch.no_grad():
        t = tok(["a red circle", "blue"], padding=True, return_tensors="pt")
        assert torch.equal(got["img"], model.encode_image(pixels).embeds)
        assert torch.equal(got["txt"], model.encode_text(t["input_ids"], t["attention_mask"]).embeds)
    loaded, _, loaded_cfg = load_pretrained(tmp_path / "model")
    assert loaded_cfg == cfg and loaded.temperature.item() == model.temperature.item()


def test_directory_is_a_plain_transformers_align_model(tmp_path):
    cfg, model = trained_like_model()
    save_pretrained(model, None, tmp_path, cfg)
    hf = transformers.AlignModel.from_pretrained(tmp_path).eval()
    pixels = torch.randn(2, 3, 32, 32)
    ids = torch.tensor([[2, 9, 11, 3], [2, 5, 3, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, pixel_values=pixels)
        torch.testing.assert_close(out.image_embeds, model.encode_image(pixels).embeds)
        torch.testing.assert_close(out.text_embeds, model.encode_text(ids, mask).embeds)


def test_init_towers_from_a_saved_directory(tmp_path):
    cfg, model = trained_like_model()
    save_pretrained(model, None, tmp_path, cfg)
    fresh = DualEncoder(cfg.model)
    init_towers(fresh, tmp_path)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


ALIGN_BASE_PROCESSOR = {  # the public kakaobrain/align-base checkpoint's image processor (convert_align_tf_to_hf.py)
    "image_processor_type": "EfficientNetImageProcessor", "do_resize": True, "size": {"height": 346, "width": 346},
    "resample": 2, "do_center_crop": True, "crop_size": {"height": 289, "width": 289}, "do_rescale": True,
    "rescale_factor": 1 / 127.5, "rescale_offset": True, "do_normalize": False, "include_top": False,
    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
IMAGENET_PROCESSOR = ALIGN_BASE_PROCESSOR | {"size": {"height": 72, "width": 72}, "crop_size": {"height": 64, "width": 64},
                                             "rescale_factor": 1 / 255, "rescale_offset": False, "do_normalize": True}


def test_a_foreign_checkpoint_is_preprocessed_as_its_processor_says(tmp_path):
    # Before: resize = crop = the vision config's image size, whatever preprocessor_config.json said.
    import json

    import numpy as np
    from PIL import Image

    from openalign.data import transforms
    from openalign.model.hub import load_config

    processor_class = getattr(transformers, "EfficientNetImageProcessorPil", transformers.EfficientNetImageProcessor)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8))  # not square
    cfg, model = trained_like_model()
    for settings in (ALIGN_BASE_PROCESSOR, IMAGENET_PROCESSOR):
        model.align.save_pretrained(tmp_path)  # a foreign directory: no openalign.json
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
        v = load_config(tmp_path).model.vision
        assert (v.resize_size, v.image_size) == (settings["size"]["height"], settings["crop_size"]["height"])
        theirs = processor_class(**{k: w for k, w in settings.items() if k != "image_processor_type"})(
            images=image, return_tensors="pt")["pixel_values"][0]
        loaded, _, _ = load_pretrained(tmp_path)
        ours = loaded.tower_pixels(transforms.eval_transform(image, v.resize_size, v.image_size)[None])[0]
        torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)


def test_saved_models_carry_a_processor_transformers_reads(tmp_path):
    import numpy as np
    from PIL import Image

    from openalign.data import transforms

    cfg, model = trained_like_model()
    save_pretrained(model, None, tmp_path, cfg)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    v = cfg.model.vision
    torch.testing.assert_close(processor(images=image, return_tensors="pt")["pixel_values"][0],
                               transforms.eval_transform(image, v.resize_size, v.image_size), atol=2e-5, rtol=0)


def test_a_processor_saved_by_transformers_5_is_read_from_processor_config_json(tmp_path):
    # Before: only preprocessor_config.json was read; transformers 5.24's AlignProcessor.save_pretrained keeps the
    # settings in processor_config.json, so openalign preprocessed at 64/64 where the processor says 72/64 and
    # cosine against transformers fell to 0.935-0.982 without a word.
    import numpy as np
    from PIL import Image

    from openalign.data import transforms
    from openalign.model.hub import load_config

    cfg, model = trained_like_model()
    model.align.save_pretrained(tmp_path)  # a foreign directory: no openalign.json
    tokenizer = train_tokenizer(["a red circle", "a blue square"] * 4, 60, 16)
    image_processor = transformers.EfficientNetImageProcessorPil(
        size={"height": 72, "width": 72}, crop_size={"height": 64, "width": 64}, do_center_crop=True, resample=2,
        do_normalize=False, include_top=False)
    transformers.AlignProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(tmp_path)
    assert (tmp_path / "processor_config.json").is_file() and not (tmp_path / "preprocessor_config.json").exists()
    v = load_config(tmp_path).model.vision
    assert (v.resize_size, v.image_size) == (72, 64)
    image = Image.fromarray(np.random.default_rng(2).integers(0, 255, (90, 120, 3), dtype=np.uint8))
    loaded, _, _ = load_pretrained(tmp_path)
    ours = loaded.tower_pixels(transforms.eval_transform(image, v.resize_size, v.image_size)[None])[0]
    theirs = transformers.AlignProcessor.from_pretrained(tmp_path)(images=image, return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=0)
    # two processor files that disagree: one sentence, never a guess
    (tmp_path / "preprocessor_config.json").write_text('{"size": {"height": 64, "width": 64}, "do_center_crop": false}')
    import pytest

    from openalign.config import ConfigError

    with pytest.raises(ConfigError, match="two image processor files that disagree on size"):
        load_config(tmp_path)


def test_a_save_that_fails_leaves_the_previous_model_directory(tmp_path, monkeypatch):
    # Before: the files were written in place, so a save cut short (a full disk, Ctrl-C) left half a model
    # directory that `embed` and `eval` loaded.
    import pytest

    from openalign.model import hub

    cfg, model = trained_like_model()
    out = save_pretrained(model, None, tmp_path / "model", cfg)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def cut_short(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hub.config_lib, "save", cut_short)  # openalign.json, after the weights
    with torch.no_grad():
        model.set_temperature(0.5)
    with pytest.raises(OSError):
        save_pretrained(model, None, out, cfg)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary directory left


def test_transformers_zero_shot_pipeline_on_a_saved_model_gives_openalign_eval_scores(tmp_path):
    """A model openalign saved (an AlignModel directory) runs in transformers' zero-shot pipeline as it is, and the
    pipeline's scores are openalign's: `eval --task zeroshot` with the pipeline's one template has its top-1, and
    openalign.load's classifier its probabilities."""
    import json

    import pytest

    import openalign
    from openalign.cli import main
    from conftest import COLORS, SHAPES, save_tiny_model, shape_image

    model_dir = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    data = tmp_path / "classes"
    images = {}
    for color in COLORS:
        (data / color).mkdir(parents=True)
        for shape in SHAPES:
            shape_image(color, shape, 44).save(data / color / f"{shape}.png")
            images[data / color / f"{shape}.png"] = color
    (tmp_path / "one.txt").write_text("This is a photo of {}.\n")  # the pipeline's hypothesis_template
    assert main(["eval", str(model_dir), "--data", str(data), "--task", "zeroshot", "--templates",
                 str(tmp_path / "one.txt"), "--out", str(tmp_path / "m.json")]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    classify = transformers.pipeline("zero-shot-image-classification", model=str(model_dir))
    labels = sorted(COLORS)
    theirs = [{r["label"]: r["score"] for r in classify(str(path), candidate_labels=labels)} for path in images]
    hits = [max(scores, key=scores.get) == truth for scores, truth in zip(theirs, images.values())]
    assert metrics["zeroshot_top1"] == pytest.approx(sum(hits) / len(hits))
    ours = openalign.load(model_dir, device="cpu").classify(list(images), labels, templates=["This is a photo of {}."])
    for row, scores in zip(ours, theirs):
        assert row.tolist() == pytest.approx([scores[label] for label in labels], abs=1e-5)


LOAD_BOTH = """
import sys, torch
from transformers import AlignModel
import openalign
ours = openalign.load(sys.argv[1], device="cpu")
print("@@PLAIN@@", file=sys.stderr, flush=True)
plain = AlignModel.from_pretrained(sys.argv[1])
ids = torch.tensor([[2, 5, 6, 3]])
with torch.no_grad():
    a = plain.get_text_features(input_ids=ids, attention_mask=torch.ones_like(ids))
    a = getattr(a, "pooler_output", a)
    b = ours.model.encode_text(ids, torch.ones_like(ids)).embeds
print(float((torch.nn.functional.normalize(a, dim=-1) - b).abs().max()))
"""


def test_a_saved_model_loads_with_no_report_of_missing_weights_in_transformers_and_openalign(tmp_path):
    """Before: every load printed transformers' report, "text_model.pooler.dense.weight | MISSING ... newly
    initialized ... Consider training on your downstream task". A subprocess: the command line quiets
    transformers at import, so the test runs as a library user would, with transformers' own verbosity."""
    import os

    from safetensors.torch import load_file, save_file

    from conftest import save_tiny_model

    saved = save_tiny_model(tmp_path / "m", ["a red circle", "a blue square"])
    older = tmp_path / "older"  # saved before the pooler was kept: the keys are not in the file
    import shutil

    shutil.copytree(saved, older)
    weights = load_file(older / "model.safetensors")
    assert "text_model.pooler.dense.weight" in weights and not weights["text_model.pooler.dense.weight"].any()
    save_file({k: v for k, v in weights.items() if ".pooler." not in k}, older / "model.safetensors",
              metadata={"format": "pt"})
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"} | {"PYTHONPATH": "src"}
    for model in (saved, older):
        done = subprocess.run([sys.executable, "-c", LOAD_BOTH, str(model)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        ours, plain = done.stderr.split("@@PLAIN@@")
        assert "MISSING" not in ours and "newly initialized" not in ours, ours[-2000:]  # openalign.load: both
        if model == saved:  # plain transformers on a model saved now
            assert "MISSING" not in plain and "newly initialized" not in plain, plain[-2000:]
        else:  # an older directory lacks the keys: transformers reports them, as this test would catch
            assert "MISSING" in plain
        assert float(done.stdout.split()[-1]) < 1e-5  # transformers' text embedding is openalign's
