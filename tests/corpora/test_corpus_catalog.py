"""The built-in corpora made from packaged collections (corpora/catalog.py): tuxpaint, icons and symbols, on small
trees shaped as their Debian packages install them, and symbols, letters and symbola on the real fonts."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from openalign.cli.main import main
from openalign.corpora import catalog, icons, letters, symbola, symbols, tuxpaint
from openalign.data.tars import MANIFEST, list_shards, read_samples, sample_meta, sample_texts


def _png(path: Path, size=(120, 100), seed=0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)


def _samples(root: Path) -> list[dict]:
    out = []
    for split in ("train", "eval"):
        if not (root / split).is_dir():
            continue
        for s in read_samples(list_shards(str(root / split))):
            out.append({"split": split, "texts": sample_texts(s), "name": sample_meta(s).get("name", "")})
    return out


def test_tuxpaint_descriptions_languages_categories_and_licence(tmp_path, capsys):
    root = tmp_path / "stamps"
    for i, (where, english, german) in enumerate([("animals/birds/duck", "A duck.", "Eine Ente."),
                                                   ("animals/cats/cat", "A cat.", "Eine Katze."),
                                                   ("food/fruit/apple", "A red apple.", "Ein roter Apfel."),
                                                   ("naturalforces/storm", "A storm.", "Ein Sturm.")]):
        _png(root / f"{where}.png", seed=i)
        (root / f"{where}.txt").write_text(f"{english}\nde.utf8={german}\nen_GB.utf8={english} (GB)\n"
                                           "zh_CN.utf8=鸭子。\nbroken line\n", encoding="utf-8")
    (root / "vehicles").mkdir()
    (root / "vehicles" / "car.txt").write_text("A car.\n")
    (root / "vehicles" / "car.svg").write_text("<svg/>")
    assert tuxpaint.descriptions(root / "animals/birds/duck.txt") == {"en": "A duck.", "de": "Eine Ente.",
                                                                      "zh": "鸭子。"}
    assert main(["corpus", "tuxpaint", "--out", str(tmp_path / "tp"), "--root", str(root), "--languages", "en,de",
                 "--heldout", "0.5", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["skipped_stamps"]["svg_only"] == 1 and summary["images"] == 4 and summary["pairs"] == 8
    assert summary["categories"] == {"animals": 2, "food": 1, "natural forces": 1}
    samples = _samples(tmp_path / "tp")
    assert {s["split"] for s in samples} == {"train", "eval"}
    by_text = {s["texts"][0] if s["texts"][0].startswith("A") else s["texts"][1]: s for s in samples}
    assert sorted(by_text["A duck."]["texts"]) == ["A duck.", "Eine Ente."] and by_text["A duck."]["name"] == "animals"
    manifest = json.loads((tmp_path / "tp" / "eval" / MANIFEST).read_text())
    assert manifest["package"] == "tuxpaint-stamps-default" and manifest["licence"].startswith("GPL-2")
    assert main(["corpus", "tuxpaint", "--out", str(tmp_path / "x"), "--root", str(tmp_path / "none")]) == 2
    assert "apt-get install tuxpaint-stamps-default" in capsys.readouterr().err


def test_icons_take_each_name_at_its_largest_size_and_its_context_as_label(tmp_path, capsys):
    root = tmp_path / "theme"
    _png(root / "128x128/devices/audio-headphones.png", (128, 128), 1)
    _png(root / "48x48/devices/audio-headphones.png", (48, 48), 2)  # a smaller copy: not taken
    _png(root / "16x16/actions/edit-copy.png", (16, 16), 3)  # below min_size only
    _png(root / "64x64/actions/edit-cut.png", (64, 64), 4)
    _png(root / "64x64/mimetypes/application-pdf.png", (64, 64), 5)  # file types: left out by default
    (root / "64x64/actions/edit-snip.png").write_bytes((root / "64x64/actions/edit-cut.png").read_bytes())
    found = icons.entries(root, ("actions", "devices"), 48)
    assert [(Path(e.image).parent.parent.name, e.texts, e.category) for e in found] == [
        ("64x64", ("edit cut",), "action"), ("64x64", ("edit snip",), "action"),
        ("128x128", ("audio headphones",), "device")]
    assert icons.icon_text("application-rss+xml") == "application rss xml"
    assert main(["corpus", "icons", "--out", str(tmp_path / "ic"), "--root", str(root), "--heldout", "0",
                 "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 2 and summary["train_images"] == 2  # the same image under two names is one image
    texts = sorted(sorted(s["texts"]) for s in _samples(tmp_path / "ic"))
    assert texts == [["audio headphones"], ["edit cut", "edit snip"]]
    assert main(["corpus", "icons", "--out", str(tmp_path / "x"), "--root", str(root), "--contexts", "gadgets"]) == 2
    assert "unknown context 'gadgets'" in capsys.readouterr().err


@pytest.mark.skipif(not Path(symbols.NOTO + "NotoMusic-Regular.ttf").is_file(), reason="make setup installs the fonts")
def test_symbols_from_the_real_noto_fonts_with_unicode_and_cldr_names(tmp_path, capsys):
    fonts = [symbols.NOTO + "NotoMusic-Regular.ttf", symbols.NOTO + "NotoSansSymbols2-Regular.ttf"]
    names = symbols.read_names(Path(symbols.DEFAULT_UNICODE))
    assert names[0x1D11E] == ("MUSICAL SYMBOL G CLEF", "So")
    assert main(["corpus", "symbols", "--out", str(tmp_path / "sy"), "--fonts", ",".join(fonts), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] > 1000 and summary["eval_images"] > 50 and "Musical Symbols" in summary["categories"]
    samples = {tuple(sorted(s["texts"])): s["name"] for s in _samples(tmp_path / "sy")}
    assert samples[("musical symbol g clef",)] == "Musical Symbols"
    assert any("white chess knight" in t for t in samples)  # U+2658, with CLDR's "white chess knight" too
    emoji = symbols.cmap(symbols.DEFAULT_EMOJI_FONT) if Path(symbols.DEFAULT_EMOJI_FONT).is_file() else set()
    rendered = {p.name for p in (tmp_path / "sy" / "images").iterdir()}
    assert not {f"U+{cp:04X}.png" for cp in emoji} & rendered
    glyph = Image.open(tmp_path / "sy" / "images" / "U+1D11E.png")
    assert glyph.size == (symbols.SIZE, symbols.SIZE) and glyph.getextrema() == (0, 255)


@pytest.mark.skipif(not all(Path(f).is_file() for f in letters.DEFAULT_FONTS[:4]),
                    reason="make setup installs the fonts")
def test_letters_in_every_face_with_each_character_held_out_in_all_its_faces(tmp_path, capsys):
    faces = letters.DEFAULT_FONTS[:2] + letters.DEFAULT_FONTS[3:4]  # Sans regular and bold, Serif bold
    assert main(["corpus", "letters", "--out", str(tmp_path / "le"), "--fonts", ",".join(faces),
                 "--blocks", "Basic Latin", "--heldout", "0.5", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 3 * 62 and summary["faces"] == 3  # A-Z, a-z and 0-9 in each face
    assert summary["categories"] == {"latin capital letter": 78, "latin small letter": 78, "digit": 30}
    sides: dict[str, set[str]] = {}
    for sample in _samples(tmp_path / "le"):
        (text,) = sample["texts"]
        sides.setdefault(text, set()).add(sample["split"])
        assert sample["name"] == letters.kind(text.upper())
    assert len(sides) == 62 and all(len(s) == 1 for s in sides.values())  # a character's faces on one side
    assert 10 < sum(s == {"eval"} for s in sides.values()) < 52
    assert sides.keys() >= {"latin small letter k", "latin capital letter y", "digit nine"}
    assert letters.kind("GREEK SMALL LETTER FINAL SIGMA") == "greek small letter"
    assert main(["corpus", "letters", "--out", str(tmp_path / "x"), "--blocks", "Basic Latn"]) == 2
    assert "unknown Unicode block 'Basic Latn'" in capsys.readouterr().err


@pytest.mark.skipif(not (Path(symbola.DEFAULT_FONT).is_file() and Path(symbols.DEFAULT_EMOJI_FONT).is_file()),
                    reason="make setup installs the fonts")
def test_symbola_draws_the_emoji_as_line_art_under_their_cldr_names(tmp_path, capsys):
    assert symbola.emoji_groups(Path(symbols.DEFAULT_UNICODE))[0x1F98D] == "Animals & Nature"
    assert main(["corpus", "symbola", "--out", str(tmp_path / "sa"), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] > 1000 and summary["eval_images"] > 50
    assert {"Animals & Nature", "Food & Drink", "Objects"} <= set(summary["categories"])
    samples = {tuple(sorted(s["texts"])): s["name"] for s in _samples(tmp_path / "sa")}
    assert samples[("gorilla",)] == "Animals & Nature"  # CLDR's name and Unicode's are the same: one text
    assert samples[("automobile",)] == "Travel & Places"
    other = symbols.NOTO + "NotoSansSymbols2-Regular.ttf"  # as if it were the emoji corpus's font: a few emoji
    assert main(["corpus", "symbola", "--out", str(tmp_path / "few"), "--emoji-font", other, "--quiet"]) == 0
    rendered = {int(p.stem[2:], 16) for p in (tmp_path / "few" / "images").iterdir()}
    assert 0 < len(rendered) < 300 and rendered <= symbols.cmap(other)  # only what the emoji corpus draws too
    capsys.readouterr()
    glyph = Image.open(tmp_path / "sa" / "images" / "U+1F98D.png")
    assert glyph.size == (symbols.SIZE, symbols.SIZE) and glyph.getextrema() == (0, 255)  # ink on white
    assert main(["corpus", "symbola", "--out", str(tmp_path / "x"), "--font", str(tmp_path / "none.ttf")]) == 2
    assert "apt-get install fonts-symbola" in capsys.readouterr().err


def test_the_heldout_split_is_a_stable_share(tmp_path):
    keys = [f"key{i}" for i in range(4000)]
    split = catalog.heldout_split(keys, 0.2, 0)
    assert split == catalog.heldout_split(keys, 0.2, 0) and 0.18 < sum(split) / len(keys) < 0.22
    assert split != catalog.heldout_split(keys, 0.2, 1)
    with pytest.raises(Exception, match=r"\[0, 1\)"):
        catalog.heldout_split(keys, 1.0, 0)


def test_a_build_older_than_its_builder_is_built_again(tmp_path):
    from openalign.config import DataConfig
    from openalign.corpora import resolve_data

    root = tmp_path / "stamps" / "animals"
    for i in range(6):
        _png(root / f"beast{i}.png", seed=i)
        (root / f"beast{i}.txt").write_text(f"A beast number {i}.\n")
    data = DataConfig(corpus="tuxpaint", corpus_options=(f"root={tmp_path / 'stamps'}", "heldout=0.5"),
                      data_dir=str(tmp_path / "data"))
    resolve_data(data, progress=False)
    manifest = next((tmp_path / "data").iterdir()) / "train" / MANIFEST
    assert json.loads(manifest.read_text())["version"] == catalog.VERSION
    stale = json.loads(manifest.read_text())
    del stale["version"]  # as openclipart's builds before the labels were written
    manifest.write_text(json.dumps(stale))
    resolve_data(data, progress=False)
    assert json.loads(manifest.read_text())["version"] == catalog.VERSION


FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gcompris" / "tiny.rcc"  # made by Qt's rcc


def test_gcompris_reads_qt_resource_files_as_qts_rcc_writes_them(tmp_path, capsys):
    from openalign.corpora import gcompris

    files = gcompris.read_rcc(FIXTURE)
    assert sorted(files) == ["gcompris/src/activities/erase/resource/red_panda.webp",
                             "gcompris/src/activities/lang/resource/words_sample.json",  # stored compressed
                             "gcompris/src/activities/lang/resource/words_sample/gorilla.webp"]
    lesson = json.loads(files["gcompris/src/activities/lang/resource/words_sample.json"])
    assert lesson[0]["content"][0]["content"][0] == {"description": "gorilla", "image": "gorilla.webp"}
    assert Image.open(__import__("io").BytesIO(files["gcompris/src/activities/erase/resource/red_panda.webp"])).size \
        == (48, 40)
    assert gcompris.file_words("measuringTape3") == "measuring tape"
    assert gcompris.file_words("northern_harrier") == "northern harrier"
    assert gcompris._safe("../../etc") == "_.._etc" and gcompris._safe("..") == "_"  # a name stays under DIR

    root = tmp_path / "rcc"
    root.mkdir()
    (root / "erase.rcc").write_bytes(FIXTURE.read_bytes())
    assert main(["corpus", "gcompris", "--out", str(tmp_path / "gc"), "--root", str(root), "--activities", "erase",
                 "--heldout", "0", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 2
    samples = {s["texts"][0]: s["name"] for s in _samples(tmp_path / "gc")}
    assert samples == {"red panda": "animals", "gorilla": "animal"}  # the file's words; the lesson's own word

    (root / "lang.rcc").write_bytes(FIXTURE.read_bytes()[:-200])  # cut short
    assert main(["corpus", "gcompris", "--out", str(tmp_path / "x"), "--root", str(root), "--activities", "lang"]) == 2
    assert "is not a readable Qt resource file" in capsys.readouterr().err
    assert main(["corpus", "gcompris", "--out", str(tmp_path / "y"), "--root", str(root), "--activities", "paint"]) == 2
    assert "apt-get install gcompris-qt-data" in capsys.readouterr().err
