"""What the studies share: the runner of variants over seeds (runner.py), the report's tables and plots
(report.py), and the command line every study's `python -m experiments.NAME` runs (command.py)."""
