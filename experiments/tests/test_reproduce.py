"""experiments/reproduce.py: the tables a report commits to, and the check against them."""

import pytest

from experiments import reproduce

REPORT = """# a study

| variant | mean recall | wall (min) | ms / query |
|---|---|---|---|
| **a** | 0.088 | 1.3 | 2.50 |

text between tables

| width | residual |
|---|---|
| 4 | 0.918 |
"""


def test_tables_are_the_report_s_rows_with_wall_clock_columns_blanked():
    assert reproduce.tables(REPORT) == ["| variant | mean recall | … | … |", "|---|---|---|---|",
                                        "| **a** | 0.088 | … | … |", "| width | residual |", "|---|---|",
                                        "| 4 | 0.918 |"]
    slower = REPORT.replace("| 1.3 | 2.50 |", "| 9.9 | 7.00 |")
    assert reproduce.tables(slower) == reproduce.tables(REPORT)
    assert reproduce.tables(REPORT.replace("0.918", "0.919")) != reproduce.tables(REPORT)


def test_a_changed_digit_is_shown_beside_the_committed_row(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "EXPECTED", tmp_path)
    assert reproduce.compare("s", reproduce.tables(REPORT)) == [
        f"no committed table: {tmp_path / 's-quick.md'} (run with --record to write it)"]
    reproduce.record("s", reproduce.tables(REPORT))
    assert reproduce.compare("s", reproduce.tables(REPORT)) == []
    diff = reproduce.compare("s", reproduce.tables(REPORT.replace("0.918", "0.919")))
    assert [line for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++")] == [
        "-| 4 | 0.918 |", "+| 4 | 0.919 |"]


def test_a_reproduction_trains_afresh_into_a_new_folder(tmp_path, capsys):
    (tmp_path / "pmi").mkdir()
    with pytest.raises(SystemExit) as refused:
        reproduce.main(["--out", str(tmp_path), "--only", "pmi"])
    assert refused.value.code == 2 and "already exists" in capsys.readouterr().err


def test_the_pmi_study_reproduces_its_committed_table_to_the_digit(tmp_path, capsys):
    assert reproduce.main(["--out", str(tmp_path), "--only", "pmi"]) == 0
    assert "pmi: reproduces its 10 table rows to the digit" in capsys.readouterr().out


def test_a_recorded_table_names_the_machine_it_was_made_with(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "EXPECTED", tmp_path)
    reproduce.record("demo", ["| a |", "|---|", "| 1 |"])
    assert reproduce.recorded_on("demo") == reproduce.machine() and "threads" in reproduce.machine()
    assert reproduce.compare("demo", ["| a |", "|---|", "| 1 |"]) == []  # the stamp is no table row
    assert reproduce.recorded_on("absent") == ""
