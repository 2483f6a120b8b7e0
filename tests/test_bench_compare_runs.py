"""bench/compare_runs.py --curves: the table it prints is what docs/demo.md quotes for seeds over the steps."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "compare_runs.py"


@pytest.fixture(scope="module")
def compare_runs():
    spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(run: Path, evals: dict[int, float], chance: float) -> Path:
    run.mkdir()
    rows = [{"step": 5, "loss": 9.0, "temperature": 0.07}]
    rows += [{"step": step, "eval": {"src/i2t_r10": value, "src/chance_i2t_r10": chance, "mean_recall": 0.1}}
             for step, value in evals.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_curves_table_is_the_mean_and_population_std_over_seeds_per_chance(compare_runs, tmp_path, capsys):
    a = write_run(tmp_path / "a", {10: 0.2, 20: 0.4}, chance=0.02)
    b = write_run(tmp_path / "b", {10: 0.4, 20: 0.4, 30: 0.5}, chance=0.02)  # step 30: not in every seed
    out = tmp_path / "curves.png"
    assert compare_runs.main(["--curves", "--per-chance", "--out", str(out), f"preset={a}+{b}",
                              "--metrics", "src/i2t_r10"]) == 0
    printed = capsys.readouterr().out
    assert "| 10 | 15.0 ± 5.0 |" in printed  # 10x and 20x chance
    assert "| 20 | 20.0 ± 0.0 |" in printed
    assert "| 30 |" not in printed
    assert out.stat().st_size > 0


def test_curves_name_a_missing_metric_in_one_sentence(compare_runs, tmp_path):
    run = write_run(tmp_path / "a", {10: 0.2}, chance=0.02)
    with pytest.raises(SystemExit, match="no 'emoji/i2t_r10' in its evaluations"):
        compare_runs.main(["--curves", "--out", str(tmp_path / "c.png"), f"x={run}", "--metrics", "emoji/i2t_r10"])
