import json

from PIL import Image

from openalign.cli import main
from openalign.data.filters import read_keep

CLASSIFIER = '''
import numpy as np

def redness(images):
    return [float(np.asarray(im)[..., 0].mean() / 255) for im in images]
'''


def test_a_user_classifier_drops_flagged_images(tmp_path, capsys):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, colour in enumerate(["red", "blue", "red", "green"]):
        Image.new("RGB", (240, 240), colour).save(folder / f"{i}.png")
        (folder / f"{i}.txt").write_text(f"a {colour} square number {i}")
    (tmp_path / "clf.py").write_text(CLASSIFIER)
    main(["ingest", str(folder), "--out", str(tmp_path / "p.parquet"), "--quiet", "--workers", "1"])
    assert main(["screen", str(tmp_path / "p.parquet"), "--classifier", f"{tmp_path / 'clf.py'}:redness",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    report = json.loads((tmp_path / "s" / "screen_report.json").read_text())
    # the two red squares are one image (same bytes): one image, two pairs removed
    assert (report["removed_images"], report["removed_pairs"], report["scored_images"]) == (1, 2, 3)
    assert len(read_keep(tmp_path / "s")) == 2
    assert main(["screen", str(tmp_path / "p.parquet"), "--classifier", "no_such_module:f", "--out",
                 str(tmp_path / "s2")]) == 2
    assert "cannot import" in capsys.readouterr().err
