"""clip-retrieval's back-end API on `openalign serve`, queried by clip-retrieval's own ClipClient (2.45.0).

Its package's __init__ imports its whole back end (torch, faiss, CLIP, flask), so it is installed without
dependencies into a folder of its own (`make setup` does it; this test does it when missing) and clip_client.py
is loaded alone. ClipClient posts a JSON string with no content type, `text: null` beside an image, and
`num_result_ids` equal to `num_images`."""

import base64
import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import serving, shape_image, shape_index
from openalign import cli

CLIP_RETRIEVAL = "clip-retrieval==2.45.0"


def clip_client_module():
    target = Path(sys.prefix) / "clip-retrieval"  # the venv's; the Makefile installs it there
    source = target / "clip_retrieval" / "clip_client.py"
    if not source.is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                        CLIP_RETRIEVAL], check=True)
    spec = importlib.util.spec_from_file_location("clip_client", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from openalign.serve.app import create_app

    root = tmp_path_factory.mktemp("clip_retrieval")
    index = shape_index(root)
    shape_image("blue", "square").save(root / "query.png")
    with serving(create_app([f"shapes={index}"])) as url:
        yield url, root


def cli_search(capsys, index: Path, *args: str) -> list[tuple[int, float]]:
    """`openalign search`'s printed (id, score) rows."""
    assert cli.main(["search", str(index), *args]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    return [(int(line.split()[2]), float(line.split()[1])) for line in rows if line.split()[0].isdigit()]


def same(results: list[dict], expected: list[tuple[int, float]]) -> None:
    assert [r["id"] for r in results] == [i for i, _ in expected]
    np.testing.assert_allclose([r["similarity"] for r in results], [s for _, s in expected], atol=6e-4)


def test_clip_client_by_text_image_and_embedding_equals_openalign_search(server, capsys):
    import openalign

    url, root = server
    client_lib = clip_client_module()
    client = client_lib.ClipClient(f"{url}/knn-service", indice_name="shapes", num_images=5, deduplicate=False)
    by_text = client.query(text="a red circle")
    same(by_text, cli_search(capsys, root / "idx", "--text", "a red circle", "-k", "5"))
    assert all(set(r) >= {"id", "similarity", "caption", "image_path"} for r in by_text)
    assert by_text[0]["caption"].startswith("a ") and Path(by_text[0]["image_path"]).is_file()

    by_image = client.query(image=str(root / "query.png"))  # ClipClient reads the file and sends its base64
    same(by_image, cli_search(capsys, root / "idx", "--image", str(root / "query.png"), "-k", "5"))

    vector = openalign.load(root / "model").encode_texts(["a red circle"])[0]
    by_vector = client.query(embedding_input=[float(x) for x in vector])
    same(by_vector, [(r["id"], r["similarity"]) for r in by_text])

    twelve = client_lib.ClipClient(f"{url}/knn-service", indice_name="shapes", num_images=12, deduplicate=False)
    assert len(twelve.query(text="a red circle")) == 12  # num_images honoured


def test_clip_client_sends_a_text_index_query_to_the_text_vectors(tmp_path, capsys):
    from openalign.serve.app import create_app

    index = shape_index(tmp_path)
    assert cli.main(["embed", str(tmp_path / "model"), "--images", str(tmp_path / "images"), "--out",
                     str(tmp_path / "emb-t"), "--texts", "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb-t"), "--out", str(tmp_path / "idx-t"), "--vectors", "text"]) == 0
    client_lib = clip_client_module()
    with serving(create_app([f"shapes={index}", f"shapes={tmp_path / 'idx-t'}"])) as url:
        texts = client_lib.ClipClient(f"{url}/knn-service", "shapes", modality=client_lib.Modality.TEXT,
                                      num_images=4, deduplicate=False).query(text="a green square")
        images = client_lib.ClipClient(f"{url}/knn-service", "shapes", num_images=4,
                                       deduplicate=False).query(text="a green square")
    capsys.readouterr()
    same(texts, cli_search(capsys, tmp_path / "idx-t", "--text", "a green square", "-k", "4"))
    same(images, cli_search(capsys, index, "--text", "a green square", "-k", "4"))
    assert texts[0]["caption"] == "a green square" and texts[0]["similarity"] == pytest.approx(1.0, abs=1e-4)


def test_raw_requests_metadata_rules_and_the_combined_extension(server):
    url, root = server
    image = base64.b64encode((root / "query.png").read_bytes()).decode()
    with httpx.Client(base_url=url) as http:
        assert http.get("/indices-list").json() == ["shapes"]
        answer = http.post("/knn-service", json={"text": "a red circle", "modality": "image", "num_images": 3,
                                                 "num_result_ids": 10, "indice_name": "shapes"})
        results = answer.json()
        assert len(results) == 10 and NOT_APPLIED not in answer.headers
        assert all("caption" in r for r in results[:3]) and all(set(r) == {"id", "similarity"} for r in results[3:])

        meta = http.post("/metadata", json={"ids": [results[4]["id"], 0], "indice_name": "shapes"}).json()
        assert [m["id"] for m in meta] == [results[4]["id"], 0] and meta[0]["metadata"]["caption"].startswith("a ")
        inline = http.post("/metadata", json={"ids": [0], "indice_name": "shapes", "with_image": True}).json()
        assert base64.b64decode(inline[0]["metadata"]["image"])[:2] == b"\xff\xd8"  # a JPEG

        # ClipClient refuses text and image together; openalign's extension adds them as /search does
        both = http.post("/knn-service", json={"text": "red", "image": image, "num_images": 12, "text_weight": 2,
                                               "image_weight": 1}).json()
        ours = http.post("/search", json={"text": "red", "image": image, "k": 12}).json()["results"]
        assert [r["id"] for r in both] == [r["id"] for r in ours]
        np.testing.assert_allclose([r["similarity"] for r in both], [r["score"] for r in ours], atol=1e-6)

        flags = http.post("/knn-service", json={"text": "red", "num_images": 2, "use_safety_model": True,
                                                "use_violence_detector": True, "aesthetic_score": 9,
                                                "aesthetic_weight": 0.5})
        assert flags.status_code == 200
        assert flags.headers[NOT_APPLIED] == "use_safety_model, use_violence_detector, aesthetic_score"


NOT_APPLIED = "x-openalign-not-applied"


def test_deduplicate_keeps_the_best_of_each_near_duplicate_group(server, tmp_path):
    import shutil

    from openalign.serve.app import create_app

    _, root = server
    images = shutil.copytree(root / "images", tmp_path / "images")
    for name in ("red_circle", "blue_square"):  # two images indexed twice each: copies embed identically
        shutil.copy(images / f"{name}.png", images / f"{name}_copy.png")
    assert cli.main(["embed", str(root / "model"), "--images", str(images), "--out", str(tmp_path / "emb"),
                     "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    with serving(create_app(tmp_path / "idx")) as url, httpx.Client(base_url=url) as http:
        every = http.post("/knn-service", json={"text": "a red circle", "num_images": 14}).json()
        kept = http.post("/knn-service", json={"text": "a red circle", "num_images": 14, "deduplicate": True}).json()
    assert len(every) == 14 and len(kept) == 12
    paths = [Path(r["image_path"]).stem.removesuffix("_copy") for r in kept]
    assert sorted(paths) == sorted(set(paths))  # each image once
    assert kept == [r for r in every if r["id"] in {k["id"] for k in kept}]  # the rest in order, unchanged
    firsts = {}
    for r in every:
        firsts.setdefault(Path(r["image_path"]).stem.removesuffix("_copy"), r["id"])
    assert {r["id"] for r in kept} == set(firsts.values())  # each pair keeps its better-ranked member


def test_near_duplicates_oracle():
    """Connected groups over cosine > threshold (clip-retrieval's range search), each keeping its first member."""
    from openalign.index.search import near_duplicates

    base = np.eye(4, dtype=np.float32)
    close = lambda v, w: (v + w * base[3]) / np.linalg.norm(v + w * base[3])  # noqa: E731
    vectors = np.stack([base[0], base[1], close(base[0], 0.2), close(close(base[0], 0.2), 0.25), base[2],
                        2 * base[1]])
    # 0 ~ 2 (cos 0.98) ~ 3 (0.97 to 2, 0.89 to 0): one chain; 5 is 1 scaled: normalized first
    assert near_duplicates(vectors, 0.94) == [2, 3, 5]
    assert near_duplicates(vectors, 0.999) == [5]
    assert near_duplicates(vectors[:0].reshape(0, 4), 0.94) == []


@pytest.mark.parametrize("body,status,message", [
    ({"text": "x", "image_url": "http://example.com/a.jpg"}, 400, "fetches nothing"),
    ({"image": "%%% not base64 %%%"}, 400, "base64"),
    ({"image": base64.b64encode(b"not an image").decode()}, 400, "not a readable image"),
    ({"embedding_input": [0.1, 0.2]}, 400, "80-dimensional"),
    ({"embedding_input": [0.0] * 80}, 400, "non-zero"),
    ({"embedding_input": [0.1] * 80, "text": "x"}, 400, "alone"),
    ({"embedding_input": [3e38] * 80}, 400, "too long a vector"),  # before: infinite scores, then a 500
    ({"text": "x", "num_images": 20_000}, 400, "at most 10,000"),
    ({"text": "x", "indice_name": "laion5B"}, 400, "no index named 'laion5B'"),
    ({"text": "x", "modality": "text"}, 400, "has no text index"),
    ({"text": "x", "modality": "audio"}, 422, ""),
    ({"text": "x" * 2_000}, 422, ""),
    ({}, 400, "needs text, image or embedding_input"),
])
def test_bad_requests_get_the_same_clear_4xx_as_search(server, body, status, message):
    url, _ = server
    response = httpx.post(f"{url}/knn-service", json=body)
    assert response.status_code == status
    assert message in str(response.json()["detail"])


def test_non_finite_numbers_and_non_json_bodies(server):
    url, _ = server
    nan = httpx.post(f"{url}/knn-service", content='{"embedding_input": [NaN' + ", 0.1" * 79 + "]}")
    assert nan.status_code == 422 and "finite" in str(nan.json()["detail"])
    assert httpx.post(f"{url}/knn-service", content="{not json").json()["detail"] == "the request body is not JSON"
    assert httpx.post(f"{url}/metadata", json={"ids": [999], "indice_name": "shapes"}).status_code == 400
    deep = "[" * 100_000 + "]" * 100_000  # before: RecursionError, a 500 (/search answered 400)
    for route in ("/knn-service", "/metadata", "/search"):
        answer = httpx.post(f"{url}{route}", content='{"ids": ' + deep + "}", headers={"Content-Type": "application/json"})
        assert 400 <= answer.status_code < 500, (route, answer.status_code)
    assert "nested too deeply" in httpx.post(f"{url}/knn-service", content=deep).json()["detail"]


def test_long_captions_are_cut_repeated_ids_answered_once_and_the_answer_is_capped(tmp_path):
    """Before: 30 rows of 4 MB captions gave a 126 MB answer; `ids` of one id x10,000 ran 12 s, took RSS from 0.9 to
    2.4 GB, then answered 500."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fastapi.testclient import TestClient

    from openalign.serve.app import Limits, create_app

    index = shape_index(tmp_path)
    meta = pq.read_table(tmp_path / "emb" / "meta-000000.parquet")
    long = ["a caption " * 400_000] * len(meta)  # 4 MB each
    pq.write_table(meta.set_column(meta.schema.get_field_index("caption"), "caption", pa.array(long)),
                   tmp_path / "emb" / "meta-000000.parquet")
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(index), "--quiet"]) == 0
    client = TestClient(create_app(index))
    answer = client.post("/metadata", json={"ids": list(range(12))})
    assert answer.status_code == 200 and len(answer.content) < 100_000
    caption = answer.json()[0]["metadata"]["caption"]
    assert len(caption) == Limits().max_caption_chars and caption.endswith("…")
    repeated = client.post("/metadata", json={"ids": [3] * 10_000 + [4]})
    assert [r["id"] for r in repeated.json()] == [3, 4]
    found = client.post("/search", json={"text": "a red circle", "k": 12}).json()["results"]
    assert max(len(r["caption"]) for r in found) == Limits().max_caption_chars
    knn = client.post("/knn-service", json={"text": "a red circle", "num_images": 12}).json()
    assert max(len(r["caption"]) for r in knn) == Limits().max_caption_chars
    small = TestClient(create_app(index, limits=Limits(max_caption_chars=10**7, max_answer_bytes=2**20)))
    refused = small.post("/metadata", json={"ids": list(range(12))})
    assert refused.status_code == 413 and "ask for fewer ids" in refused.json()["detail"]
    refused = small.post("/knn-service", json={"text": "a red circle", "num_images": 12})
    assert refused.status_code == 413 and "ask for fewer num_images" in refused.json()["detail"]


def test_a_refused_chunked_body_is_no_server_error(server):
    """A body over the limit sent without a length is refused mid-stream; the handler reading it then sees the client
    gone. Before: an unhandled ClientDisconnect per such request, and under load abusive clients' other requests
    were dropped (bench/serve_load.py: ReadError on 26 of 745)."""
    import logging

    url, _ = server
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        def chunks():
            yield b'{"text": "'
            for _ in range(16):
                yield b"a" * 2**20

        for route in ("/knn-service", "/metadata"):
            try:
                assert httpx.post(f"{url}{route}", content=chunks()).status_code == 413
            except httpx.HTTPError:  # the server may close the connection mid-upload
                pass
        assert httpx.get(f"{url}/indices-list").status_code == 200
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not [r for r in records if r.levelno >= logging.ERROR], [r.getMessage() for r in records]
