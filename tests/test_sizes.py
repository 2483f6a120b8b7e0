import pytest

from openalign.config import ConfigError
from openalign.sizes import duckdb_size, format_size, parse_size, spark_size


def test_one_size_parser_for_every_memory_flag_and_each_engines_spelling():
    # Before: index took 4G (powers of 1024), Spark's --spark-memory was handed on as written (4g), filter's
    # --memory-limit went to DuckDB as written (4GB: 4 * 10**9 bytes) or to Spark (where 4GB is not a JVM size).
    for text in ("4G", "4g", "4GB", "4GiB", " 4 G ", "4096M", "4194304K", str(4 * 2**30)):
        assert parse_size(text) == 4 * 2**30, text
    assert parse_size("1.5G") == 3 * 2**29 and parse_size("") == 0 and parse_size(0) == 0
    with pytest.raises(ConfigError, match=r"--memory-limit '4 gigs' is not a size; write e.g. 4G, 512M"):
        parse_size("4 gigs", "--memory-limit")
    assert (spark_size(4 * 2**30), duckdb_size(4 * 2**30)) == ("4096m", "4096MiB")
    assert [format_size(parse_size(t)) for t in ("4G", "512M", "1.5G", "1000")] == ["4G", "512M", "1.5G", "1000"]


def test_spark_memory_is_checked_as_a_size_when_the_engine_is_made():
    from openalign.data.engine import Engine

    assert Engine("spark", memory="4g").memory == "4g"
    with pytest.raises(ConfigError, match="--spark-memory=lots must be a size, e.g. 4G"):
        Engine("spark", memory="lots")
