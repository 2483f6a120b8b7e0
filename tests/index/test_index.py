"""Embed, index and search: exact results against numpy, approximate recall, the CLI end to end."""

import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import COLORS, SHAPES, run_killed, save_tiny_model, shape_image, shape_images
from openalign import cli
from openalign.config import ConfigError
from openalign.index import build as build_lib
from openalign.index import opened
from openalign.index.embed import MANIFEST, _write_part


def fake_embeddings(path, vectors: np.ndarray, part: int = 50_000):
    path.mkdir(parents=True, exist_ok=True)
    parts = {}
    for i, start in enumerate(range(0, len(vectors), part)):
        chunk = vectors[start:start + part]
        rows = [{"key": f"k{start + j}", "path": f"/x/{start + j}.jpg", "caption": "", "width": 1, "height": 1}
                for j in range(len(chunk))]
        _write_part(path, i, chunk, rows)
        parts[str(i)] = {"rows": len(chunk), "skipped": 0}
    (path / MANIFEST).write_text(json.dumps({"complete": True, "parts": parts, "model": "m", "dim": vectors.shape[1]}))
    return path


def clustered(n: int, d: int, centers: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, d))
    x = c[rng.integers(0, centers, n)] + 0.6 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_flat_index_equals_numpy_brute_force(tmp_path):
    x = clustered(3_000, 24, 20)
    info = build_lib.build(fake_embeddings(tmp_path / "emb", x, part=1_000), tmp_path / "idx",
                           build_lib.IndexOptions(kind="flat"))
    assert (info.kind, info.count, info.recall_at_10) == ("flat", 3_000, 1.0)
    loaded = opened.load(tmp_path / "idx")
    queries = clustered(25, 24, 20, seed=1)
    scores, ids = loaded.search(queries, 10)  # exact.search over the memory-mapped FAISS vectors
    np.testing.assert_array_equal(ids, loaded.index.search(queries, 10)[1])  # FAISS's own search agrees
    sims = queries @ x.T
    for q in range(len(queries)):
        expected = np.sort(sims[q])[::-1][:10]
        np.testing.assert_allclose(scores[q], expected, rtol=1e-5, atol=1e-6)  # same scores in the same order
        np.testing.assert_allclose(sims[q, ids[q]], scores[q], rtol=1e-5, atol=1e-6)  # ids carry those scores
    assert pq.read_table(tmp_path / "idx" / "meta.parquet").column("id").to_pylist() == list(range(3_000))


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_indexes_reach_the_recall_target_on_100k(tmp_path, kind):
    x, queries = np.split(clustered(100_300, 32, 200), [100_000])  # held-out queries from the same distribution
    info = build_lib.build(fake_embeddings(tmp_path / "emb", x), tmp_path / "idx",
                           build_lib.IndexOptions(kind=kind, recall=0.95, tune_queries=500))
    loaded = opened.load(tmp_path / "idx")
    exact = np.argsort(-(queries @ x.T), axis=1)[:, :10]
    recall = build_lib.recall_at_10(loaded.search(queries, 10)[1], exact)
    assert info.recall_at_10 >= 0.95 and recall >= 0.95
    assert set(info.params) & {"nprobe", "efSearch"}
    assert info.params.get("codes", "sq8") == "sq8"  # IVF: 8-bit codes by default
    # an indexed vector comes back for queries by image id (8-bit codes: to within their step)
    np.testing.assert_allclose(loaded.index.reconstruct(1234), x[1234], atol=0.02)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])


def test_embed_index_search_from_the_command_line(model_dir, tmp_path, capsys):
    images = tmp_path / "images"
    for _i, (colour, shape) in enumerate([(c, s) for c in COLORS for s in SHAPES]):
        (images / colour).mkdir(parents=True, exist_ok=True)
        shape_image(colour, shape).save(images / colour / f"{shape}.png")
        (images / colour / f"{shape}.txt").write_text(f"a {colour} {shape}")
    (images / "broken.jpg").write_bytes(b"not an image")
    emb, idx = tmp_path / "emb", tmp_path / "idx"
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(emb), "--part-size", "5",
                     "--quiet"]) == 0
    manifest = json.loads((emb / MANIFEST).read_text())
    assert (manifest["count"], manifest["skipped"], len(manifest["parts"])) == (12, 1, 3)
    first = np.load(emb / "part-000001.npy")
    # resume: a lost part is embedded again, the others are kept
    (emb / "part-000001.npy").unlink()
    del manifest["parts"]["1"]
    manifest["complete"] = False
    (emb / MANIFEST).write_text(json.dumps(manifest))
    kept = (emb / "part-000000.npy").stat().st_mtime_ns
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(emb), "--part-size", "5",
                     "--quiet"]) == 0
    assert (emb / "part-000000.npy").stat().st_mtime_ns == kept
    np.testing.assert_allclose(np.load(emb / "part-000001.npy"), first, rtol=1e-5, atol=1e-6)
    assert cli.main(["index", str(emb), "--out", str(idx)]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(idx), "--text", "a red circle", "-k", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].split()[:3] == ["rank", "score", "id"]
    assert cli.main(["search", str(idx), "--image", str(images / "red" / "circle.png"), "--plus", "blue",
                     "--minus", "red", "-k", "12"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 13
    assert cli.main(["search", str(idx), "--image-id", "0", "-k", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["1", "1.000", "0"]  # its nearest is itself
    assert cli.main(["search", str(idx), "--image", str(images / "broken.jpg")]) == 2
    assert cli.main(["search", str(idx), "--image-id", "99"]) == 2
    assert cli.main(["search", str(idx)]) == 2
    assert "a query needs" in capsys.readouterr().err
    # a model whose weights changed since embedding is refused, with what to do
    other = save_tiny_model(tmp_path / "other", ["a different vocabulary entirely"] * 3)
    assert cli.main(["search", str(idx), "--model", str(other), "--text", "red"]) == 2
    assert "not the model this index was embedded with" in capsys.readouterr().err
    # --min-score: the calibrated threshold from eval's metrics JSON for this model, or a number
    assert cli.main(["eval", str(model_dir), "--data", str(images), "--task", "retrieval",
                     "--out", str(tmp_path / "m.json")]) == 0
    threshold = json.loads((tmp_path / "m.json").read_text())["t2i_threshold_median"]
    capsys.readouterr()
    assert cli.main(["search", str(idx), "--text", "a red circle", "-k", "12"]) == 0
    scores = [float(line.split()[1]) for line in capsys.readouterr().out.strip().splitlines()[1:]]
    above = [s for s in scores if s >= threshold]
    assert 0 < len(above) < 12  # the case tells a floor from none
    assert cli.main(["search", str(idx), "--text", "a red circle", "-k", "12", "--min-score", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert [float(line.split()[1]) for line in out[1:-1]] == above and out[-1].startswith(f"{len(above)} result")
    other_model = json.loads((tmp_path / "m.json").read_text()) | {"model_weights": "0" * 32}
    (tmp_path / "other.json").write_text(json.dumps(other_model))
    for floor, message in ((tmp_path / "other.json", "measured on another model"), ("2", "not a cosine similarity"),
                           (tmp_path / "nothing.json", "neither a number nor a metrics JSON"),
                           (images / "red" / "circle.txt", "not a JSON file")):
        assert cli.main(["search", str(idx), "--text", "red", "--min-score", str(floor)]) == 2
        assert message in capsys.readouterr().err


def test_query_vector_is_the_papers_weighted_sum(model_dir):
    from openalign.model.encode import encode_texts
    from openalign.index import search
    from openalign.model.hub import load_pretrained

    model, tokenizer, _ = load_pretrained(model_dir)
    image = shape_image("red", "circle")
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    q = search.query_vector(model, tokenizer, search.Query(image=buf.getvalue(), plus=("blue",), minus=("red",)))
    e_img = search.image_embedding(model, buf.getvalue())
    e_txt = encode_texts(model, tokenizer, ["blue", "red"], max_length=16).numpy()
    expected = 1.0 * e_img + 2.0 * (e_txt[0] - e_txt[1])
    np.testing.assert_allclose(q, expected / np.linalg.norm(expected), rtol=1e-5, atol=1e-6)
    text_only = search.query_vector(model, tokenizer, search.Query(text="blue"))
    np.testing.assert_allclose(text_only, e_txt[0] / np.linalg.norm(e_txt[0]), rtol=1e-5, atol=1e-6)


def test_embed_reads_any_sidecar_and_records_absolute_paths(model_dir, tmp_path, monkeypatch):
    # Before: UnicodeDecodeError on a Latin-1 sidecar; paths relative to the working directory, so the
    # service started elsewhere 404'd every thumbnail.
    from fastapi.testclient import TestClient

    from openalign.index.opened import load
    from openalign.serve.app import create_app

    images = tmp_path / "work" / "images"
    images.mkdir(parents=True)
    shape_image("red", "circle").save(images / "a.png")
    (images / "a.txt").write_bytes("caf\xe9 rouge".encode("latin-1"))
    shape_image("blue", "square").save(images / "b.png")
    monkeypatch.chdir(tmp_path / "work")
    assert cli.main(["embed", str(model_dir), "--images", "images", "--out", "emb", "--quiet"]) == 0
    assert cli.main(["index", "emb", "--out", "idx"]) == 0
    meta = load(tmp_path / "work" / "idx").meta.to_pylist()
    assert [m["caption"] for m in meta] == ["caf\ufffd rouge", ""]
    assert all(Path(m["path"]).is_absolute() and Path(m["path"]).is_file() for m in meta)
    monkeypatch.chdir(tmp_path)  # the service, started from another directory, finds the model and the images
    client = TestClient(create_app(tmp_path / "work" / "idx"))
    assert client.get("/image/0").status_code == 200 and client.get("/image/1").status_code == 200


def test_an_index_over_its_memory_budget_goes_to_disk_and_searches_the_same(tmp_path, capsys):
    x, queries = np.split(clustered(40_200, 32, 60, seed=2), [40_000])
    emb = fake_embeddings(tmp_path / "emb", x.astype(np.float16), part=7_000)  # as `embed --float16` writes
    common = ["--kind", "ivf", "--nlist", "64", "--train-per-cell", "39", "--quiet"]
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "mem"), *common]) == 0
    # 40k codes of 32 + 8 bytes = 1.6 MB: a 1 MB budget puts the lists on disk, added in 2 processes
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "disk"), "--memory", "1M", "--block-rows", "6000",
                     "--workers", "2", *common]) == 0
    assert "7 IVF shards on disk" in capsys.readouterr().out
    mem, disk = opened.load(tmp_path / "mem"), opened.load(tmp_path / "disk")
    assert disk.info["storage"] == "shards" and len(disk.info["shards"]) == 7 and mem.info["storage"] == "memory"
    assert not (tmp_path / "disk" / "_work").exists() and not (tmp_path / "disk" / "index.faiss").exists()
    assert disk.index.ntotal == mem.index.ntotal == 40_000
    for name in ("nlist", "trained_on"):
        assert disk.info["params"][name] == mem.info["params"][name]
    disk_nprobe = disk.info["params"]["nprobe"]
    faiss.ParameterSpace().set_index_parameter(mem.index, "nprobe", disk_nprobe)
    s_mem, i_mem = mem.search(queries, 10)
    s_disk, i_disk = disk.search(queries, 10)  # every shard's top 10, merged exactly
    np.testing.assert_allclose(s_disk, s_mem, rtol=0, atol=1e-6)  # the same cells and codes, split in row ranges
    assert [set(r) for r in i_disk.tolist()] == [set(r) for r in i_mem.tolist()]
    np.testing.assert_allclose(disk.vector(23_456), mem.vector(23_456), atol=1e-6)  # by id, across shards
    exact = np.argsort(-(queries @ x.astype(np.float16).astype(np.float32).T), axis=1)[:, :10]
    assert build_lib.recall_at_10(i_disk, exact) >= 0.95
    # moved elsewhere, the shards are found beside index.json; ids are metadata rows
    (tmp_path / "disk").rename(tmp_path / "moved")
    moved = opened.load(tmp_path / "moved")
    np.testing.assert_array_equal(moved.search(queries, 10)[1], i_disk)
    assert moved.meta.take([39_999, 3])["key"].to_pylist() == ["k39999", "k3"] and len(moved.meta) == 40_000
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "flat"), "--kind", "flat", "--memory", "1M"]) == 2
    assert "use --kind ivf" in capsys.readouterr().err


def test_refine_rescores_the_shortlist_with_float16_vectors(tmp_path, capsys):
    x, queries = np.split(clustered(20_200, 32, 60, seed=3), [20_000])
    emb = fake_embeddings(tmp_path / "emb", x, part=7_000)
    common = ["--kind", "ivf", "--codes", "sq8", "--nlist", "64", "--train-per-cell", "39", "--quiet"]
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "plain"), *common]) == 0
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "ref"), "--refine", "4", *common]) == 0
    plain, ref = opened.load(tmp_path / "plain"), opened.load(tmp_path / "ref")
    assert ref.info["params"]["refine"] == 4 and (tmp_path / "ref" / "vectors-f16.npy").is_file()
    assert not (tmp_path / "plain" / "vectors-f16.npy").exists() and ref.index.ntotal == 20_000
    nprobe = ref.info["params"]["nprobe"]
    faiss.ParameterSpace().set_index_parameter(plain.index, "nprobe", nprobe)
    x16 = x.astype(np.float16).astype(np.float32)
    # oracle: the 40 candidates the 8-bit codes shortlist, ranked by their float16 vectors' exact scores
    shortlist = plain.index.search(queries, 40)[1]
    exact_scores = np.einsum("qkd,qd->qk", x16[shortlist], queries)
    want = np.take_along_axis(shortlist, np.argsort(-exact_scores, axis=1, kind="stable")[:, :10], 1)
    scores, ids = ref.search(queries, 10)
    assert [set(r) for r in ids.tolist()] == [set(r) for r in want.tolist()]
    np.testing.assert_allclose(scores, np.einsum("qkd,qd->qk", x16[ids], queries), rtol=1e-5, atol=1e-6)
    assert np.all(np.diff(scores, axis=1) <= 0)
    truth = np.argsort(-(queries @ x16.T), axis=1)[:, :10]
    assert build_lib.recall_at_10(ids, truth) > build_lib.recall_at_10(plain.search(queries, 10)[1], truth)
    np.testing.assert_array_equal(ref.vector(12_345), x16[12_345])  # by id: the float16 copy, not the codes
    # IVF shards on disk with the same cells: the same refined results
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "disk"), "--refine", "4", "--memory", "1M",
                     "--block-rows", "7000", "--workers", "1", *common]) == 0
    disk = opened.load(tmp_path / "disk")
    assert disk.info["storage"] == "shards" and disk.info["params"]["nprobe"] == nprobe
    np.testing.assert_array_equal(disk.search(queries, 10)[1], ids)
    # rebuilt without refine, the float16 copy goes; a refined index without it says what to do
    (tmp_path / "ref" / "vectors-f16.npy").unlink()
    with pytest.raises(ConfigError, match="build the index again"):
        opened.load(tmp_path / "ref")
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "disk"), *common]) == 0
    assert not (tmp_path / "disk" / "vectors-f16.npy").exists()
    capsys.readouterr()
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "bad"), "--refine", "-1", *common]) == 2
    assert "--refine=-1 must be 0" in capsys.readouterr().err


def test_rerank_orders_the_shortlist_by_late_interaction_in_search_and_serve(tmp_path, capsys):
    import torch
    from fastapi.testclient import TestClient
    from PIL import Image

    from openalign.data import transforms
    from openalign.loss import late_interaction
    from openalign.model.encode import encode_image_tokens, encode_text_tokens
    from openalign.model.hub import load_pretrained
    from openalign.serve.app import create_app

    model_dir = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    images = shape_images(tmp_path / "images")
    emb, idx = tmp_path / "emb", tmp_path / "idx"
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(emb), "--patches", "--quiet"]) == 0
    assert "bytes per image" in capsys.readouterr().out
    manifest = json.loads((emb / MANIFEST).read_text())
    assert manifest["patch_bytes_per_image"] == manifest["patches_per_image"] * 80 * 2  # float16
    assert cli.main(["index", str(emb), "--out", str(idx)]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(idx), "--text", "a red circle", "-k", "3", "--rerank", "12"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    got = [int(line.split()[2]) for line in lines[1:4]]
    assert lines[-1].startswith("re-ranked the top 12 by late interaction")
    # oracle: every image's FILIP text-to-image score for the query, from the model directly
    model, tok, cfg = load_pretrained(model_dir)
    paths = pq.read_table(emb / "meta-000000.parquet")["path"].to_pylist()
    pixels = torch.stack([transforms.eval_transform(Image.open(p).convert("RGB"), cfg.model.vision.resize_size,
                                                    cfg.model.vision.image_size) for p in paths])
    _, patches = encode_image_tokens(model, pixels)
    tokens, mask = encode_text_tokens(model, tok, ["a red circle"])
    scores = late_interaction(patches, torch.ones(patches.shape[:2], dtype=torch.bool), tokens, mask)[1][:, 0]
    assert got == scores.argsort(descending=True)[:3].tolist()
    client = TestClient(create_app(idx))
    served = client.post("/search", json={"text": "a red circle", "k": 3, "rerank": 12}).json()
    assert [r["id"] for r in served["results"]] == got and served["rerank"] == 12
    assert client.post("/search", json={"image_id": 0, "rerank": 5}).status_code == 400  # not a text query
    # an index whose embeddings have no patch vectors says what to do
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "plain"), "--out", str(tmp_path / "plain-idx")]) == 0
    assert cli.main(["search", str(tmp_path / "plain-idx"), "--text", "red", "--rerank", "5"]) == 2
    assert "embed again with `openalign embed ... --patches`" in capsys.readouterr().err


def test_a_rebuild_that_fails_leaves_the_working_index(tmp_path, monkeypatch, capsys):
    # Before: index.faiss was written in place, so a rebuild that failed (a full disk) destroyed the working
    # index, and `search` then gave a traceback.
    import errno

    from conftest import leftovers

    x, queries = np.split(clustered(3_100, 16, 20, seed=4), [3_000])
    emb, out = fake_embeddings(tmp_path / "emb", x, part=1_000), tmp_path / "idx"
    assert cli.main(["index", str(emb), "--out", str(out), "--kind", "flat"]) == 0
    before = opened.load(out).search(queries, 10)

    def full_disk(emb, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(build_lib, "write_meta", full_disk)
        assert cli.main(["index", str(emb), "--out", str(out), "--kind", "hnsw", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the disk is full: writing" in err and "MiB free on" in err and "Traceback" not in err
    after = opened.load(out)
    assert after.info["kind"] == "flat" and leftovers(tmp_path) == [] and not list((out / "_build").glob("*.faiss"))
    for a, b in zip(before, after.search(queries, 10)):
        np.testing.assert_array_equal(a, b)
    run_killed(monkeypatch, build_lib, "_tune", ["index", str(emb), "--out", str(out), "--kind", "hnsw", "--quiet"])
    assert opened.load(out).info["kind"] == "flat"
    assert cli.main(["index", str(emb), "--out", str(out), "--kind", "hnsw", "--quiet"]) == 0  # then it succeeds
    assert opened.load(out).info["kind"] == "hnsw" and not (out / "_build").exists()


def test_shards_of_an_interrupted_build_are_not_reused_once_the_vectors_changed(tmp_path, monkeypatch, capsys):
    # Before: the add tasks were keyed by the parts' paths; after the vectors changed, a rerun reused the shards
    # built from the old ones and printed `recall@10 0.000` without an error.
    x, y = clustered(8_000, 16, 30, seed=5), clustered(8_000, 16, 30, seed=6)
    emb, out = fake_embeddings(tmp_path / "emb", x, part=2_000), tmp_path / "idx"
    args = ["index", str(emb), "--out", str(out), "--kind", "ivf", "--nlist", "32", "--train-per-cell", "39",
            "--memory", "300K", "--block-rows", "2000", "--quiet"]
    run_killed(monkeypatch, build_lib, "_tune", args)  # every shard is added, then the build is killed
    assert len(list(out.rglob("shard-*.faiss"))) == 4
    fake_embeddings(tmp_path / "emb", y, part=2_000)  # embedded again: the same files, other vectors
    assert cli.main(args) == 0
    index = opened.load(out)
    assert index.info["recall_at_10"] >= 0.9
    assert np.abs(index.vector(5) - y[5]).max() < 0.01 < np.abs(index.vector(5) - x[5]).max()  # 8-bit codes of y


def test_a_rerun_of_embed_redoes_exactly_the_parts_whose_images_or_captions_changed(model_dir, tmp_path, capsys):
    # Before: parts were keyed by paths only: a replaced image and an edited caption were "12 of 12 parts already
    # done", with the old caption and size kept.
    from openalign.index.embed import load

    images = shape_images(tmp_path / "images")
    args = ["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "emb"), "--part-size", "3",
            "--quiet"]
    assert cli.main(args) == 0
    shape_image("green", "circle", size=48).save(images / "red_circle.png")  # another image under the same name
    (images / "blue_square.txt").write_text("a blue box")
    capsys.readouterr()
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "2 of 4 parts were already done" in out and "embedded again: 2 parts (images or captions changed)" in out
    vectors, meta = load(tmp_path / "emb")
    rows = {row["key"]: row for row in meta.to_pylist()}
    assert rows["blue_square.png"]["caption"] == "a blue box" and rows["red_circle.png"]["width"] == 48
    assert cli.main(args[:4] + ["--out", str(tmp_path / "fresh"), "--part-size", "3", "--quiet"]) == 0
    np.testing.assert_array_equal(vectors, load(tmp_path / "fresh")[0])  # the same as embedding from scratch


def test_a_killed_reembed_with_another_model_leaves_no_finished_manifest(model_dir, tmp_path, monkeypatch, capsys):
    # Before: the old manifest still said complete: True, and `index` built over parts of two models.
    from openalign.index import embed as embed_lib

    images = shape_images(tmp_path / "images")
    args = ["--images", str(images), "--out", str(tmp_path / "emb"), "--part-size", "3", "--quiet"]
    assert cli.main(["embed", str(model_dir), *args]) == 0
    other = save_tiny_model(tmp_path / "other", ["another vocabulary entirely", "of other words"])
    real = embed_lib.embed_part
    calls = {"n": 0}

    def killed_after_one_part(*a, **k):
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(embed_lib, "embed_part", killed_after_one_part)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["embed", str(other), *args])
    monkeypatch.setattr(embed_lib, "embed_part", real)
    capsys.readouterr()
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 2
    assert "is not a finished `openalign embed` output" in capsys.readouterr().err
    assert cli.main(["embed", str(other), *args]) == 0
    out = capsys.readouterr().out
    assert "1 of 4 parts were already done" in out and "3 parts (model or options changed)" in out


def test_transparent_images_follow_the_models_rule_openalign_white_a_foreign_checkpoint_its_processors(tmp_path):
    # Before: transparency was composited on white for every model, where transformers' processors drop alpha
    # (convert("RGB")): image cosine against transformers went as low as -0.11 on Tux Paint stamps.
    import torch
    import transformers
    from PIL import Image

    from openalign.data import transforms
    from openalign.index.embed import load
    from openalign.model.encode import encode_images
    from openalign.model.hub import load_pretrained

    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 255, (48, 48, 4), dtype=np.uint8)
    rgba[..., 3] = np.where(rng.random((48, 48)) < 0.5, 0, 255)  # half the pixels transparent over random colours
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(rgba, "RGBA").save(images / "stamp.png")
    (images / "stamp.txt").write_text("a stamp")
    ours = save_tiny_model(tmp_path / "ours", ["a stamp", "a red circle"])
    foreign = tmp_path / "foreign"  # the same weights as transformers saves them, with its processor's files
    load_pretrained(ours)[0].align.save_pretrained(foreign)
    (foreign / "preprocessor_config.json").write_text((ours / "preprocessor_config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (foreign / name).write_text((ours / name).read_text())
    stamp = Image.open(images / "stamp.png")
    on_white = Image.alpha_composite(Image.new("RGBA", stamp.size, "white"), stamp).convert("RGB")
    for model_dir, rgb in ((ours, on_white), (foreign, stamp.convert("RGB"))):
        assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / model_dir.name / "e"),
                         "--quiet"]) == 0
        got = load(tmp_path / model_dir.name / "e")[0][0]
        model, _, cfg = load_pretrained(model_dir)
        v = cfg.model.vision
        expected = encode_images(model, transforms.eval_transform(rgb, v.resize_size, v.image_size)[None])[0].numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5)
    # the foreign directory's vector is what transformers' own processor and model give
    hf = transformers.AlignModel.from_pretrained(foreign).eval()
    pixels = transformers.AutoImageProcessor.from_pretrained(foreign)(images=stamp.convert("RGB"), return_tensors="pt")
    with torch.no_grad():
        theirs = torch.nn.functional.normalize(hf.get_image_features(**pixels).pooler_output, dim=-1)[0].numpy()
    np.testing.assert_allclose(load(tmp_path / "foreign" / "e")[0][0], theirs, atol=1e-5)


def test_terms_that_cancel_up_to_rounding_are_the_documented_error(model_dir, tmp_path, capsys):
    # Before: `search --text red --minus red` left a 1.1e-8 residual that was normalized into an arbitrary query;
    # `search -k 0` printed an empty table.
    from openalign.index import search

    model, tokenizer, _ = load_pretrained_model(model_dir)
    with pytest.raises(ConfigError, match="the query terms cancel out"):
        search.query_vector(model, tokenizer, search.Query(text="a red circle", minus=("a red circle",)))
    near = np.ones(4, np.float32) / 2
    near[0] += 1e-6  # float rounding of the same text in another batch
    texts = np.stack([np.ones(4, np.float32) / 2, near])[None]
    with pytest.raises(ConfigError, match="cancel out"):  # a float-rounding residual
        search.combine(None, texts, np.array([[1.0, -1.0]], np.float32))
    images = shape_images(tmp_path / "images")
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--text", "red", "-k", "0"]) == 2
    assert "-k 0 must be at least 1" in capsys.readouterr().err


def load_pretrained_model(path):
    from openalign.model.hub import load_pretrained

    return load_pretrained(path)


def test_an_index_that_misses_its_recall_target_says_so_with_what_to_change(tmp_path, capsys):
    # Before: 0.912 against a 0.95 target at nprobe = nlist was reported as if it were fine.
    x = clustered(4_000, 32, 4, seed=9)
    emb = fake_embeddings(tmp_path / "emb", x)
    assert cli.main(["index", str(emb), "--out", str(tmp_path / "idx"), "--kind", "ivf", "--codes", "pq",
                     "--nlist", "8", "--train-per-cell", "64", "--recall", "0.999", "--quiet"]) == 0
    info = json.loads((tmp_path / "idx" / "index.json").read_text())
    assert info["recall_at_10"] < 0.999 and info["params"]["nprobe"] == 8
    err = capsys.readouterr().err
    assert f"recall@10 {info['recall_at_10']:.3f} is below the target 0.999 even at nprobe 8 of nlist 8" in err
    assert "--refine 2" in err and info["warnings"]


def _damage(idx: Path, how: str) -> None:
    files = {"info": idx / "index.json", "faiss": idx / "index.faiss", "meta": idx / "meta.parquet",
             "f16": idx / "vectors-f16.npy"}
    kind, _, target = how.partition(":")
    path = files[target]
    if kind == "delete":
        path.unlink()
    elif kind == "cut":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    elif kind == "garbage":
        path.write_bytes(b"\x00not what it should be\xff" * 8)
    elif kind == "keys":
        path.write_text(json.dumps({"kind": "flat"}))


@pytest.mark.parametrize("how", ["garbage:info", "keys:info", "cut:faiss", "delete:faiss", "garbage:faiss",
                                 "cut:meta", "delete:meta", "cut:f16", "swap:faiss"])
def test_damaged_index_files_are_one_sentence(tmp_path, capsys, how):
    # Before: 9 of 11 damaged index files gave a traceback in `search` / `serve`.
    x = clustered(2_000, 16, 10, seed=11)
    emb = fake_embeddings(tmp_path / "emb", x)
    idx = tmp_path / "idx"
    assert cli.main(["index", str(emb), "--out", str(idx), "--kind", "hnsw", "--refine", "2", "--quiet"]) == 0
    if how == "swap:faiss":  # an index.faiss of another build beside this index.json
        other = fake_embeddings(tmp_path / "other", x[:1_000])
        assert cli.main(["index", str(other), "--out", str(tmp_path / "o"), "--kind", "hnsw", "--quiet"]) == 0
        (idx / "index.faiss").write_bytes((tmp_path / "o" / "index.faiss").read_bytes())
    else:
        _damage(idx, how)
    with pytest.raises(ConfigError) as err:
        opened.load(idx)
    message = str(err.value)
    assert "\n" not in message and ("build the index again" in message or "run `openalign index` again" in message)


def as_pytorch_bin(model_dir: Path, out: Path, nudge: float = 0.0) -> Path:
    """`model_dir` saved as transformers' `pytorch_model.bin` instead of safetensors; `nudge` moves one weight."""
    import shutil

    import torch
    from safetensors.torch import load_file

    shutil.copytree(model_dir, out)
    state = load_file(out / "model.safetensors")
    name = sorted(state)[0]
    state[name] = state[name] + nudge
    torch.save(state, out / "pytorch_model.bin")
    (out / "model.safetensors").unlink()
    return out


def test_models_saved_as_pytorch_bin_differ_in_fingerprint_and_search_refuses_the_other(model_dir, tmp_path, capsys):
    # Before: the fingerprint hashed *.safetensors alone, so two .bin models of different weights were one model.
    from openalign.model.hub import load_pretrained, weights_fingerprint

    first = as_pytorch_bin(model_dir, tmp_path / "first")
    second = as_pytorch_bin(model_dir, tmp_path / "second", nudge=0.01)
    assert load_pretrained(first)[0] is not None  # transformers reads the .bin directory
    assert weights_fingerprint(first) != weights_fingerprint(second)
    assert weights_fingerprint(first) == weights_fingerprint(as_pytorch_bin(model_dir, tmp_path / "copy"))
    images = tmp_path / "images"
    images.mkdir()
    for colour in COLORS:
        shape_image(colour, "circle").save(images / f"{colour}.png")
    assert cli.main(["embed", str(first), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--model", str(second), "--text", "red"]) == 2
    assert "not the model this index was embedded with" in capsys.readouterr().err
    assert cli.main(["search", str(tmp_path / "idx"), "--model", str(first), "--text", "red"]) == 0


def test_a_truncated_tokenizer_json_is_one_sentence_in_embed_search_and_load(model_dir, tmp_path, capsys):
    # Before: json's JSONDecodeError traceback from transformers, in each of the three.
    import shutil

    import openalign

    images = tmp_path / "images"
    images.mkdir()
    shape_image("red", "circle").save(images / "red.png")
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    cut = shutil.copytree(model_dir, tmp_path / "cut")
    (cut / "tokenizer.json").write_bytes((cut / "tokenizer.json").read_bytes()[:300])
    capsys.readouterr()
    for argv in (["embed", str(cut), "--images", str(images), "--out", str(tmp_path / "emb2"), "--quiet"],
                 ["search", str(tmp_path / "idx"), "--model", str(cut), "--text", "red"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "tokenizer files are damaged" in err and err.count("\n") == 1, err
    with pytest.raises(ConfigError, match="tokenizer files are damaged"):
        openalign.load(cut)


def test_a_unit_querys_scores_are_cosines_even_from_8_bit_codes(tmp_path):
    # Before: an image's own score in an IVF index of 8-bit codes read 1.0005.
    from openalign.index.search import nearest

    x = clustered(3_000, 24, 20)
    build_lib.build(fake_embeddings(tmp_path / "emb", x), tmp_path / "idx", build_lib.IndexOptions(kind="ivf"))
    index = opened.load(tmp_path / "idx")
    raw = index.search(x[:300], 1)[0]
    assert raw.max() > 1.0  # the codes overshoot, so this test can tell
    scores = [nearest(index, x[i], 5)[0].score for i in range(300)]
    assert max(scores) == 1.0 and min(scores) > 0.9
    assert nearest(index, 2 * x[0], 1)[0].score > 1.5  # a vector that is not unit is searched as given


def test_search_prints_a_long_caption_on_one_short_line(model_dir, tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    shape_image("red", "circle").save(images / "red.png")
    (images / "red.txt").write_text("a red circle " * 100_000)  # 1.3 MB
    assert cli.main(["embed", str(model_dir), "--images", str(images), "--out", str(tmp_path / "emb"), "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["search", str(tmp_path / "idx"), "--text", "red"]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert len(line.partition("  \"")[2]) == 201 and line.endswith("…\"")  # 200 characters and the closing quote


def test_search_takes_a_loaded_model_as_it_takes_its_directory(model_dir, tmp_path):
    """`openalign.search(..., model=openalign.load(dir))`: the same hits as the directory; before, it read the width
    from the wrong config and failed with an AttributeError."""
    import openalign

    emb, idx = tmp_path / "emb", tmp_path / "idx"
    openalign.embed(model_dir, [str(shape_images(tmp_path / "images"))], emb, progress=False)
    openalign.build_index(emb, idx)
    by_directory = openalign.search(idx, "a red circle", 3, model=model_dir)
    loaded = openalign.load(model_dir, device="cpu")
    by_model = openalign.search(openalign.open_index(idx), "a red circle", 3, model=loaded)
    assert [(h.id, round(h.score, 5)) for h in by_model] == [(h.id, round(h.score, 5)) for h in by_directory]
    other = save_tiny_model(tmp_path / "wide", ["a red circle"], embed_dim=loaded.cfg.model.embed_dim * 2)
    with pytest.raises(ConfigError, match="embeds to .* dimensions, the index holds"):
        openalign.search(idx, "a red circle", 3, model=openalign.load(other, device="cpu"))
