import tarfile

from openalign.data import tars


def test_shards_have_no_pax_header_per_member(tmp_path):
    """A float mtime made Python's tar write a pax header before every member (a third of a small-image
    shard, half of the headers a reader parses); members now carry whole seconds and no pax header."""
    writer = tars.ShardWriter(tmp_path, "s", samples_per_shard=10)
    for i in range(3):
        writer.write(f"k{i}", b"\xff\xd8 not really a jpeg %d" % i, "jpg", f"caption {i}", {"i": i})
    writer.close()
    with tars.tar_writer(tmp_path / "fixed.tar", mtime=0.0) as fixed:  # sharding's reproducible shards
        fixed.write({"__key__": "a", "txt": "x"})
    for path in (tmp_path / "s-000000.tar", tmp_path / "fixed.tar"):
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        assert members and all(not m.pax_headers and isinstance(m.mtime, int) for m in members)
    samples = list(tars.tar_samples(str(tmp_path / "s-000000.tar")))
    assert [s["txt"] for s in samples] == [b"caption 0", b"caption 1", b"caption 2"]
    assert samples[1]["jpg"] == b"\xff\xd8 not really a jpeg 1"
