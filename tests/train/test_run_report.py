"""The run's summary (train/report.py): the headline numbers with chance, then each source's held-out split."""

from openalign import presets
from openalign.train import report


def test_each_source_has_a_line_and_one_never_trained_on_says_so():
    metrics = {"mean_recall": 0.3, "chance_mean_recall": 0.01}
    for name, r10 in (("emoji", 0.4), ("tuxpaint", 0.2)):
        metrics |= {f"{name}/i2t_r10": r10, f"{name}/chance_i2t_r10": 0.05, f"{name}/zeroshot_top1": 0.5,
                    f"{name}/zeroshot_chance_top1": 0.25, f"{name}/n_images": 80}
    cfg = presets.configure("demo", ["data.corpus=emoji+openclipart", "data.eval_corpus=emoji+tuxpaint"])
    assert report.trained_sources(cfg) == ("emoji", "openclipart")
    lines = report.summary_lines(metrics, report.trained_sources(cfg))
    emoji = next(line for line in lines if "emoji alone" in line)
    tux = next(line for line in lines if "tuxpaint alone" in line)
    assert "never trained on" not in emoji and "tuxpaint alone, never trained on:" in tux
    assert "i2t_r10 0.200 (4.0x chance)" in tux and "zeroshot_top1 0.500 (2.0x chance)" in tux and "(80 images)" in tux
    assert report.trained_sources(presets.configure("demo", ["data.train=/x"])) == ()
    assert not any("never" in line for line in report.summary_lines(metrics))  # no training corpora given: no marks
