"""The report draws what the tasks' figures say, and names no task (eval/report.py, eval/panels.py)."""

import ast
from pathlib import Path

import torch

from openalign.eval import panels, report
from openalign.eval.tasks import TASKS


def test_a_new_tasks_figure_is_drawn_without_touching_the_report(tmp_path):
    # Before: report.plot drew only the panels it named (retrieval, zeroshot, calibration, arithmetic): a new
    # task's figure was dropped without a word.
    drawn = []

    def draw(ax, data):
        drawn.append(data["points"])
        ax.plot(data["points"])

    figures = {"mine": {"draw": draw, "points": [0, 1, 4]}, "data only": {"x": 1}}
    assert report.plot(figures, tmp_path / "a.png") and drawn == [[0, 1, 4]]
    assert (tmp_path / "a.png").stat().st_size > 5_000
    assert not report.plot({"data only": {"x": 1}}, tmp_path / "b.png") and not (tmp_path / "b.png").exists()


def test_the_report_names_no_task():
    source = Path(report.__file__).read_text()
    strings = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)}
    assert not strings & set(TASKS), strings & set(TASKS)


def test_a_confusion_of_one_image_per_class_is_not_drawn():
    assert not panels.confusion_worth_drawing(torch.arange(4))
    assert panels.confusion_worth_drawing(torch.tensor([0, 0, 1]))
