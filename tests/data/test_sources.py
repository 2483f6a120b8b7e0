"""data/sources.py: every layout read into the one item type, and the one skip-and-count decode loop."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from openalign.config import ConfigError
from openalign.data import tars
from openalign.data import sources


@pytest.fixture
def image_dir(tmp_path):
    root = tmp_path / "imgs"
    (root / "val2014").mkdir(parents=True)
    for i, colour in enumerate(["red", "green", "blue"]):
        Image.new("RGB", (50, 40), colour).save(root / "val2014" / f"{i}.jpg")
    (root / "val2014" / "broken.jpg").write_bytes(b"nope")
    return root


def decode_all(collection):
    counter = {}
    return [(item, image.size) for item, image in sources.decoded(collection, counter)], counter


def test_karpathy_json_test_split_with_several_captions(tmp_path, image_dir):
    entries = [{"filepath": "val2014", "filename": f"{i}.jpg", "split": split,
                "sentences": [{"raw": f"caption {j} of {i}", "sentid": 10 * i + j} for j in range(5)]}
               for i, split in enumerate(["test", "train", "test"])]
    entries.append({"filepath": "val2014", "filename": "broken.jpg", "split": "test", "sentences": [{"raw": "x"}]})
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": entries}))
    got, counter = decode_all(sources.items(str(tmp_path / "dataset_coco.json"), str(image_dir)))
    assert [item.texts[0] for item, _ in got] == ["caption 0 of 0", "caption 0 of 2"]
    assert all(len(item.texts) == 5 and size == (50, 40) for item, size in got)
    assert got[1][0].caption_ids == ["20", "21", "22", "23", "24"] and got[1][0].key == "val2014/2.jpg"
    assert got[0][0].path == str((image_dir / "val2014" / "0.jpg").resolve())
    assert counter == {"skipped": 1, "reasons": {"unreadable": 1}}
    assert len(sources.listing(str(tmp_path / "dataset_coco.json"), str(image_dir), "all")) == 4
    with pytest.raises(ConfigError, match="splits are test, train"):
        sources.listing(str(tmp_path / "dataset_coco.json"), str(image_dir), split="val")


def test_caption_tables_group_rows_by_image(tmp_path, image_dir):
    (tmp_path / "caps.csv").write_text("image,caption\nval2014/0.jpg,a red one\nval2014/1.jpg,green\n"
                                       "val2014/0.jpg,another red\n")
    listed = sources.listing(str(tmp_path / "caps.csv"), str(image_dir))
    assert [item.texts for item in listed] == [["a red one", "another red"], ["green"]]
    assert listed[0].caption_ids == ["0.jpg#0", "0.jpg#1"] and listed[0].label == "a red one"
    (tmp_path / "caps.jsonl").write_text(json.dumps({"image": "val2014/2.jpg", "captions": ["blue", "sky"]}) + "\n")
    assert sources.listing(str(tmp_path / "caps.jsonl"), str(image_dir))[0].texts == ["blue", "sky"]
    (tmp_path / "bad.csv").write_text("picture,words\na,b\n")
    with pytest.raises(ConfigError, match="has no image column: none of image, filepath, .* name it with --image-column"):
        sources.listing(str(tmp_path / "bad.csv"), str(image_dir))
    assert sources.listing(str(tmp_path / "bad.csv"), str(image_dir), image_column="picture",
                           text_column="words")[0].texts == ["b"]


def test_class_folders_label_tables_and_multi30k_lists(tmp_path):
    root = tmp_path / "cls"
    for label, colour in (("n01", "red"), ("n02", "blue")):
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 40), colour).save(root / label / f"{i}.jpg")
    (root / "n02" / "1.txt").write_text("a blue square\n")
    listed = sources.listing(str(root))
    assert [(item.key, item.label, item.texts) for item in listed] == [
        ("n01/0.jpg", "n01", []), ("n01/1.jpg", "n01", []), ("n02/0.jpg", "n02", []),
        ("n02/1.jpg", "n02", ["a blue square"])]
    (tmp_path / "labels.csv").write_text("image,label\nn02/0.jpg,n02\nn01/1.jpg,n01\n")
    assert [item.label for item in sources.listing(str(tmp_path / "labels.csv"), str(root))] == ["n02", "n01"]
    (tmp_path / "test_2016_flickr.txt").write_text("n01/0.jpg\nn02/1.jpg\n")
    listed = sources.listing(str(tmp_path / "test_2016_flickr.txt"), str(root))
    assert [(item.key, item.label) for item in listed] == [("n01/0.jpg", "n01/0.jpg"), ("n02/1.jpg", "n02/1.jpg")]
    with pytest.raises(ConfigError, match="no images under"):
        (tmp_path / "empty").mkdir()
        sources.listing(str(tmp_path / "empty"))


def test_shards_a_shard_list_and_skips_counted_by_reason(shapes, tmp_path):
    shards = tars.list_shards(str(shapes["eval"]))
    assert sources.is_shards(str(shapes["eval"])) and sources.listing(str(shapes["eval"])) is None
    (tmp_path / "shards.txt").write_text("\n".join(shards) + "\n")  # a .txt of tars is a shard list, not Multi30k
    assert sources.is_shards(str(tmp_path / "shards.txt"))
    items = list(sources.items(str(tmp_path / "shards.txt")))
    assert len(items) == 24 and all(len(item.texts) == 2 and item.data for item in items)
    assert items[0].key == "s00000" and items[0].name == "s00000" and items[0].meta["texts"] == items[0].texts
    # a sample without any text: kept for indexing, skipped and counted where captions are needed
    bad = tmp_path / "bad.tar"
    with tars.TarWriter(bad) as writer:
        writer.write({"__key__": "a", "jpg": items[0].data})
        writer.write({"__key__": "b", "jpg": b"not an image", "txt": b"broken"})
        writer.write({"__key__": "c", "txt": b"no image"})
    counter = {}
    assert [i.key for i in sources.shard_items(str(bad), counter)] == ["a", "b"]
    assert counter == {"skipped": 1, "reasons": {"no_image": 1}}
    counter = {}
    got = list(sources.decoded(sources.shard_items(str(bad), counter, captionless=False), counter))
    assert [i.key for i, _ in got] == [] and counter["reasons"] == {"no_text": 1, "no_image": 1, "unreadable": 1}


def test_a_pair_table_gives_each_distinct_image_with_its_texts(tmp_path, image_dir):
    red = str(image_dir / "val2014" / "0.jpg")
    pq.write_table(pa.table({"uid": ["u2", "u1", "u3"], "image_key": ["k1", "k1", "k2"], "path": [red, red, red + "x"],
                             "member": pa.array([None, None, None], pa.string()), "text": ["b", "a", "c"]}),
                   tmp_path / "pairs.parquet")
    listed = sources.listing(str(tmp_path / "pairs.parquet"))
    assert [(i.key, i.texts) for i in listed] == [("k1", ["a", "b"]), ("k2", ["c"])]
    got, counter = decode_all(listed)
    assert [i.key for i, _ in got] == ["k1"] and counter["reasons"] == {"missing_file": 1}
    (tmp_path / "x.parquet").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="is not a readable Parquet file"):
        sources.listing(str(tmp_path / "x.parquet"))


def test_a_caption_file_with_one_caption_per_line_gives_each_line(tmp_path):
    # Before: a retrieval `.txt` with five captions was one caption (456 texts instead of 912).
    from PIL import Image

    from openalign.data.sources import listing

    Image.new("RGB", (8, 8), "red").save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square\n\nred, a square\n")
    [item] = listing(str(tmp_path))
    assert item.texts == ["a red square", "red, a square"]


def test_a_tab_separated_csv_is_read_as_tab_separated(tmp_path):
    # Before: a .csv separated by tabs was read by commas: one column, every row wrong.
    from openalign.data.sources import listing
    from openalign.data.tables import sniff_delimiter

    (tmp_path / "t.csv").write_text("image\tcaption\nx.png\ta red, round thing\n")
    assert sniff_delimiter(tmp_path / "t.csv") == "\t"
    [item] = listing(str(tmp_path / "t.csv"))
    assert item.texts == ["a red, round thing"] and item.path.endswith("x.png")


def test_tar_members_are_read_by_name_or_sample_key_from_many_threads_at_once(tmp_path):
    # The service reads thumbnails through this reader now (before: its own tar reader). Before, the reader kept one
    # open TarFile per tar and seeked it for each member: two threads interleaving seek and read got each other's
    # bytes. Now each tar is indexed once into member offsets and every read opens the file afresh.
    import threading

    from openalign.data.sources import _Sources
    from openalign.data.tars import ShardWriter

    blobs = {f"dir/s{i:03d}": bytes([i]) * (1000 + 37 * i) for i in range(60)}
    writer = ShardWriter(tmp_path / "shards", prefix="x")
    for key, data in blobs.items():
        writer.write(key, data, "jpg", "caption", {})
    writer.close()
    [tar] = sorted(str(p) for p in (tmp_path / "shards").glob("*.tar"))
    reader, wrong, barrier = _Sources(), [], threading.Barrier(8)

    def read_all(offset: int) -> None:
        barrier.wait()
        for i in range(len(blobs)):
            key = list(blobs)[(i + offset) % len(blobs)]
            for member in (key, key + ".jpg"):  # a sample key (an index's metadata) or a member name
                if reader.read(tar, member) != blobs[key]:
                    wrong.append(member)

    threads = [threading.Thread(target=read_all, args=(7 * t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    with pytest.raises(FileNotFoundError):
        reader.read(tar, "dir/missing")


def test_a_tar_written_again_is_read_afresh_and_the_offsets_end_with_the_command(tmp_path):
    # Before: the process-wide reader kept a tar's member offsets for ever: a tar written again at the same path
    # (a rerun) was read at the old offsets, and no command's end ever emptied the cache.
    from openalign import host
    from openalign.data.tars import ShardWriter

    def write(blobs: dict) -> str:
        writer = ShardWriter(tmp_path / "shards", prefix="x")
        for key, data in blobs.items():
            writer.write(key, data, "jpg", "caption", {})
        writer.close()
        [tar] = sorted(str(p) for p in (tmp_path / "shards").glob("*.tar"))
        return tar

    with host.command_scope():
        tar = write({"a": b"1" * 100, "b": b"2" * 50})
        assert sources.SOURCES.read(tar, "b") == b"2" * 50
        assert write({"a": b"3" * 3000, "b": b"4" * 70}) == tar
        assert sources.SOURCES.read(tar, "b") == b"4" * 70
        assert tar in sources.SOURCES.tars
    assert sources.SOURCES.tars == {}


def test_a_karpathy_json_of_the_wrong_shape_is_one_sentence_and_bad_entries_are_skipped(tmp_path, image_dir, capsys):
    # Before: {"images": 5} raised TypeError from the loop over its entries.
    for body in ({"images": 5}, {"images": {"a": 1}}, {"images": "x"}):
        (tmp_path / "k.json").write_text(json.dumps(body))
        with pytest.raises(ConfigError, match="is not a Karpathy-split JSON"):
            sources.listing(str(tmp_path / "k.json"), str(image_dir))
    good = {"filepath": "val2014", "filename": "0.jpg", "split": "test", "sentences": [{"raw": "red"}]}
    (tmp_path / "k.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"images": [5, "x", {"split": "test"}, good,
                                                                               {**good, "sentences": 3}]}).encode())
    listed = sources.listing(str(tmp_path / "k.json"), str(image_dir))  # a BOM before the object, too
    assert [item.texts for item in listed] == [["red"]]
    assert "skipped 4 entries" in capsys.readouterr().err


def test_a_fifo_named_like_an_image_is_skipped_and_counted_never_read(tmp_path):
    # Before: a folder's FIFO was dropped from the listing without a count (embed said nothing of it).
    import os

    folder = tmp_path / "pics"
    folder.mkdir()
    Image.new("RGB", (30, 30), "red").save(folder / "a.png")
    os.mkfifo(folder / "b.png")
    got, counter = decode_all(sources.items(str(folder)))
    assert [item.key for item, _ in got] == ["a.png"]
    assert counter == {"skipped": 1, "reasons": {"not_a_file": 1}}
