"""pipeline/curation/semdedup.py: SemDeDup's rule within k-means cells of image embeddings, against a brute force of it."""

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from conftest import save_tiny_model
from openalign.cli import main
from openalign.data.pairs import read_keep
from openalign.pipeline.curation.semdedup import SemDedupOptions, cluster_removals, semdedup


def brute_force(vectors: np.ndarray) -> tuple[list[float], list[int]]:
    """Each row's highest cosine to a row before it, and which row, one pair at a time."""
    best, before = [-np.inf], [-1]
    for j in range(1, len(vectors)):
        sims = [float(vectors[i] @ vectors[j]) for i in range(j)]
        before.append(int(np.argmax(sims)))
        best.append(max(sims))
    return best, before


def unit(v):
    return v / np.linalg.norm(v)


def planted(seed: int = 0) -> np.ndarray:
    """40 random directions in 16-d, then near-copies of some of them and a chain a ~ b ~ c with a, c apart."""
    rng = np.random.default_rng(seed)
    base = [unit(rng.normal(size=16)) for _ in range(40)]
    copies = [unit(base[i] + 0.05 * rng.normal(size=16)) for i in (3, 3, 17, 29)]
    a, side = unit(rng.normal(size=16)), rng.normal(size=16)
    side = unit(side - (side @ a) * a)
    chain = [a, unit(a + 0.25 * side), unit(a + 0.5 * side)]  # a·b and b·c ~ 0.97, a·c ~ 0.89
    rows = np.array(base + copies + chain, dtype=np.float32)
    return rows[rng.permutation(len(rows))]


@pytest.mark.parametrize("block", [1, 3, 1024])
def test_each_row_s_highest_cosine_to_an_earlier_row_is_the_brute_force_s(block):
    vectors = planted()
    best, before = cluster_removals(vectors, block=block)
    want_best, want_before = brute_force(vectors)
    assert np.allclose(best[1:], want_best[1:], atol=1e-6) and best[0] == -np.inf
    assert list(before) == want_before


def test_a_chain_loses_both_later_links_though_its_ends_are_apart():
    """The paper's rule: c goes for its cosine to b, although b itself went (a greedy pass would keep c)."""
    rng = np.random.default_rng(0)
    a, side = unit(rng.normal(size=8)), rng.normal(size=8)
    side = unit(side - (side @ a) * a)  # orthogonal to a
    b, c = unit(a + 0.25 * side), unit(a + 0.5 * side)
    best, before = cluster_removals(np.array([a, b, c], dtype=np.float32))
    eps = 0.05
    assert a @ c < 1 - eps < min(a @ b, b @ c)
    assert list(best[1:] > 1 - eps) == [True, True] and list(before) == [-1, 0, 1]


# ---------------------------------------------------------------------------------------------- the stage

def picture(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize((96, 72), Image.NEAREST)


def make_corpus(root):
    folder = root / "images"
    folder.mkdir()
    for i in range(24):
        picture(i).save(folder / f"p{i:02d}.png")
        (folder / f"p{i:02d}.txt").write_text(f"picture {i}")
    for n, i in enumerate((2, 5, 5, 11)):  # near-copies: the same picture at another size (another image key)
        picture(i).resize((100 + 4 * n, 75 + 3 * n)).save(folder / f"c{n}_of_{i:02d}.png")
        (folder / f"c{n}_of_{i:02d}.txt").write_text(f"a copy of picture {i}")
    assert main(["ingest", str(folder), "--out", str(root / "pairs.parquet"), "--quiet", "--workers", "1"]) == 0
    save_tiny_model(root / "model", ["picture copy"])
    return root / "pairs.parquet", root / "model"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("semdedup"))


def independent_embeddings(pairs, model_dir) -> dict[str, np.ndarray]:
    from openalign.data import images, sources
    from openalign.data.transforms import vision_transform
    from openalign.model.encode import encode_images, load_for_inference

    model, _, cfg = load_for_inference(model_dir, "cpu")
    transform = vision_transform(cfg.model.vision)
    found = {}
    for row in pq.read_table(pairs).to_pylist():
        pixels = transform(images.load_rgb(sources.read_bytes(row["path"], row["member"])))
        found[row["image_key"]] = encode_images(model, pixels[None])[0].numpy()
    return found


@pytest.mark.parametrize("keep", ["hard", "easy"])
def test_removals_are_the_rule_applied_to_each_cell_and_the_copies_go(corpus, tmp_path, keep):
    pairs, model = corpus
    options = SemDedupOptions(model=str(model), eps=0.01, clusters=4, keep=keep, images_per_task=7,
                              clusters_per_task=3, workers=1)
    result = semdedup(pairs, tmp_path / "out", options, progress=False)
    cells = pq.read_table(tmp_path / "out" / "clusters.parquet").to_pylist()
    assert result.images == 28 and len(cells) == 28 and result.cells == 4
    vectors = independent_embeddings(pairs, model)
    removed = set()
    for cell in {c["cluster"] for c in cells}:
        members = [c for c in cells if c["cluster"] == cell]
        sign = 1 if keep == "hard" else -1  # hard: the farthest from the centroid (lowest cosine) first
        members.sort(key=lambda c: (sign * c["centroid_similarity"], c["image_key"]))
        best, before = brute_force(np.stack([vectors[c["image_key"]] for c in members]))
        for member, score, earlier in zip(members, best, before):
            if score > 1 - options.eps:
                removed.add(member["image_key"])
                assert member["duplicate_of"] == members[earlier]["image_key"]
                assert member["similarity"] == pytest.approx(score, abs=1e-5)
    assert {c["image_key"] for c in cells if c["removed"]} == removed and result.removed_images == len(removed)
    table = pq.read_table(pairs).to_pylist()
    copies = {r["image_key"] for r in table if "_of_" in r["path"]}
    gone = {r["path"].rsplit("/", 1)[1] for r in table if r["image_key"] in removed}
    assert len(gone) == 4 and copies <= removed | {c["duplicate_of"] for c in cells if c["removed"]}, gone
    family = {r["image_key"]: r["path"].rsplit("/", 1)[1][-6:-4] for r in table}  # p05.png, c1_of_05.png: "05"
    assert all(family[c["image_key"]] == family[c["duplicate_of"]] for c in cells if c["removed"])
    assert read_keep(tmp_path / "out") == sorted(r["uid"] for r in table if r["image_key"] not in removed)
    report = json.loads((tmp_path / "out" / "semdedup_report.json").read_text())
    assert report["removed_pairs"] == len(removed) and report["examples"][0]["similarity"] > 0.99
    assert sum(c["images"] for c in report["largest_cells"]) == 28
    assert (tmp_path / "out" / "semdedup_report.png").stat().st_size > 0


@pytest.mark.parametrize("flags, message", [
    ([], "--model"),
    (["--model", "MODEL", "--eps", "0"], "--eps 0.0 must be between 0 and 2"),
    (["--model", "MODEL", "--clusters", "-1"], "--clusters -1 must be at least 0"),
    (["--model", "nowhere"], "is not a directory"),
])
def test_bad_options_are_one_sentence(corpus, tmp_path, capsys, flags, message):
    pairs, model = corpus
    flags = [str(model) if f == "MODEL" else f for f in flags]
    assert main(["semdedup", str(pairs), "--out", str(tmp_path / "out"), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(shutil.which("java") is None,
                    reason="the Spark engine needs Java (apt-get install default-jre-headless)")
def test_spark_removes_what_the_local_engine_does(corpus, tmp_path):
    from openalign.data.engine import Engine

    pairs, model = corpus
    options = SemDedupOptions(model=str(model), eps=0.01, clusters=4, images_per_task=7, clusters_per_task=3)
    local = semdedup(pairs, tmp_path / "local", options, progress=False)
    spark = semdedup(pairs, tmp_path / "spark", options, progress=False, engine=Engine("spark", "local[2]", retries=2))
    assert read_keep(tmp_path / "local") == read_keep(tmp_path / "spark") and local.removed_images > 0
    assert pq.read_table(tmp_path / "local" / "clusters.parquet").to_pylist() == pq.read_table(
        tmp_path / "spark" / "clusters.parquet").to_pylist()
    differ = ("engine", "seconds", "keep", "clusters_file")
    assert {k: v for k, v in local.report.items() if k not in differ} == {
        k: v for k, v in spark.report.items() if k not in differ}


def test_the_keep_list_composes_with_shard_and_data_keep(corpus, tmp_path):
    from openalign.data.pairs import build_keep_index

    pairs, model = corpus
    assert main(["semdedup", str(pairs), "--model", str(model), "--out", str(tmp_path / "s"), "--quiet", "--eps",
                 "0.01", "--clusters", "4"]) == 0
    assert main(["shard", str(pairs), "--keep", str(tmp_path / "s"), "--out", str(tmp_path / "shards"), "--quiet",
                 "--image-size", "32"]) == 0
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["n_samples"] == 24  # 28 images, 4 gone
    assert Path(build_keep_index([str(tmp_path / "s")], tmp_path / "index")).is_file()


def test_a_killed_semdedup_leaves_no_keep_list_and_resumes_its_finished_jobs(corpus, tmp_path, monkeypatch):
    from conftest import run_killed
    from openalign.pipeline import runner  # the runner writes every keep-list and its report

    pairs, model = corpus
    args = ["semdedup", str(pairs), "--model", str(model), "--out", str(tmp_path / "out"), "--quiet", "--eps", "0.01",
            "--clusters", "4", "--clusters-per-task", "3", "--images-per-task", "7", "--workers", "1"]
    run_killed(monkeypatch, runner, "write_keep_without_images", args)  # every pass done, then killed
    assert not (tmp_path / "out" / "semdedup_report.json").exists()
    assert main(args) == 0
    report = json.loads((tmp_path / "out" / "semdedup_report.json").read_text())
    assert report["resumed_tasks"] == 4 + 4 + 2 and report["removed_images"] == 4  # embed, assign, cells


def test_images_whose_vectors_are_nan_or_zero_are_never_clustered_and_stay(corpus, tmp_path, monkeypatch, capsys):
    """Before: faiss's k-means raised `RuntimeError` on a NaN vector (a traceback); now such an image is left out
    of the clusters, kept (nothing decided it), and counted; a model with no finite vector at all is one sentence."""
    from conftest import poison
    from openalign.pipeline.curation import semdedup as module

    pairs, model = corpus
    real = module.embed_blobs

    def some_unusable(*args, **kwargs):
        embeds, ok = real(*args, **kwargs)
        embeds = embeds.copy()
        embeds[::3] = np.nan
        embeds[1::5] = 0.0
        return embeds, ok

    monkeypatch.setattr(module, "embed_blobs", some_unusable)
    options = SemDedupOptions(model=str(model), eps=0.01, clusters=2, images_per_task=7, workers=1)
    result = semdedup(pairs, tmp_path / "out", options, progress=False)
    clustered = {c["image_key"] for c in pq.read_table(tmp_path / "out" / "clusters.parquet").to_pylist()}
    unusable = result.report["unusable_vectors"]
    assert unusable > 0 and len(clustered) == 28 - unusable  # the 28 images, less those left out
    kept = set(read_keep(tmp_path / "out"))
    table = pq.read_table(pairs).to_pylist()
    assert {r["uid"] for r in table if r["image_key"] not in clustered} <= kept  # never removed
    monkeypatch.undo()
    bad = poison(shutil.copytree(model, tmp_path / "nan"), "vision_model.embeddings")
    assert main(["semdedup", str(pairs), "--model", str(bad), "--out", str(tmp_path / "all"), "--clusters", "2",
                 "--workers", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "gives none of them a finite vector" in err and "Traceback" not in err


def test_the_survivor_flag_is_which_to_keep_and_the_old_keep_still_works_with_a_note(capsys):
    # --keep names a keep-list folder in shard and card; here it was the survivor choice (issue 84)
    from openalign.cli.main import build_parser
    from openalign.flags import options_from

    parser = build_parser("semdedup")
    base = ["semdedup", "p.parquet", "--out", "o"]
    assert options_from(parser.parse_args(base), SemDedupOptions).keep == "hard"
    assert options_from(parser.parse_args(base + ["--which-to-keep", "easy"]), SemDedupOptions).keep == "easy"
    assert "deprecated" not in capsys.readouterr().err
    assert options_from(parser.parse_args(base + ["--keep", "easy"]), SemDedupOptions).keep == "easy"
    assert "note: --keep is deprecated and will be removed; use --which-to-keep" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(base + ["--keep", "medium"])  # its choices are the new flag's
    assert "invalid choice: 'medium'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["semdedup", "--help"])
    shown = capsys.readouterr().out
    assert "--which-to-keep {hard,easy}" in shown and "--keep" not in shown


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.skipif(
    shutil.which("java") is None, reason="the Spark engine needs Java (apt-get install default-jre-headless)"))])
def test_the_k_means_sample_is_each_image_whose_seeded_hash_falls_under_the_fraction(tmp_path, engine):
    """Drawn on the engine from the embedding files (before: every image key sorted in one Python list on the
    driver, and every embedding file read there), the same images on both engines and in Python."""
    import pyarrow as pa

    from openalign.data.engine import Engine
    from openalign.pipeline.curation import semdedup as lib

    rng = np.random.default_rng(0)
    files, vectors = [], {}
    for f in range(3):
        keys = [f"{f}-{i:03d}" for i in range(200)]
        block = rng.normal(size=(200, 4)).astype(np.float32)
        vectors.update(zip(keys, block))
        path = tmp_path / f"embeds-{f}.parquet"
        pq.write_table(pa.table({"image_key": keys, "embedding": lib._vectors(block)}), path)
        files.append(str(path))
    run = Engine("spark", "local[2]") if engine == "spark" else Engine(workers=1)
    sample = lib._sample(files, 600, 60, 7, run, tmp_path / "work")
    bound = lib.DRAWS * 60 // 600
    chosen = sorted(k for k in vectors if lib.sample_draw(7, k) < bound)
    assert 30 < len(chosen) < 90 and sample.shape == (len(chosen), 4)
    assert np.array_equal(sample, np.stack([vectors[k] for k in chosen]))
    assert len(lib._sample(files, 600, 600, 7, run, tmp_path / "work")) == 600  # a cap of every image: all of them
    other = lib._sample(files, 600, 60, 8, run, tmp_path / "work")
    assert not np.array_equal(other[: min(len(other), len(sample))], sample[: min(len(other), len(sample))])


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.skipif(
    shutil.which("java") is None, reason="the Spark engine needs Java (apt-get install default-jre-headless)"))])
def test_the_shuffle_puts_each_cell_s_images_in_its_own_folder(tmp_path, engine):
    """A cell's job reads its folder and nothing else (before: every assign job wrote a file per group of cells)."""
    import pyarrow as pa

    from openalign.data.engine import Engine
    from openalign.pipeline.curation import semdedup as lib

    rng = np.random.default_rng(1)
    assigned, expected = [], {}
    for f in range(3):
        cells = rng.integers(0, 5, 40)
        keys = [f"{f}-{i:02d}" for i in range(40)]
        block = rng.normal(size=(40, 3)).astype(np.float32)
        pq.write_table(pa.table({"image_key": keys, "cluster": pa.array(cells, pa.int64()),
                                 "centroid_similarity": rng.random(40), "embedding": lib._vectors(block)}),
                       tmp_path / f"assign-{f}.parquet")
        assigned.append(str(tmp_path / f"assign-{f}.parquet"))
        for key, cell, vector in zip(keys, cells, block):
            expected.setdefault(int(cell), {})[key] = vector
    run = Engine("spark", "local[2]") if engine == "spark" else Engine(workers=1)
    lib.shuffle_cells(assigned, tmp_path / "cells", run, tmp_path / "work")
    for cell, members in expected.items():
        table = pq.read_table(tmp_path / "cells" / f"cell={cell}", partitioning=None)
        assert set(table.column("cluster").to_pylist()) == {cell}
        found = dict(zip(table.column("image_key").to_pylist(), lib._matrix(table.column("embedding"))))
        assert found.keys() == members.keys() and all(np.array_equal(found[k], members[k]) for k in members)


def test_the_cell_count_follows_the_images_unless_given():
    from openalign.pipeline.curation.semdedup import MAX_AUTO_CLUSTERS, cell_count

    assert cell_count(0, 28) == 1 and cell_count(0, 1_000_000) == 100 and cell_count(7, 10**9) == 7
    assert cell_count(0, 160_000_000) == 16_000 and cell_count(0, 10**12) == MAX_AUTO_CLUSTERS
