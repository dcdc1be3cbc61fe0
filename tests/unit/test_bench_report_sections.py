"""bench/report.md keeps the sections other bench scripts wrote into it when the main report is redone."""

from __future__ import annotations

from bench.report import kept_sections

ICEBERG = "<!-- iceberg-bench -->\n## Iceberg commit\n| 10^4 | 0.010 s |\n<!-- /iceberg-bench -->\n"


def test_a_marked_section_survives_a_new_report_that_lacks_it() -> None:
    previous = "# onceflow benchmarks\n\nold figures\n\n" + ICEBERG
    assert kept_sections(previous, "# onceflow benchmarks\n\nnew figures\n").strip() == ICEBERG.strip()


def test_a_section_the_new_report_has_is_not_doubled_and_nothing_else_is_kept() -> None:
    assert kept_sections("# old\n\n" + ICEBERG, "# new\n" + ICEBERG) == ""
    assert kept_sections("# old report without sections\n", "# new\n") == ""


def test_cpu_between_two_looks_counts_a_process_that_exits_once() -> None:
    from bench.spark_jobs import cpu_spent

    before = {"executor Python workers": {10: 5.0, 11: 2.0, -1: 1.0}, "driver": {1: 3.0}}
    # Worker 11 ran 0.5 s more, exited and was reaped: its 2.5 s are now under its executor (-1). Worker
    # 10 ran 1 s, worker 12 is new and ran 0.5 s.
    after = {"executor Python workers": {10: 6.0, 12: 0.5, -1: 3.5}, "driver": {1: 3.25}}
    assert cpu_spent(before, after) == {"executor Python workers": 2.0, "driver": 0.25}
