import tarfile

from openalign.data import tars


def test_shards_have_no_pax_header_per_member(tmp_path):
    """A float mtime made Python's tar write a pax header before every member (a third of a small-image
    shard, half of the headers a reader parses); members now carry whole seconds and no pax header."""
    writer = tars.ShardWriter(tmp_path, "s", samples_per_shard=10)
    for i in range(3):
        writer.write(f"k{i}", b"\xff\xd8 not really a jpeg %d" % i, "jpg", f"caption {i}", {"i": i})
    writer.close()
    with tars.TarWriter(tmp_path / "fixed.tar", mtime=0.0) as fixed:  # sharding's reproducible shards
        fixed.write({"__key__": "a", "txt": "x"})
    for path in (tmp_path / "s-000000.tar", tmp_path / "fixed.tar"):
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert members and all(not m.pax_headers and isinstance(m.mtime, int) for m in members)
    samples = list(tars.tar_samples(str(tmp_path / "s-000000.tar")))
    assert [s["txt"] for s in samples] == [b"caption 0", b"caption 1", b"caption 2"]
    assert samples[1]["jpg"] == b"\xff\xd8 not really a jpeg 1"


SAMPLES = [{"__key__": "0a1b", "jpg": b"\xff\xd8 image bytes", "txt": "un chat \u00e9", "json": b'{"texts": ["x"]}'},
           {"__key__": "sub/dir/2c", "png": b"\x89PNG", "txt": "a dog", "json": b"{}", "__url__": "ignored"}]


def test_tar_writer_writes_the_bytes_webdatasets_writer_writes(tmp_path):
    """Shards are written without webdataset (its import imports torch, which every shard worker paid), so they
    are checked against it: the same samples give the same bytes, and webdataset's own reader reads them back."""
    import webdataset

    with tars.TarWriter(tmp_path / "ours.tar", mtime=0.0) as ours:
        for sample in SAMPLES:
            ours.write(sample)
    with webdataset.TarWriter(str(tmp_path / "theirs.tar"), mtime=0) as theirs:
        for sample in SAMPLES:
            theirs.write(dict(sample))
    assert (tmp_path / "ours.tar").read_bytes() == (tmp_path / "theirs.tar").read_bytes()
    read = list(webdataset.WebDataset(str(tmp_path / "ours.tar"), shardshuffle=False))
    assert [(s["__key__"], s["txt"]) for s in read] == [("0a1b", "un chat \u00e9".encode()), ("sub/dir/2c", b"a dog")]


def test_writing_a_shard_imports_no_torch():
    """A shard worker's first task imported torch through webdataset (2 s of a 4 s task, P11)."""
    import subprocess
    import sys

    code = ("import sys, tempfile, pathlib\n"
            "from openalign.data import tars\n"
            "from openalign.pipeline import shard\n"
            "with tars.TarWriter(pathlib.Path(tempfile.mkdtemp()) / 'a.tar') as w:\n"
            "    w.write({'__key__': 'a', 'txt': 'x'})\n"
            "assert 'torch' not in sys.modules and 'webdataset' not in sys.modules, 'imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-500:]
