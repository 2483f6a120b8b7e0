"""Seeds that every process and every run derive alike: a hash of named parts, never Python's salted `hash`."""

from __future__ import annotations

import hashlib

__all__ = ["stable_seed"]


def stable_seed(*parts) -> int:
    """A 64-bit seed of `parts` (their str forms joined by `:`), the same on every machine and Python version."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
