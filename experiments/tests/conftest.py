"""The studies' tests share the suite's fixtures: one corpus of coloured shapes per test run (session scope)."""

from tests.conftest import shapes  # noqa: F401 - a fixture, found by its name
