"""Sizes: every memory and size flag's one spelling (`4G`, `512M`, bytes), and each engine's spelling of it."""

from __future__ import annotations

import re

from openalign.config import ConfigError, Rule

__all__ = ["SIZE", "duckdb_size", "format_size", "parse_size", "spark_size"]


def parse_size(text: str | int, flag: str = "a size") -> int:
    """Every memory and size flag's one spelling: '4G', '4g', '4GB', '512M', '1.5GiB', '1000000' -> bytes (K, M, G
    and T are powers of 1024 whatever the case or a trailing B); '' or 0 -> 0 (no limit). Each engine is handed its
    own spelling of the result (`spark_size`, `duckdb_size`)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text or "0", re.IGNORECASE)
    if not match:
        raise ConfigError(f"{flag} {text!r} is not a size; write e.g. 4G, 512M or a number of bytes")
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))


def format_size(size: int) -> str:
    """A size as `parse_size` reads it back: 4G, 512M, 1.5G, 1000 (bytes)."""
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:.4g}{unit}"
    return str(size)


def spark_size(size: int) -> str:
    """Spark's spelling of a size (a JVM memory setting): whole mebibytes, `4096m`."""
    return f"{max(1, size // 2**20)}m"


def duckdb_size(size: int) -> str:
    """DuckDB's spelling of a size: whole mebibytes, `4096MiB` (DuckDB's `GB` is 10^9 bytes: never written)."""
    return f"{max(1, size // 2**20)}MiB"


def is_size(text) -> bool:
    try:
        parse_size(text)
    except ConfigError:
        return False
    return True


SIZE = Rule(is_size, "a size, e.g. 4G, 512M or a number of bytes", also=(int,))
