"""The HTTP API through a test client: searches, uploads good and bad, thumbnails, the page."""

import base64
import io
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from conftest import COLORS, SHAPES, save_tiny_model, shape_image, shape_index
from openalign import cli


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from openalign.serve.app import Limits, create_app

    root = tmp_path_factory.mktemp("serve")
    return TestClient(create_app(shape_index(root), None, Limits(max_upload_bytes=50_000, max_pixels=250_000)))


def b64(image: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def test_health_page_and_openapi(client):
    assert client.get("/health").json() == {"status": "ok", "count": 12, "kind": "flat", "dim": 80,
                                            "indices": {"idx": {"image": {"count": 12, "kind": "flat", "dim": 80}}}}
    page = client.get("/")
    assert page.status_code == 200 and "openalign search" in page.text and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200 and client.get("/static/../app.py").status_code == 404
    assert "/search" in client.get("/openapi.json").json()["paths"]


def test_text_image_and_arithmetic_queries(client):
    text = client.post("/search", json={"text": "a red circle", "k": 5}).json()
    assert len(text["results"]) == 5 and text["count"] == 12
    assert [r["rank"] for r in text["results"]] == [1, 2, 3, 4, 5]
    assert all(a["score"] >= b["score"] for a, b in zip(text["results"], text["results"][1:]))
    assert text["results"][0]["thumbnail"] == f"/image/{text['results'][0]['id']}"
    upload = client.post("/search", json={"image": b64(shape_image("blue", "square")), "plus": ["red"],
                                          "minus": ["blue"], "k": 12}).json()
    assert len(upload["results"]) == 12
    by_id = client.post("/search", json={"image_id": 3, "k": 12}).json()["results"]
    assert by_id[0]["id"] == 3 and by_id[0]["score"] == pytest.approx(1.0, abs=1e-5)  # an image finds itself first
    weights = client.post("/search", json={"image_id": 3, "plus": ["green"], "text_weight": 0, "k": 12}).json()
    assert [r["id"] for r in weights["results"]] == [r["id"] for r in by_id]  # text weight 0: the image alone


@pytest.mark.parametrize("body,status,message", [
    ({"image": base64.b64encode(b"definitely not an image").decode()}, 400, "not a readable image"),
    ({"image": "%%% not base64 %%%"}, 400, "base64"),
    ({"image": base64.b64encode(b"\xff\xd8\xff\xe0" + b"\0" * 64).decode()}, 400, "not a readable image"),
    ({"image": base64.b64encode(b"x" * 60_000).decode()}, 413, "larger than"),
    ({"image": b64(Image.new("RGB", (600, 600), "red"), "JPEG")}, 413, "pixels"),
    ({}, 400, "needs a text, an image or an image id"),
    ({"image_id": 999}, 400, "no image with id 999"),
    ({"text": "x", "plus": ["a"] * 5, "minus": ["b"] * 4}, 400, "at most 8"),
    ({"text": "x", "k": 0}, 422, ""),
    ({"text": "x", "min_score": 1.5}, 422, ""),
])
def test_bad_requests_get_a_clear_4xx(client, body, status, message):
    response = client.post("/search", json=body)
    assert response.status_code == status
    assert message in str(response.json()["detail"])


def test_min_score_per_request_and_as_the_server_default(client, tmp_path):
    from openalign.serve.app import create_app

    everything = client.post("/search", json={"text": "a red circle", "k": 12}).json()
    scores = [r["score"] for r in everything["results"]]
    floor = (scores[3] + scores[4]) / 2  # between the 4th and the 5th result
    some = client.post("/search", json={"text": "a red circle", "k": 12, "min_score": floor}).json()
    assert [r["score"] for r in some["results"]] == scores[:4] and some["min_score"] == floor
    assert everything["min_score"] is None
    (tmp_path / "m.json").write_text(json.dumps({"t2i_threshold_median": floor}))  # as `openalign eval` writes it
    index_dir = client.app.state.catalog.get(None).live(None).path
    server = TestClient(create_app(index_dir, None, min_score=str(tmp_path / "m.json")))
    assert len(server.post("/search", json={"text": "a red circle", "k": 12}).json()["results"]) == 4
    assert len(server.post("/search", json={"text": "a red circle", "k": 12, "min_score": -1}).json()["results"]) == 12


def test_thumbnails(client):
    response = client.get("/image/0?size=32")
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    assert max(Image.open(io.BytesIO(response.content)).size) <= 32
    assert client.get("/image/12").status_code == 404


def test_thumbnails_of_an_index_built_from_shards(tmp_path, shapes):
    from openalign.serve.app import create_app

    model = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    assert cli.main(["embed", str(model), "--images", str(shapes["eval"]), "--out", str(tmp_path / "emb"),
                     "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    client = TestClient(create_app(tmp_path / "idx"))
    hit = client.post("/search", json={"text": "a red circle", "k": 1}).json()["results"][0]
    assert hit["path"].endswith(".tar")
    response = client.get(hit["thumbnail"])
    assert response.status_code == 200 and Image.open(io.BytesIO(response.content)).size[0] > 0


@pytest.mark.parametrize("body,status,message", [
    ({"text": "x", "plus": ["a" * 1_001]}, 422, "at most 1000 characters"),
    ({"text": "x", "minus": ["b" * 5_000]}, 422, "at most 1000 characters"),
    ({"text": "x", "plus": ["a"] * 20}, 422, "at most 8 items"),
    ({"image_id": 3, "text_weight": float("nan")}, 422, "finite number"),
    ({"image_id": 3, "image_weight": float("inf")}, 422, "finite number"),
    ({"text": "x", "min_score": True}, 422, "valid number"),  # before: read as a floor of 1.0
    ({"text": "x", "k": True}, 422, "valid integer"),
    ({"image_id": True}, 422, "valid integer"),
])
def test_terms_and_weights_are_bounded_and_finite(client, body, status, message):
    import json

    # Python's JSON writer emits NaN / Infinity, as an attacker's client would
    response = client.post("/search", content=json.dumps(body), headers={"content-type": "application/json"})
    assert response.status_code == status
    assert message in str(response.json()["detail"])


def test_validation_errors_do_not_echo_the_input(client):
    response = client.post("/search", json={"text": "y" * 100_000})
    assert response.status_code == 422
    assert len(response.content) < 1_000 and "yyyy" not in response.text
    assert response.json()["detail"][0]["loc"] == ["body", "text"]


def test_a_body_over_the_limit_is_refused_before_it_is_read(client):
    import resource

    limit = 50_000 * 4 // 3 + 64 * 1024  # the fixture's Limits(max_upload_bytes=50_000)
    declared = client.post("/search", content=b"{" + b" " * (limit + 10) + b"}",
                           headers={"content-type": "application/json"})
    assert declared.status_code == 413 and "larger than" in declared.json()["detail"]

    # chunked (no Content-Length): 200 x 64 KiB offered, straight through the ASGI app; reading stops
    # at the first chunk over the limit (TestClient would read the whole body before sending it)
    import asyncio

    chunks_read, sent = 0, []

    async def receive():
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b"a" * 2**16, "more_body": chunks_read < 200}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/search", "raw_path": b"/search", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("t", 80)}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    asyncio.run(client.app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]  # nothing after the 413
    assert chunks_read == 3  # 3 x 64 KiB is the first count past the 132,202-byte limit
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # parsing it would take GBs
    assert client.post("/search", json={"text": "a red circle", "k": 2}).status_code == 200  # still serving


def test_host_header_thumbnails_and_404s_do_not_reach_past_the_index(tmp_path, monkeypatch, capsys):
    # Before: any Host header was answered (DNS rebinding), `--host 0.0.0.0` bound every interface without a word,
    # a 404 named the server's file path, and a thumbnail followed a symlink swapped in after indexing.
    import os
    import socket

    import uvicorn

    from openalign.serve.app import allowed_hosts, create_app

    index = shape_index(tmp_path)
    app = create_app(index, None, hosts=allowed_hosts("127.0.0.1"))
    local = TestClient(app, base_url="http://127.0.0.1:8000")
    assert local.get("/health").status_code == 200
    assert TestClient(app, base_url="http://rebound.example:8000").get("/health").status_code == 400
    assert "localhost" in allowed_hosts("127.0.0.1") and socket.gethostname() not in allowed_hosts("127.0.0.1")
    assert socket.gethostname() in allowed_hosts("0.0.0.0") and "proxy.lan" in allowed_hosts("127.0.0.1", ("proxy.lan",))
    # a thumbnail whose file was replaced by a link to another file after indexing
    meta = local.post("/search", json={"text": "a red circle", "k": 12}).json()["results"]
    victim = Path(meta[0]["path"])
    secret = tmp_path / "secret.png"
    shape_image("green", "square").save(secret)
    victim.unlink()
    os.symlink(secret, victim)
    answer = local.get(f"/image/{meta[0]['id']}")
    assert answer.status_code == 404 and "moved" in answer.json()["detail"]
    assert str(tmp_path) not in answer.text
    victim.unlink()  # gone: 404 without the path
    answer = local.get(f"/image/{meta[0]['id']}")
    assert answer.status_code == 404 and str(tmp_path) not in answer.text
    # the warning and the names, from `openalign serve`
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    assert cli.main(["serve", str(index), "--host", "0.0.0.0", "--port", "8123"]) == 0
    err = capsys.readouterr().err
    assert "warning: --host 0.0.0.0 serves every client" in err and "answering Host names: 127.0.0.1" in err


def test_large_k_is_bounded_and_only_the_first_results_carry_metadata(client):
    from openalign.serve.app import Limits, create_app

    index_dir = client.app.state.catalog.get(None).live(None).path
    small = TestClient(create_app(index_dir, None, Limits(max_k=12, max_metadata=5)))
    results = small.post("/search", json={"text": "a red circle", "k": 12}).json()["results"]
    assert len(results) == 12 and all(r["caption"] for r in results[:5])
    assert all(r["caption"] is None and r["path"] is None for r in results[5:])
    assert all(r["thumbnail"] == f"/image/{r['id']}" for r in results)  # each still reachable
    refused = small.post("/search", json={"text": "a red circle", "k": 13})
    assert refused.status_code == 400 and refused.json()["detail"] == "k is at most 12 on this server"
    assert small.post("/search", json={"text": "x", "rerank": 201}).status_code == 400


def test_search_reads_a_json_body_whatever_its_content_type_as_knn_service_does(client):
    # Before: /search answered 422 to a JSON body sent as text/plain or with no content type; /knn-service took it.
    want = client.post("/search", json={"text": "a red circle", "k": 3}).json()
    for headers in ({}, {"content-type": "text/plain"}):
        answer = client.post("/search", content=b'{"text": "a red circle", "k": 3}', headers=headers)
        assert answer.status_code == 200 and answer.json() == want
    assert client.post("/search", content=b"{nope").json()["detail"] == "the request body is not JSON"
