"""pipeline/curation/ranks.py: the pairs at given ranks of a scores table, selected in passes, against a full sort."""

import math
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openalign.pipeline.curation import ranks
from openalign.pipeline.curation.scoring import FINITE


def write_scores(path, uids, scores):
    pq.write_table(pa.table({"uid": pa.array(uids, pa.string()), "score": pa.array(scores, pa.float64())}), path)
    return str(path)


def oracle(uids, scores):
    """Every finite (score, uid) in the order of keeping: a full sort."""
    return sorted(((s, u) for u, s in zip(uids, scores) if math.isfinite(s)), key=lambda r: (-r[0], r[1]))


def hostile_scores(n: int, seed: int = 0):
    """Scores with everything a selection can trip on: a large block of one value, values one ulp apart, NaN and
    infinities (never ranked), the extremes of a double, negative zero, uids of unequal lengths and non-ASCII."""
    rng = np.random.default_rng(seed)
    scores = list(rng.normal(0.2, 0.1, n))
    scores[: n // 4] = [0.25] * (n // 4)  # one score shared by a quarter of the pairs
    scores[n // 4: n // 4 + 20] = [float(np.nextafter(0.5, 1) * 0 + 0.5 + i * np.spacing(0.5)) for i in range(20)]
    scores[-6:] = [float("nan"), float("inf"), -float("inf"), 1.7e308, -1.7e308, -0.0]
    uids = [f"{rng.integers(1 << 62):x}" + ("é" if i % 7 == 0 else "") + ("x" * (i % 3)) for i in range(n)]
    return uids, scores


@pytest.mark.parametrize("collect, bins", [(10_000, 65_536), (3, 4), (1, 2)])
def test_every_rank_is_the_full_sort_s(tmp_path, monkeypatch, collect, bins):
    """With tiny bins and nothing collected the passes narrow and break ties by uid all the way down."""
    monkeypatch.setattr(ranks, "COLLECT", collect)
    monkeypatch.setattr(ranks, "BINS", bins)
    uids, scores = hostile_scores(400)
    source = write_scores(tmp_path / "s.parquet", uids, scores)
    expected = oracle(uids, scores)
    wanted = [1, 2, 50, 99, 100, 101, 150, 250, len(expected) - 1, len(expected), 0, len(expected) + 1]
    with duckdb.connect() as con:
        found = ranks.select(ranks.duckdb_view(con, source, FINITE), wanted)
    assert found == {k: expected[k - 1] for k in wanted if 1 <= k <= len(expected)}


def test_a_tie_larger_than_what_is_collected_is_told_apart_by_uid(tmp_path, monkeypatch):
    monkeypatch.setattr(ranks, "COLLECT", 5)
    uids = [f"{i:04x}" for i in range(300)] + ["00", "0", ""]  # a uid that is another's prefix; an empty one
    scores = [0.5] * len(uids)
    source = write_scores(tmp_path / "s.parquet", uids, scores)
    expected = oracle(uids, scores)
    with duckdb.connect() as con:
        found = ranks.select(ranks.duckdb_view(con, source, FINITE), range(1, len(uids) + 1))
    assert [found[k] for k in range(1, len(uids) + 1)] == expected


def test_no_finite_score_selects_nothing(tmp_path):
    source = write_scores(tmp_path / "s.parquet", ["a", "b"], [float("nan"), float("inf")])
    with duckdb.connect() as con:
        assert ranks.select(ranks.duckdb_view(con, source, FINITE), [1, 2]) == {}


@pytest.mark.skipif(shutil.which("java") is None,
                    reason="the Spark engine needs Java (apt-get install default-jre-headless)")
def test_spark_selects_what_duckdb_does(tmp_path, monkeypatch):
    from openalign.data.engine import spark_session

    monkeypatch.setattr(ranks, "COLLECT", 3)
    monkeypatch.setattr(ranks, "BINS", 8)
    uids, scores = hostile_scores(120, seed=1)
    source = write_scores(tmp_path / "s.parquet", uids, scores)
    wanted = [1, 7, 30, 31, 60, 113]
    spark = spark_session("local[2]")
    found = ranks.select(ranks.spark_view(spark, spark.read.parquet(source), FINITE), wanted)
    expected = oracle(uids, scores)
    assert found == {k: expected[k - 1] for k in wanted}
