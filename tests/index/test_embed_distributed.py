"""`openalign embed` under torchrun: two gloo processes give a one-process run's embeddings; reruns with
another world size embed only the missing parts."""

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq

from conftest import COLORS, SHAPES, free_port, save_tiny_model, write_shapes
from openalign.index.embed import MANIFEST, EmbedOptions, embed

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]


def env() -> dict:
    import os

    return os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def outputs(emb) -> dict:
    return {f.name: np.load(f) for f in sorted(emb.glob("*.npy"))}


def test_two_ranks_equal_one_process_and_reruns_resume_with_another_world_size(tmp_path):
    model = save_tiny_model(tmp_path / "model", [f"a {c} {s}" for c in COLORS for s in SHAPES])
    shards = tmp_path / "shards"
    write_shapes(shards, 50, 10, seed=3, corrupt=2)  # 5 shards; 2 samples whose image cannot be decoded
    cut = (shards / "shapes-000004.tar").read_bytes()
    (shards / "shapes-000004.tar").write_bytes(cut[:len(cut) // 2])  # a truncated download
    single = embed(model, [str(shards)], tmp_path / "one", EmbedOptions(texts=True, encode_batch=4), progress=False)
    assert single.complete and single.parts == 5 and single.count < 48
    assert single.skipped == 3 and single.manifest["unusable_samples"] == {"truncated_tar": 1}

    argv = TORCHRUN + ["--master_port", str(free_port()), "-m", "openalign.cli", "embed", str(model), "--images",
                       str(shards), "--out", str(tmp_path / "two"), "--texts", "--encode-batch", "4", "--quiet"]
    done = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads((tmp_path / "two" / MANIFEST).read_text())
    ranks = {json.loads((tmp_path / "two" / f"part-{i:06d}.json").read_text())["rank"] for i in range(5)}
    assert ranks == {0, 1}  # the parts were shared out
    strip = ("resumed_parts",)
    one = single.manifest
    assert {k: v for k, v in two.items() if k not in strip} == {k: v for k, v in one.items() if k not in strip}
    a, b = outputs(tmp_path / "one"), outputs(tmp_path / "two")
    assert a.keys() == b.keys() and any(k.startswith("text-") for k in a)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6)
    for i in range(5):
        assert pq.read_table(tmp_path / "one" / f"meta-{i:06d}.parquet").equals(
            pq.read_table(tmp_path / "two" / f"meta-{i:06d}.parquet"))

    # a rank killed before finishing part 3 (no status) and a lost part 1: one process redoes just those
    (tmp_path / "two" / "part-000003.json").unlink()
    (tmp_path / "two" / "text-000001.npy").unlink()
    kept = (tmp_path / "two" / "part-000000.npy").stat().st_mtime_ns
    again = embed(model, [str(shards)], tmp_path / "two", EmbedOptions(texts=True, encode_batch=4), progress=False)
    assert again.resumed_parts == 3 and again.complete and again.count == single.count
    assert (tmp_path / "two" / "part-000000.npy").stat().st_mtime_ns == kept
    for name, values in outputs(tmp_path / "two").items():
        np.testing.assert_allclose(values, a[name], rtol=0, atol=1e-6)
