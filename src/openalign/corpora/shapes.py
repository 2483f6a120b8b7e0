"""Built-in corpus `shapes`: procedural coloured shapes with noisy alt-texts, for compositional zero-shot.

Eight colours x eight shapes; eight colour-shape combinations (one per colour and one per shape, a
diagonal of the grid) never appear in training, so every colour and every shape is trained on, just
never together in those pairs. Each image is one shape at a random size, position and small rotation,
its colour jittered, on a light random background; its two alt-texts come from caption templates, each
replaced at rate `noise` by web-like noise (a file name, boilerplate, only the colour or only the shape, or
another image's caption).

The held-out split has fresh images of every combination: the eight unseen ones (`attributes.seen`
false) and the 56 seen ones, for `--task compositional` (eval/compositional.py).

Scenes of several shapes (`scene=`), for the failure-modes study:
- `relation`: two shapes of seen combinations, differing in colour and in shape, one left of, right of, above or
  below the other; captioned with the relation ("a red circle left of a blue square"). A held-out scene carries
  its caption with the objects swapped (`swapped`: "a blue square left of a red circle"): the same words, the
  roles exchanged.
- `objects`: two or three shapes in the cells of a 2 x 2 grid, the caption naming one of them (as a web caption
  names the main subject); a held-out scene lists all it shows (`objects`).
`per_combo` then counts scenes per seen combination (each scene drawn around one of them).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from PIL import Image, ImageDraw

from openalign.config import ConfigError
from openalign.corpora.emoji import BOILERPLATE
from openalign.data.tars import ShardWriter, encode_image

__all__ = ["COLOURS", "RELATIONS", "SCENES", "SHAPES", "build", "draw", "draw_scene", "heldout_combos"]

COLOURS = {"red": (215, 40, 40), "orange": (245, 140, 20), "yellow": (235, 205, 30), "green": (40, 160, 60),
           "blue": (40, 80, 220), "purple": (140, 60, 180), "pink": (240, 120, 180), "brown": (125, 80, 40)}
SHAPES = ("circle", "square", "triangle", "star", "heart", "hexagon", "diamond", "cross")
TEMPLATES = ("a {c} {s}", "{c} {s}", "{s}, {c}", "a {c} {s} on a light background", "clipart of a {c} {s}",
             "{c} {s} icon", "the {s} is {c}", "simple {c} {s} shape")
CANVAS = 96
NOISE_KINDS = ("filename", "boilerplate", "partial", "wrong")


def heldout_combos(offset: int = 3) -> set[tuple[str, str]]:
    """One unseen shape per colour and one unseen colour per shape: (colour i, shape i + offset)."""
    colours = list(COLOURS)
    return {(colours[i], SHAPES[(i + offset) % len(SHAPES)]) for i in range(len(colours))}


def outline(shape: str, cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    """The shape's polygon (a circle is a 48-gon) of radius `r` around (cx, cy), rotated by `turn` radians."""
    if shape == "circle":
        points = [(r, 2 * math.pi * k / 48) for k in range(48)]
    elif shape == "square":
        points = [(r, math.pi / 4 + k * math.pi / 2) for k in range(4)]
    elif shape == "diamond":  # a rhombus, narrower than tall: not a turned square
        pts = [(0, -r), (0.6 * r, 0), (0, r), (-0.6 * r, 0)]
        return _place(pts, cx, cy, turn)
    elif shape == "triangle":
        points = [(r, -math.pi / 2 + k * 2 * math.pi / 3) for k in range(3)]
    elif shape == "hexagon":
        points = [(r, k * math.pi / 3) for k in range(6)]
    elif shape == "star":
        points = [(r if k % 2 == 0 else 0.42 * r, -math.pi / 2 + k * math.pi / 5) for k in range(10)]
    elif shape == "cross":
        a = r / 3
        pts = [(-a, -r), (a, -r), (a, -a), (r, -a), (r, a), (a, a), (a, r), (-a, r), (-a, a), (-r, a), (-r, -a),
               (-a, -a)]
        return _place(pts, cx, cy, turn)
    elif shape == "heart":
        ts = [2 * math.pi * k / 60 for k in range(60)]
        pts = [(r * 16 * math.sin(t) ** 3 / 17, -r * (13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t)
                                                      - math.cos(4 * t)) / 17) for t in ts]
        return _place(pts, cx, cy, turn)
    else:
        raise ValueError(shape)
    return _place([(rad * math.cos(a), rad * math.sin(a)) for rad, a in points], cx, cy, turn)


def _place(points, cx, cy, turn):
    c, s = math.cos(turn), math.sin(turn)
    return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in points]


def draw(colour: str, shape: str, rng: random.Random) -> Image.Image:
    background = tuple(rng.randint(215, 255) for _ in range(3))
    image = Image.new("RGB", (CANVAS, CANVAS), background)
    r = rng.uniform(0.22, 0.42) * CANVAS
    cx, cy = (rng.uniform(r + 2, CANVAS - r - 2) for _ in range(2))
    fill = tuple(max(0, min(255, v + rng.randint(-18, 18))) for v in COLOURS[colour])
    ImageDraw.Draw(image).polygon(outline(shape, cx, cy, r, math.radians(rng.uniform(-12, 12))), fill=fill)
    return image


def _noisy(kind: str, colour: str, shape: str, others: list[tuple[str, str]], rng: random.Random) -> str:
    if kind == "filename":
        return rng.choice([f"shape_{rng.randint(0, 9999):04d}.png", f"IMG_{rng.randint(1000, 9999)}.JPG",
                           f"{rng.getrandbits(32):08x}.png"])
    if kind == "boilerplate":
        return rng.choice(BOILERPLATE)
    if kind == "partial":
        return rng.choice([colour, shape, f"{shape} shape", f"{colour} thing"])
    c, s = rng.choice(others)  # wrong: another combination's caption
    return rng.choice(TEMPLATES).format(c=c, s=s)


RELATIONS = {"left of": ("left", "right"), "right of": ("right", "left"), "above": ("top", "bottom"),
             "below": ("bottom", "top")}
RELATION_TEMPLATES = ("a {a} {r} a {b}", "{a} {r} {b}", "the {a} is {r} the {b}")
SCENES = ("single", "relation", "objects")


def draw_scene(objects: list[tuple[str, str, tuple[float, float, float, float]]], rng: random.Random) -> Image.Image:
    """Shapes each drawn inside its box (x0, y0, x1, y1) of the canvas, as `draw` draws one on the whole."""
    background = tuple(rng.randint(215, 255) for _ in range(3))
    image = Image.new("RGB", (CANVAS, CANVAS), background)
    pen = ImageDraw.Draw(image)
    for colour, shape, (x0, y0, x1, y1) in objects:
        side = min(x1 - x0, y1 - y0)
        r = rng.uniform(0.25, 0.4) * side
        cx, cy = rng.uniform(x0 + r + 1, x1 - r - 1), rng.uniform(y0 + r + 1, y1 - r - 1)
        fill = tuple(max(0, min(255, v + rng.randint(-18, 18))) for v in COLOURS[colour])
        pen.polygon(outline(shape, cx, cy, r, math.radians(rng.uniform(-12, 12))), fill=fill)
    return image


HALVES = {"left": (0, 0, CANVAS / 2, CANVAS), "right": (CANVAS / 2, 0, CANVAS, CANVAS),
          "top": (0, 0, CANVAS, CANVAS / 2), "bottom": (0, CANVAS / 2, CANVAS, CANVAS)}
CELLS = [(x, y, x + CANVAS / 2, y + CANVAS / 2) for y in (0, CANVAS / 2) for x in (0, CANVAS / 2)]


def relation_scene(first: tuple[str, str], pool: list[tuple[str, str]], rng: random.Random) -> dict:
    """Two shapes in a relation: the image, its caption (clean), the swapped caption, the parts."""
    second = rng.choice([c for c in pool if c[0] != first[0] and c[1] != first[1]])
    relation = rng.choice(list(RELATIONS))
    where_a, where_b = RELATIONS[relation]
    a, b = f"{first[0]} {first[1]}", f"{second[0]} {second[1]}"
    image = draw_scene([(*first, HALVES[where_a]), (*second, HALVES[where_b])], rng)
    return {"image": image, "a": a, "b": b, "relation": relation,
            "caption": f"a {a} {relation} a {b}", "swapped": f"a {b} {relation} a {a}"}


def objects_scene(first: tuple[str, str], pool: list[tuple[str, str]], rng: random.Random) -> dict:
    """Two or three shapes in cells of a 2 x 2 grid (distinct combinations); the caption names `first`."""
    others = rng.sample([c for c in pool if c != first], rng.choice((1, 2)))
    shown = [first, *others]
    cells = rng.sample(CELLS, len(shown))
    image = draw_scene([(c, s, cell) for (c, s), cell in zip(shown, cells)], rng)
    return {"image": image, "objects": [f"{c} {s}" for c, s in shown]}


def build(out: Path, per_combo: int = 60, eval_seen: int = 6, eval_unseen: int = 24, noise: float = 0.2,
          offset: int = 3, seed: int = 0, samples_per_shard: int = 500, scene: str = "single") -> dict:
    """Draw the corpus into `out/train` and `out/eval` shards; returns the summary (also in the manifests).

    `per_combo` training images of each of the 56 seen combinations; the held-out split has `eval_seen`
    fresh images of each seen combination and `eval_unseen` of each of the 8 never trained on. `scene`: single,
    or scenes of several shapes (relation, objects: see the module docstring)."""
    if not 0.0 <= noise <= 1.0:
        raise ConfigError(f"noise must be in [0, 1], not {noise}")
    if min(per_combo, eval_seen, eval_unseen) < 1:
        raise ConfigError("per_combo, eval_seen and eval_unseen must each be at least 1")
    if scene not in SCENES:
        raise ConfigError(f"scene must be one of {', '.join(SCENES)}, not {scene!r}")
    if scene != "single":
        return _build_scenes(Path(out), scene, per_combo, eval_seen, noise, offset, seed, samples_per_shard)
    unseen = heldout_combos(offset)
    combos = [(c, s) for c in COLOURS for s in SHAPES]
    seen = [combo for combo in combos if combo not in unseen]
    rng = random.Random(seed)
    info = {"corpus": "shapes", "noise": noise, "seed": seed, "unseen_combos": sorted(f"{c} {s}" for c, s in unseen)}
    counts = dict.fromkeys(NOISE_KINDS, 0)
    writer = ShardWriter(Path(out) / "train", "shapes-train", samples_per_shard, info | {"split": "train"})
    plan = [combo for combo in seen for _ in range(per_combo)]
    for i, (colour, shape) in enumerate(rng.sample(plan, len(plan))):
        texts, kinds = [], []
        for template in rng.sample(TEMPLATES, 2):
            kind = rng.choice(NOISE_KINDS) if rng.random() < noise else "clean"
            if kind != "clean":
                counts[kind] += 1
            texts.append(template.format(c=colour, s=shape) if kind == "clean" else
                         _noisy(kind, colour, shape, seen, rng))
            kinds.append(kind)
        writer.write(f"train{i:06d}", encode_image(draw(colour, shape, rng)), "jpg", texts[0],
                     {"texts": texts, "noise": kinds, "name": f"{colour} {shape}"})
    train = writer.close()
    writer = ShardWriter(Path(out) / "eval", "shapes-eval", samples_per_shard, info | {"split": "eval"})
    i = 0
    for colour, shape in combos:
        is_seen = (colour, shape) not in unseen
        for _ in range(eval_seen if is_seen else eval_unseen):
            texts = [f"a {colour} {shape}", f"{shape}, {colour}"]
            writer.write(f"eval{i:06d}", encode_image(draw(colour, shape, rng)), "jpg", texts[0],
                         {"texts": texts, "name": f"{colour} {shape}",
                          "attributes": {"colour": colour, "shape": shape, "seen": is_seen}})
            i += 1
    held = writer.close()
    return {"out": str(out), "train_images": train["n_samples"], "eval_images": held["n_samples"],
            "seen_combos": len(seen), "unseen_combos": sorted(f"{c} {s}" for c, s in unseen), "noise_texts": counts}


def _build_scenes(out: Path, scene: str, per_combo: int, eval_seen: int, noise: float, offset: int, seed: int,
                  samples_per_shard: int) -> dict:
    """Scenes of several shapes from the seen combinations (the unseen ones stay out of both splits)."""
    unseen = heldout_combos(offset)
    seen = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in unseen]
    rng = random.Random(seed)
    info = {"corpus": "shapes", "scene": scene, "noise": noise, "seed": seed}
    counts = dict.fromkeys(NOISE_KINDS, 0)
    make = relation_scene if scene == "relation" else objects_scene
    writer = ShardWriter(out / "train", f"shapes-{scene}-train", samples_per_shard, info | {"split": "train"})
    plan = [combo for combo in seen for _ in range(per_combo)]
    for i, first in enumerate(rng.sample(plan, len(plan))):
        drawn = make(first, seen, rng)
        texts, kinds = [], []
        for template in rng.sample(RELATION_TEMPLATES if scene == "relation" else TEMPLATES, 2):
            kind = rng.choice(NOISE_KINDS) if rng.random() < noise else "clean"
            if kind != "clean":
                counts[kind] += 1
            clean = template.format(a=drawn["a"], r=drawn["relation"], b=drawn["b"]) if scene == "relation" else \
                template.format(c=first[0], s=first[1])
            texts.append(clean if kind == "clean" else _noisy(kind, first[0], first[1], seen, rng))
            kinds.append(kind)
        writer.write(f"train{i:06d}", encode_image(drawn["image"]), "jpg", texts[0], {"texts": texts, "noise": kinds})
    train = writer.close()
    writer = ShardWriter(out / "eval", f"shapes-{scene}-eval", samples_per_shard, info | {"split": "eval"})
    i = 0
    for first in seen:
        for _ in range(eval_seen):
            drawn = make(first, seen, rng)
            if scene == "relation":
                meta = {"texts": [drawn["caption"]], "swapped": drawn["swapped"], "relation": drawn["relation"],
                        "objects": [drawn["a"], drawn["b"]]}
            else:
                meta = {"texts": [f"a {drawn['objects'][0]}"], "objects": drawn["objects"]}
            writer.write(f"eval{i:06d}", encode_image(drawn["image"]), "jpg", meta["texts"][0], meta)
            i += 1
    held = writer.close()
    return {"out": str(out), "scene": scene, "train_images": train["n_samples"], "eval_images": held["n_samples"],
            "noise_texts": counts}
