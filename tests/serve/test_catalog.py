"""Several indexes in one service: names from folders, NAME=DIR and an indices_paths.json; an image and a text index
under one name; each index reloaded at a request boundary when it changes."""

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from conftest import shape_index
from openalign import cli
from openalign.config import ConfigError


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalog")
    image_index = shape_index(root)
    assert cli.main(["embed", str(root / "model"), "--images", str(root / "images"), "--out", str(root / "emb-t"),
                     "--texts", "--quiet"]) == 0
    assert cli.main(["index", str(root / "emb-t"), "--out", str(root / "captions"), "--vectors", "text"]) == 0
    return root, image_index, root / "captions"


def test_names_from_folders_pairs_and_a_json_file(built, tmp_path):
    from openalign.serve.catalog import parse_specs

    root, images, texts = built
    assert [(s.name, sorted(s.paths)) for s in parse_specs([str(images), f"caps={texts}"])] == \
        [("idx", ["image"]), ("caps", ["text"])]
    both = parse_specs([f"shapes={images}", f"shapes={texts}"])
    assert len(both) == 1 and both[0].paths == {"image": images, "text": texts}
    listing = root / "indices_paths.json"  # paths relative to the file, as clip-retrieval's
    listing.write_text(json.dumps({"plain": "idx", "full": {"image": "idx", "text": "captions", "min_score": 0.1}}))
    specs = parse_specs([str(listing)])
    assert [(s.name, s.paths, s.min_score) for s in specs] == [("plain", {"image": root / "idx"}, None),
                                                                ("full", {"image": root / "idx", "text": root /
                                                                          "captions"}, 0.1)]


@pytest.mark.parametrize("items,message", [
    (["a={images}", "a={images}"], "two indexes named a both hold image vectors"),
    (["bad name!={images}"], "must be letters, digits"),
    (["{root}/nowhere"], "not an `openalign index` output"),
    (["{json}"], "must map index names"),
])
def test_bad_specs_are_one_sentence(built, tmp_path, items, message):
    from openalign.serve.catalog import parse_specs

    root, images, _ = built
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError, match=message):
        parse_specs([i.format(images=images, root=root, json=tmp_path / "bad.json") for i in items])


def test_the_page_and_api_choose_the_index_and_modality(built):
    from openalign.serve.app import create_app

    root, images, texts = built
    client = TestClient(create_app([f"shapes={images}", f"shapes={texts}", f"again={images}"]))
    health = client.get("/health").json()
    assert health["indices"] == {"shapes": {"image": {"count": 12, "kind": "flat", "dim": 80},
                                            "text": {"count": 12, "kind": "flat", "dim": 80}},
                                 "again": {"image": {"count": 12, "kind": "flat", "dim": 80}}}
    text = client.post("/search", json={"text": "a green square", "k": 3, "modality": "text"}).json()
    assert text["modality"] == "text" and text["results"][0]["caption"] == "a green square"
    assert text["results"][0]["thumbnail"] == f"/image/{text['results'][0]['id']}?modality=text"
    other = client.post("/search", json={"text": "a green square", "k": 3, "index": "again"}).json()
    assert other["index"] == "again" and other["results"][0]["thumbnail"].endswith("?index=again")
    assert client.get(other["results"][0]["thumbnail"]).content[:2] == b"\xff\xd8"
    missing = client.post("/search", json={"text": "x", "index": "nope"})
    assert missing.status_code == 404 and "this service has shapes, again" in missing.json()["detail"]
    assert client.post("/search", json={"text": "x", "index": "again", "modality": "text"}).status_code == 400


def test_a_running_service_picks_up_a_rebuilt_index_at_the_next_request(built, tmp_path):
    from openalign.serve.app import create_app

    root, _, _ = built
    images = shutil.copytree(root / "images", tmp_path / "images")
    for extra in sorted(images.glob("red_*.png")):
        shutil.copy(extra, images / f"{extra.stem}_again.png")
    assert cli.main(["embed", str(root / "model"), "--images", str(root / "images"), "--out", str(tmp_path / "e1"),
                     "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "e1"), "--out", str(tmp_path / "idx")]) == 0
    client = TestClient(create_app(tmp_path / "idx"))
    assert client.post("/search", json={"text": "red", "k": 24}).json()["count"] == 12
    (tmp_path / "idx" / "index.json").rename(tmp_path / "index.json.moved")  # a rebuild between its two files
    assert client.post("/search", json={"text": "red", "k": 24}).json()["count"] == 12  # the old one serves
    (tmp_path / "index.json.moved").rename(tmp_path / "idx" / "index.json")
    assert cli.main(["embed", str(root / "model"), "--images", str(images), "--out", str(tmp_path / "e2"),
                     "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "e2"), "--out", str(tmp_path / "idx")]) == 0
    grown = client.post("/search", json={"text": "red", "k": 24}).json()
    assert grown["count"] == 15 and len(grown["results"]) == 15  # no restart


@pytest.mark.parametrize("images_from", ["another embed output", "the same embed output"])
@pytest.mark.parametrize("deleted_in", ["image", "text"])
def test_a_take_down_applies_to_every_modality_of_a_name(built, tmp_path, images_from, deleted_in):
    """Before: the same name's text index kept serving an image deleted from its image index (/search
    modality=text found it, /image/ID?modality=text gave 200 while the image index gave 404)."""
    from openalign.index import opened
    from openalign.serve.app import create_app

    root, images, texts = built
    texts = shutil.copytree(texts, tmp_path / "captions")
    if images_from == "another embed output":
        images = shutil.copytree(images, tmp_path / "images-idx")
    else:  # row ids shared with the text index
        images = tmp_path / "images-idx"
        assert cli.main(["index", str(root / "emb-t"), "--out", str(images), "--quiet"]) == 0
    client = TestClient(create_app([f"shapes={images}", f"shapes={texts}"]))
    path = client.post("/search", json={"text": "a green square", "k": 1, "modality": "text"}).json()["results"][0]
    assert path["caption"] == "a green square"
    found = {m: next(r for r in opened.load(where).meta.to_pylist() if r["path"] == path["path"])
             for m, where in (("image", images), ("text", texts))}
    gone = found[deleted_in]["id"]
    assert cli.main(["index", "--delete", str(gone), str(images if deleted_in == "image" else texts)]) == 0
    for modality in ("image", "text"):
        hits = client.post("/search", json={"text": "a green square", "k": 12, "modality": modality}).json()
        assert found[modality]["path"] not in [h["path"] for h in hits["results"]], modality
        assert len(hits["results"]) == 11
        assert client.get(f"/image/{found[modality]['id']}?modality={modality}").status_code == 404
        knn = client.post("/knn-service", json={"text": "a green square", "modality": modality, "num_images": 12})
        assert found[modality]["path"] not in [r.get("image_path") for r in knn.json()]
        meta = client.post("/metadata", json={"ids": [found[modality]["id"]], "modality": modality})
        assert meta.status_code == 400
    assert opened.load(texts if deleted_in == "image" else images).deleted.size == 0  # its own files untouched


@pytest.mark.parametrize("damage", [{"files": {"index": 5}}, {"params": {"nprobe": "x"}}, {"count": "12"},
                                    {"files": {"meta": "/etc/passwd"}}, {"deleted": {"file": 3, "count": 1}}])
def test_a_live_reload_of_a_damaged_index_json_keeps_the_previous_generation_serving(built, tmp_path, damage):
    """Before: a reload of an index.json with a wrong type answered 500 to every request."""
    from openalign.serve.app import create_app

    root, images, _ = built
    index = shutil.copytree(images, tmp_path / "idx")
    client = TestClient(create_app(index))
    want = client.post("/search", json={"text": "a red circle", "k": 3}).json()
    info = json.loads((index / "index.json").read_text())
    (index / "index.json").write_text(json.dumps(info | damage))
    for _ in range(3):
        answer = client.post("/search", json={"text": "a red circle", "k": 3})
        assert answer.status_code == 200 and answer.json() == want
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("content,message", [
    ('{"a": ' + "[" * 5_000 + "]" * 5_000 + "}", "is not a JSON file of index names"),  # before: RecursionError
    (json.dumps({"a": {"image": 5}}), "a's image must be a directory"),  # before: TypeError
    (json.dumps({"a": {"image": "idx", "model": ["m"]}}), "a's model must be a directory"),
    (json.dumps({"a": {"image": "idx", "min_score": True}}), "min_score must be a cosine"),  # before: read as 1.0
])
def test_an_indices_paths_json_of_wrong_types_is_one_sentence(built, content, message):
    from openalign.serve.catalog import parse_specs

    root, _, _ = built
    (root / "bad.json").write_text(content)
    with pytest.raises(ConfigError, match=message):
        parse_specs([str(root / "bad.json")])


def test_an_indices_paths_json_with_a_bom_is_read(built):
    from openalign.serve.catalog import parse_specs

    root, images, _ = built
    (root / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"a": "idx"}).encode())
    assert [(s.name, s.paths) for s in parse_specs([str(root / "bom.json")])] == [("a", {"image": root / "idx"})]
