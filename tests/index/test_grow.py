"""Growing an index: embed parts append-only, `index --add` (flat, IVF, IVF shards), `index --delete`, the drift
sentence, a kill -9 mid-add, and a running service that picks the change up."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import save_tiny_model
from openalign import cli
from openalign.config import ConfigError
from openalign.index import build as build_lib
from openalign.index import opened
from openalign.index import grow
from openalign.index.embed import MANIFEST, _write_part


def noise_images(folder: Path, names: list[str], seed: int) -> None:
    """Distinct little images: 8 x 8 colour noise, enlarged."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((24, 24)).save(folder / name)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """1,000 images embedded and indexed (flat), then 500 more whose names sort between the first ones, embedded
    into the same output: (root, model, the first run's manifest, the second's)."""
    root = tmp_path_factory.mktemp("grow")
    model = save_tiny_model(root / "model", ["a picture"])
    noise_images(root / "images", [f"{i:05d}.png" for i in range(0, 2_000, 2)], seed=0)
    embed = ["embed", str(model), "--images", str(root / "images"), "--out", str(root / "emb"), "--part-size", "256",
             "--quiet"]
    assert cli.main(embed) == 0
    first = json.loads((root / "emb" / MANIFEST).read_text())
    assert cli.main(["index", str(root / "emb"), "--out", str(root / "idx"), "--quiet"]) == 0
    mtimes = {p.name: p.stat().st_mtime_ns for p in (root / "emb").glob("part-*.npy")}
    noise_images(root / "images", [f"{i:05d}.png" for i in range(1, 1_000, 2)], seed=1)  # 00001.png, 00003.png...
    assert cli.main(embed) == 0
    second = json.loads((root / "emb" / MANIFEST).read_text())
    assert all((root / "emb" / name).stat().st_mtime_ns == t for name, t in mtimes.items())  # untouched
    return root, model, first, second


def test_a_grown_collection_embeds_only_its_new_images_in_new_parts(grown):
    # Before: parts were positional slices of the sorted walk: 500 new names among the old re-embedded all 6 parts.
    _, _, first, second = grown
    assert sorted(first["parts"], key=int) == ["0", "1", "2", "3"] and first["count"] == 1_000
    assert second["resumed_parts"] == 4 and second["redone"] == {"new": 2} and second["count"] == 1_500
    assert {k: v["rows"] for k, v in second["parts"].items()} == {"0": 256, "1": 256, "2": 256, "3": 232,
                                                                  "4": 256, "5": 244}


def test_add_to_a_flat_index_equals_one_built_from_all_images_at_once(grown, tmp_path, capsys):
    root, model, _, _ = grown
    index = tmp_path / "idx"
    import shutil

    shutil.copytree(root / "idx", index)
    capsys.readouterr()
    assert cli.main(["index", "--add", str(root / "emb"), str(index)]) == 0
    out = capsys.readouterr().out
    assert "added 500 vectors" in out and "1,500 in all, ids 1,000 to 1,499" in out
    assert cli.main(["index", "--add", str(root / "emb"), str(index)]) == 0
    assert "nothing to add" in capsys.readouterr().out
    # from scratch: all 1,500 images embedded in one run (another part layout, so other ids) and indexed
    assert cli.main(["embed", str(model), "--images", str(root / "images"), "--out", str(tmp_path / "all"),
                     "--quiet"]) == 0
    assert cli.main(["index", str(tmp_path / "all"), "--out", str(tmp_path / "scratch"), "--quiet"]) == 0
    added, scratch = opened.load(index), opened.load(tmp_path / "scratch")
    assert added.index.ntotal == scratch.index.ntotal == 1_500
    queries = np.stack([added.vector(i) for i in (0, 5, 999, 1_000, 1_499)])
    (sa, ia), (sb, ib) = added.search(queries, 20), scratch.search(queries, 20)
    np.testing.assert_allclose(sa, sb, rtol=0, atol=1e-6)
    path_a = [[added.meta.row(int(i))["path"] for i in row] for row in ia]
    path_b = [[scratch.meta.row(int(i))["path"] for i in row] for row in ib]
    assert path_a == path_b  # the same images, in the same order
    assert [r["path"] for r in added.meta.take(list(range(1_500))).to_pylist()] == \
        [r["path"] for r in json_rows(root / "emb")]  # metadata appended in id order


def json_rows(emb: Path) -> list[dict]:
    from openalign.index.embed import load_meta

    return load_meta(emb).to_pylist()


def fake_parts(path: Path, vectors: np.ndarray, part: int, start_part: int = 0, images=None) -> Path:
    """Embed-output parts of `vectors`, appended after `start_part` parts already there, with their statuses; row
    r is image `images[r]` (key k{n}, path /x/{n}.jpg; default: numbered on from the rows there)."""
    path.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).is_file() else \
        {"complete": True, "parts": {}, "model": "m", "dim": vectors.shape[1]}
    first = sum(p["rows"] for p in manifest["parts"].values())
    images = list(range(first, first + len(vectors))) if images is None else list(images)
    for j, at in enumerate(range(0, len(vectors), part)):
        i, chunk = start_part + j, vectors[at:at + part]
        rows = [{"key": f"k{images[at + r]}", "path": f"/x/{images[at + r]}.jpg", "caption": "", "width": 1,
                 "height": 1} for r in range(len(chunk))]
        _write_part(path, i, chunk, rows)
        (path / f"part-{i:06d}.json").write_text(json.dumps({"plan": "p", "inputs": f"i{i}", "rows": len(chunk)}))
        manifest["parts"][str(i)] = {"rows": len(chunk), "skipped": 0}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def clustered(n: int, d: int, centers: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = centers[rng.integers(0, len(centers), n)] + 0.5 * rng.normal(size=(n, d))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def exact_recall(index: opened.Loaded, vectors: np.ndarray, queries: np.ndarray) -> float:
    truth = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    return build_lib.recall_at_10(index.search(queries, 10)[1], truth)


@pytest.mark.parametrize("storage", ["memory", "shards"])
def test_add_to_ivf_keeps_the_quantizer_and_the_recall_of_an_index_built_at_once(tmp_path, storage, capsys):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(40, 24))
    old, new = clustered(6_000, 24, centers, 1), clustered(3_000, 24, centers, 2)
    every = np.concatenate([old, new])
    options = ["--kind", "ivf", "--nlist", "40", "--train-per-cell", "39", "--quiet"] + \
        (["--memory", "300K", "--block-rows", "2000"] if storage == "shards" else [])
    fake_parts(tmp_path / "emb", old, 2_000)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), *options]) == 0
    quantizer = opened.load(tmp_path / "idx").info["params"]
    fake_parts(tmp_path / "emb", new, 1_500, start_part=3)
    assert cli.main(["index", "--add", str(tmp_path / "emb"), str(tmp_path / "idx"), *options]) == 0
    fake_parts(tmp_path / "all", every, 2_000)
    assert cli.main(["index", str(tmp_path / "all"), "--out", str(tmp_path / "scratch"), *options]) == 0
    added, scratch = opened.load(tmp_path / "idx"), opened.load(tmp_path / "scratch")
    assert added.info["storage"] == scratch.info["storage"] == storage
    assert added.info["params"]["nlist"] == quantizer["nlist"] and added.info["params"]["nprobe"] == quantizer["nprobe"]
    assert added.index.ntotal == 9_000 and len(added.meta) == 9_000
    if storage == "shards":
        assert len(added.info["shards"]) == 5  # 3 of the build, 2 added beside them
    queries = every[np.random.default_rng(3).choice(9_000, 300, replace=False)]
    mine, theirs = exact_recall(added, every, queries), exact_recall(scratch, every, queries)
    assert mine >= theirs - 0.01, (mine, theirs)
    assert added.info["adds"][0]["rows"] == 3_000 and not added.info["warnings"]
    assert int(np.argmax(every @ added.vector(7_000))) == 7_000  # ids continue: row 7,000 is new[1,000]


def test_an_add_that_drifted_from_the_quantizer_says_so(tmp_path, capsys):
    rng = np.random.default_rng(0)
    old = clustered(6_000, 24, rng.normal(size=(40, 24)), 1)
    drifted = clustered(3_000, 24, 3 * rng.normal(size=(300, 24)), 2)  # far from every cell it was trained on
    options = ["--kind", "ivf", "--nlist", "40", "--train-per-cell", "39", "--codes", "flat", "--quiet"]
    fake_parts(tmp_path / "emb", old, 2_000)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), *options]) == 0
    fake_parts(tmp_path / "emb", drifted, 1_500, start_part=3)
    capsys.readouterr()
    assert cli.main(["index", "--add", str(tmp_path / "emb"), str(tmp_path / "idx"), *options]) == 0
    err = capsys.readouterr().err
    built = opened.load(tmp_path / "idx").info
    assert built["adds"][0]["recall_at_10"] < built["recall_at_10"] - grow.DRIFT
    assert "the added vectors have drifted from the quantizer's training sample" in err and "rebuild it with" in err


def test_an_add_refuses_an_embed_output_whose_indexed_parts_changed(tmp_path):
    vectors = clustered(3_000, 16, np.random.default_rng(0).normal(size=(10, 16)), 1)
    fake_parts(tmp_path / "emb", vectors, 1_000)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--quiet"]) == 0
    status = tmp_path / "emb" / "part-000001.json"
    status.write_text(json.dumps({"plan": "p", "inputs": "changed", "rows": 1_000}))  # embedded again
    with pytest.raises(ConfigError, match="part 1 of .* changed since .* was built"):
        grow.add(tmp_path / "emb", tmp_path / "idx")


@pytest.mark.parametrize("kind", ["flat", "ivf"])
def test_a_deleted_id_never_comes_back(tmp_path, kind):
    vectors = clustered(4_000, 16, np.random.default_rng(0).normal(size=(20, 16)), 1)
    vectors[100:140] = vectors[7]  # 40 copies of row 7: the k best of its query are all deleted ones and copies
    fake_parts(tmp_path / "emb", vectors, 1_000)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--kind", kind, "--quiet"]) == 0
    gone = [7, *range(100, 130), 3_999]
    assert cli.main(["index", "--delete", ",".join(map(str, gone)), str(tmp_path / "idx")]) == 0
    index = opened.load(tmp_path / "idx")
    scores, ids = index.search(vectors[[7, 100, 3_999, 5]], 25)
    assert not set(ids.ravel().tolist()) & set(gone)
    assert set(ids[0, :10].tolist()) == set(range(130, 140))  # the copies left come first
    assert (ids >= 0).all()  # still k results
    with pytest.raises(ConfigError, match="image 7 was deleted"):
        from openalign.index.search import Query, query_vector

        query_vector(None, None, Query(image_id=7), index)
    (tmp_path / "ids.txt").write_text("5\n6\n")  # a file of ids, and a second delete: the sets add up
    assert cli.main(["index", "--delete", str(tmp_path / "ids.txt"), str(tmp_path / "idx")]) == 0
    assert opened.load(tmp_path / "idx").info["deleted"]["count"] == len(gone) + 2
    assert cli.main(["index", "--delete", "4000", str(tmp_path / "idx")]) == 2  # out of range: nothing changes
    assert opened.load(tmp_path / "idx").info["deleted"]["count"] == len(gone) + 2


KILLED_ADD = """
import os, signal, sys
from openalign import cli
calls = [0]
def killing(original):
    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    return call
os.replace, os.unlink = killing(os.replace), killing(os.unlink)  # every rename and every removal
sys.exit(cli.main(["index", "--add", sys.argv[2], sys.argv[3], "--quiet"]))
"""


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".openalign.lock"}


def test_a_kill_9_mid_add_leaves_the_old_index_or_the_new_and_a_rerun_gives_the_same_bytes(tmp_path):
    """An IVF index with float16 copies: every kind of file a generation has (codes, copies, metadata)."""
    import shutil

    vectors = clustered(4_000, 16, np.random.default_rng(0).normal(size=(20, 16)), 1)
    fake_parts(tmp_path / "emb", vectors[:3_000], 1_000)
    base = tmp_path / "base"
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(base), "--kind", "ivf", "--refine", "2",
                     "--quiet"]) == 0
    fake_parts(tmp_path / "emb", vectors[3_000:], 500, start_part=3)
    clean = shutil.copytree(base, tmp_path / "clean")
    assert cli.main(["index", "--add", str(tmp_path / "emb"), str(clean), "--quiet"]) == 0
    want = snapshot(clean)
    counts = []
    for kill_at in range(1, 20):  # before each rename and each removal of the add, in turn
        index = shutil.copytree(base, tmp_path / f"killed-{kill_at}")
        done = subprocess.run([sys.executable, "-c", KILLED_ADD, str(kill_at), str(tmp_path / "emb"), str(index)],
                              capture_output=True, text=True, env=os.environ | {"PYTHONPATH": "src"})
        if done.returncode == 0:
            break  # the add made fewer calls: it ran to the end
        assert done.returncode == -9, done.stderr
        counts.append(opened.load(index).index.ntotal)  # it loads: the old generation, or the new one, whole
        assert cli.main(["index", "--add", str(tmp_path / "emb"), str(index), "--quiet"]) == 0
        assert snapshot(index) == want
    assert set(counts) == {3_000, 4_000} and counts == sorted(counts)  # old until index.json is replaced, then new


def test_a_running_service_sees_an_add_and_a_delete_at_its_next_request(grown, tmp_path):
    import shutil

    from fastapi.testclient import TestClient

    from openalign.serve.app import create_app

    root, _, _, _ = grown
    index = shutil.copytree(root / "idx", tmp_path / "idx")
    client = TestClient(create_app(index))
    first = client.post("/search", json={"image_id": 10, "k": 5}).json()
    assert first["count"] == 1_000 and first["results"][0]["id"] == 10
    assert cli.main(["index", "--add", str(root / "emb"), str(index), "--quiet"]) == 0
    assert client.post("/search", json={"image_id": 1_200, "k": 5}).json()["count"] == 1_500  # no restart
    assert cli.main(["index", "--delete", "10", str(index)]) == 0
    after = client.post("/search", json={"text": "a picture", "k": 1_500}).json()["results"]
    assert len(after) == 1_499 and 10 not in {r["id"] for r in after}
    assert client.post("/search", json={"image_id": 10}).status_code == 400
    assert client.get("/image/10").status_code == 404
    knn = client.post("/knn-service", json={"embedding_input": [float(x) for x in opened.load(index).vector(10)],
                                            "num_images": 3}).json()
    assert 10 not in [r["id"] for r in knn]


@pytest.mark.parametrize("options", [["--kind", "ivf"], ["--kind", "ivf", "--codes", "flat"],
                                     ["--kind", "ivf", "--refine", "2"],
                                     ["--kind", "ivf", "--memory", "300K", "--block-rows", "2000"]])
def test_a_large_k_from_an_ivf_index_is_k_results(tmp_path, options):
    """The tuned nprobe's cells hold a few hundred vectors; k=3,000 probes enough cells for 3,000 (FAISS returns only
    what it probes), per search; a small k keeps the tuned nprobe."""
    vectors = clustered(9_000, 24, np.random.default_rng(0).normal(size=(40, 24)), 1)
    fake_parts(tmp_path / "emb", vectors, 3_000)
    assert cli.main(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--nlist", "60",
                     "--train-per-cell", "39", "--quiet", *options]) == 0
    index = opened.load(tmp_path / "idx")
    nprobe = index.info["params"]["nprobe"]
    assert nprobe * 9_000 / 60 < 3_000
    scores, ids = index.search(vectors[:2], 3_000)
    assert (ids >= 0).all() and len(set(ids[0].tolist())) == 3_000
    truth = np.argsort(-(vectors[:2] @ vectors.T), axis=1)[:, :3_000]
    assert np.mean([len(set(a) & set(b)) / 3_000 for a, b in zip(ids.tolist(), truth.tolist())]) > 0.9
    assert index._probes_for(10) is None


OUTSIDE = {  # index.json entries that name a file outside the index's directory
    "meta, absolute": lambda info, out: info["files"].__setitem__("meta", str(out / "meta.parquet")),
    "index, ../": lambda info, out: info["files"].__setitem__("index", "../outside/index.faiss"),
    "deleted, absolute": lambda info, out: info.__setitem__("deleted", {"file": str(out / "taken.npy"), "count": 1}),
}


@pytest.mark.parametrize("craft", list(OUTSIDE))
def test_an_index_json_naming_an_outside_file_is_refused_and_nothing_outside_is_read_or_removed(
        grown, tmp_path, capsys, craft):
    """A crafted index.json under `index --add`, `index --delete`, `search` and `serve`: one sentence, and the outside
    files are never read or removed (before: --delete unlinked `deleted.file` wherever it was, and a `files.meta`
    elsewhere was loaded from there)."""
    import shutil

    from openalign.serve.catalog import Catalog, parse_specs

    root, model, _, _ = grown
    outside = shutil.copytree(root / "idx", tmp_path / "outside")  # an index's files, as an attacker would plant
    np.save(outside / "taken.npy", np.array([3], np.int64))
    before = snapshot(outside)
    index = shutil.copytree(root / "idx", tmp_path / "idx")
    info = json.loads((index / "index.json").read_text())
    OUTSIDE[craft](info, outside)
    (index / "index.json").write_text(json.dumps(info))
    capsys.readouterr()
    for argv in (["index", "--delete", "9", str(index)], ["index", "--add", str(root / "emb"), str(index), "--quiet"],
                 ["search", str(index), "--text", "a picture", "--model", str(model)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "not a plain file name" in err and err.count("\n") == 1, (argv, err)
    with pytest.raises(ConfigError, match="not a plain file name"):
        Catalog(parse_specs([str(index)]))
    assert snapshot(outside) == before  # nothing outside was removed or changed


def found_keys(index_dir: Path, queries: np.ndarray, k: int = 20) -> set[str]:
    index = opened.load(index_dir)
    ids = index.search(queries, k)[1]
    return {row["key"] for row in index.meta.take([int(i) for i in ids.ravel() if i >= 0]).to_pylist()}


def test_a_take_down_survives_a_rebuild_a_reordered_rebuild_and_an_add(tmp_path, capsys, monkeypatch):
    # Before: `index --delete` then `openalign index EMB --out INDEX` (the rebuild the drift warning recommends)
    # dropped the deletions silently and every deleted image came back.
    vectors = clustered(3_000, 16, np.random.default_rng(0).normal(size=(20, 16)), 1)
    fake_parts(tmp_path / "emb", vectors, 1_000)
    idx = str(tmp_path / "idx")
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet"]) == 0
    gone = list(range(100, 140))
    gone_keys = {f"k{i}" for i in gone}
    assert cli.main(["index", "--delete", ",".join(map(str, gone)), idx]) == 0
    assert not found_keys(idx, vectors[gone]) & gone_keys
    capsys.readouterr()
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet"]) == 0  # a rebuild in place
    assert "kept the 40 images taken down" in capsys.readouterr().out
    assert not found_keys(idx, vectors[gone]) & gone_keys
    assert opened.load(idx).info["deleted"]["count"] == 40
    # the same images in another order (other ids), built into the same directory
    order = np.random.default_rng(2).permutation(3_000)
    fake_parts(tmp_path / "shuffled", vectors[order], 1_000, images=order)
    assert cli.main(["index", str(tmp_path / "shuffled"), "--out", idx, "--quiet"]) == 0
    index = opened.load(idx)
    assert sorted(index.meta.take(index.deleted.tolist()).column("key").to_pylist()) == sorted(gone_keys)
    assert not found_keys(idx, vectors[gone]) & gone_keys
    # an add whose new part holds taken-down images again (embedded once more) keeps them out
    fake_parts(tmp_path / "shuffled", vectors[gone[:5]], 1_000, start_part=3, images=gone[:5])
    capsys.readouterr()
    assert cli.main(["index", "--add", str(tmp_path / "shuffled"), idx, "--quiet"]) == 0
    assert "5 of the added rows are images taken down before" in capsys.readouterr().out
    assert opened.load(idx).index.ntotal == 3_005
    assert not found_keys(idx, vectors[gone]) & gone_keys
    # a rebuild killed after it removed index.json, then run again: still down
    from openalign.index import build as owner
    from conftest import run_killed

    run_killed(monkeypatch, owner, "write_json", ["index", str(tmp_path / "emb"), "--out", idx, "--quiet"])
    assert not (Path(idx) / "index.json").exists()
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet"]) == 0
    assert not found_keys(idx, vectors[gone]) & gone_keys
    # only an explicit --forget-deletions brings them back
    capsys.readouterr()
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet", "--forget-deletions"]) == 0
    assert "dropped the 40 take-downs" in capsys.readouterr().out
    assert found_keys(idx, vectors[gone]) >= gone_keys
    assert "deleted" not in opened.load(idx).info


def test_delete_ids_are_ids_a_file_is_at_file_and_a_repeat_changes_nothing(tmp_path, capsys, monkeypatch):
    vectors = clustered(1_000, 8, np.random.default_rng(0).normal(size=(5, 8)), 1)
    fake_parts(tmp_path / "emb", vectors, 1_000)
    idx = str(tmp_path / "idx")
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet"]) == 0
    monkeypatch.chdir(tmp_path)
    Path("7").write_text("8\n9\n")  # before: `--delete 7` read this file and deleted 8 and 9
    assert cli.main(["index", "--delete", "7", idx]) == 0
    assert opened.load(idx).deleted.tolist() == [7]
    assert cli.main(["index", "--delete", "@7", idx]) == 0
    assert opened.load(idx).deleted.tolist() == [7, 8, 9]
    generation = opened.read_info(Path(idx))["generation"]
    capsys.readouterr()
    assert cli.main(["index", "--delete", "8,9", idx]) == 0  # deleted already: no new generation
    assert "nothing changed" in capsys.readouterr().out
    assert opened.read_info(Path(idx))["generation"] == generation
    for spec, says in (("99999999999999999999999", "no id 99999999999999999999999"), ("@missing", "no file"),
                       ("x,y", "takes ids")):
        assert cli.main(["index", "--delete", spec, idx]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_add_with_its_arguments_swapped_or_an_ignored_out_is_one_sentence(tmp_path, capsys):
    # Before: swapped arguments said the embed output "is not an `openalign index` output"; --out was ignored.
    vectors = clustered(1_000, 8, np.random.default_rng(0).normal(size=(5, 8)), 1)
    fake_parts(tmp_path / "emb", vectors, 1_000)
    idx = str(tmp_path / "idx")
    assert cli.main(["index", str(tmp_path / "emb"), "--out", idx, "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["index", "--add", idx, str(tmp_path / "emb")]) == 2
    assert "the order is `openalign index --add EMB INDEX`" in capsys.readouterr().err
    assert cli.main(["index", "--add", str(tmp_path / "emb"), idx, "--out", str(tmp_path / "other")]) == 2
    assert "--out" in capsys.readouterr().err and not (tmp_path / "other").exists()
