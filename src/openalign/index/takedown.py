"""Take-downs: the images `openalign index --delete` removed from every search, kept by what they are, not only by
row id, so that they stay down.

A row id names a row of one build. A rebuild into the same directory (the fix the drift warning recommends) numbers
the rows again, and an `index --add` of an embed output in which a removed image was embedded again gives it a new
id; either would bring a taken-down image back. So each generation's take-downs are a table of the removed images,
`deleted-gN.parquet`:

    id     int64   the row in this index (-1: the image is not in it now; it stays down if it comes back)
    path   string  the image's file (or the tar holding it), as embed recorded it
    key    string  its name in that collection (a tar's sample key)

`openalign index EMB --out INDEX` over an index with take-downs carries them to the new rows of the same images and
says so; `--forget-deletions` drops them, and nothing else does. `index --add` deletes the added rows of a
taken-down image and says so. Indexes written before this kept ids alone (`deleted-gN.npy`): they load as before,
and their images are read from the index's metadata the first time a take-down has to travel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from openalign.outputs import staged

SCHEMA = pa.schema([("id", pa.int64()), ("path", pa.string()), ("key", pa.string())])
PATTERNS = ("deleted-g*.npy", "deleted-g*.parquet")  # every generation's take-down files (and older indexes')


def file_name(generation: int) -> str:
    return f"deleted-g{generation}.parquet"


def empty() -> pa.Table:
    return SCHEMA.empty_table()


def _identity(table: pa.Table) -> pa.Array:
    """One string per image: its path and key (a NUL between: neither holds one)."""
    path = pc.fill_null(table.column("path").cast(pa.string()), "")
    key = pc.fill_null(table.column("key").cast(pa.string()), "")
    return pc.binary_join_element_wise(path, key, "\0")


def read(index_dir: Path, info: dict, meta_file: Path) -> pa.Table:
    """The take-downs of the generation `info` describes (id, path, key); an older index's ids-only file gets its
    images from the generation's metadata, `meta_file`."""
    name = (info.get("deleted") or {}).get("file")
    if not name:
        return empty()
    path = Path(index_dir) / name
    if name.endswith(".npy"):
        return of_rows(np.unique(np.load(path)).astype(np.int64), meta_file)
    return pq.read_table(path).select(SCHEMA.names).cast(SCHEMA)


def of_rows(ids: np.ndarray, meta_file: Path) -> pa.Table:
    """The take-down table of rows `ids` of an index's metadata file (their images' path and key)."""
    rows = pq.read_table(meta_file, columns=["path", "key"]).take(pa.array(ids, pa.int64()))
    return pa.table({"id": pa.array(ids, pa.int64()), "path": rows.column("path").cast(pa.string()),
                     "key": rows.column("key").cast(pa.string())}, schema=SCHEMA)


def ids(index_dir: Path, info: dict) -> np.ndarray:
    """The sorted row ids a generation's searches leave out (what `Loaded.deleted` holds)."""
    name = (info.get("deleted") or {}).get("file")
    if not name:
        return np.zeros(0, np.int64)
    if name.endswith(".npy"):
        found = np.load(Path(index_dir) / name)
    else:
        found = pq.read_table(Path(index_dir) / name, columns=["id"]).column("id").to_numpy()
    found = np.asarray(found, dtype=np.int64)
    return np.unique(found[found >= 0])


def moved(taken: pa.Table, meta_file: Path, first: int = 0) -> pa.Table:
    """`taken` with each image's id in `meta_file` (rows from `first` on; -1 where the image is not there): the
    take-downs carried to a rebuild's rows (`first` 0) or looked for among an add's new rows."""
    if not len(taken):
        return empty()
    where: dict[str, int] = {}
    source = pq.ParquetFile(meta_file)
    wanted = pc.unique(_identity(taken))
    for g in range(source.num_row_groups):
        group = source.read_row_group(g, columns=["id", "path", "key"])
        group = group.filter(pc.greater_equal(group.column("id"), first))
        hit = group.filter(pc.is_in(_identity(group), value_set=wanted))
        for identity, i in zip(_identity(hit).to_pylist(), hit.column("id").to_pylist()):
            where.setdefault(identity, i)
    identities = _identity(taken).to_pylist()
    return taken.set_column(0, "id", pa.array([where.get(i, -1) for i in identities], pa.int64()))


def merged(*tables: pa.Table) -> pa.Table:
    """Take-down tables as one: one row per (id, image), rows of this index first by id, the rest after."""
    table = pa.concat_tables([t.cast(SCHEMA) for t in tables]) if tables else empty()
    rows = table.group_by(["id", "path", "key"]).aggregate([]).select(SCHEMA.names)
    present = rows.filter(pc.greater_equal(rows.column("id"), 0)).sort_by("id")
    absent = rows.filter(pc.less(rows.column("id"), 0))
    # an image that has an id now needs no id-less row beside it
    absent = absent.filter(pc.invert(pc.is_in(_identity(absent), value_set=_identity(present))))
    return pa.concat_tables([present, absent.sort_by([("path", "ascending"), ("key", "ascending")])])


def write(path: Path, table: pa.Table) -> None:
    """The take-down table, written under a temporary name and renamed (a reader never sees half of it)."""
    with staged(path, tmp=path.with_name(path.name + ".tmp")) as tmp:
        pq.write_table(table.cast(SCHEMA), tmp)


def entry(name: str, table: pa.Table) -> dict:
    """index.json's `deleted`: the file, the rows this index leaves out, and every image taken down."""
    count = int(pc.sum(pc.greater_equal(table.column("id"), 0)).as_py() or 0) if len(table) else 0
    return {"file": name, "count": count, "images": len(table)}
