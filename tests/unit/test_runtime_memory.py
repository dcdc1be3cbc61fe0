"""The pure parts of the runtime-memory bench and of the idle-exiting Python daemon: how epochs are spread
over pipelines, when a footprint curve counts as flat, how a run is summarised and reported, and when the
daemon decides it has been idle long enough."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from bench import report
from bench.runtime_memory import (
    GC_SHARE_LIMIT,
    TARGET_MB,
    Point,
    collecting,
    epochs_per_pipeline,
    pace,
    summary,
)
from local_stack.footprint import FLAT_FACTOR, FLAT_MARGINS, Collector, Footprint, halves_growth

from onceflow.engine import python_daemon
from tests.unit.fresh_interpreter import modules_after


def _point(epochs: int, total: float, python: int = 4, jvm: float = 1000.0) -> Point:
    return Point(
        seconds=float(epochs),
        pipelines=epochs // 2,
        epochs=epochs,
        total_mb=total,
        jvm_mb=jvm,
        python_mb=total - jvm,
        python_processes=python,
        python_daemons=python // 2,
        sessions=1,
        pss_mb={"connect": jvm / 2, "executors": jvm / 2, "python": total - jvm},
    )


def test_epochs_are_spread_evenly_and_every_pipeline_runs_one() -> None:
    assert epochs_per_pipeline(3, 10) == [4, 3, 3]
    assert epochs_per_pipeline(100, 1000) == [10] * 100
    assert epochs_per_pipeline(4, 2) == [1, 1, 1, 1]


def test_a_plateau_and_a_sawtooth_are_flat_steady_growth_is_not() -> None:
    margin = FLAT_MARGINS["total_mb"]
    plateau = halves_growth([1000, 1400, 1500, 1500, 1450, 1500], FLAT_FACTOR, margin)
    assert plateau is not None and plateau.flat
    saw = halves_growth([1000, 2000, 1000, 2000, 1000, 2000], FLAT_FACTOR, margin)
    assert saw is not None and saw.flat
    # 86 MB more for every pipeline (two daemons of a session that never go): 40 pipelines double it.
    growing = halves_growth([2000 + 86 * n for n in range(40)], FLAT_FACTOR, margin)
    assert growing is not None and not growing.flat
    assert growing.limit == growing.first_half_peak * FLAT_FACTOR + margin


def test_a_half_without_values_cannot_be_judged() -> None:
    assert halves_growth([math.nan, math.nan, 5, 6], FLAT_FACTOR, 0) is None
    assert halves_growth([1], FLAT_FACTOR, 0) is None


def test_the_summary_takes_start_and_end_at_rest_and_judges_only_the_running_samples() -> None:
    points = [_point(0, 1900), *(_point(e, 2300 + (e % 3) * 50) for e in range(1, 41)), _point(40, 2000)]
    points[-1].python_processes = 0
    found = summary(points, settle_s=75, pipeline_s=[20.0] * 20)
    assert found["start"]["total_mb"] == 1900
    assert found["end"]["total_mb"] == 2000 and found["end"]["python_processes"] == 0
    assert found["peak"]["total_mb"] == 2400
    assert found["flat"] is True and found["total_mb"]["flat"] and found["python_processes"]["flat"]
    assert found["peak_within_target"] is (TARGET_MB >= 2400)


def test_python_processes_that_pile_up_are_not_flat() -> None:
    points = [_point(e, 2000, python=2 * e) for e in range(1, 41)]
    found = summary(points, settle_s=0, pipeline_s=[20.0] * 20)
    assert found["flat"] is False and not found["python_processes"]["flat"]


def test_a_run_that_slows_down_is_not_flat_though_its_memory_is() -> None:
    """The heap at its cap: memory level, each tenth of the pipelines slower (22 s to 55 s a pipeline)."""
    points = [_point(e, 2600) for e in range(1, 41)]
    slowing = [22.0 + 3.3 * (n // 10) for n in range(100)]
    found = summary(points, settle_s=0, pipeline_s=slowing)
    assert found["total_mb"]["flat"] and found["python_processes"]["flat"]
    assert found["flat"] is False and not found["pace_s"]["flat"]
    # One slow pipeline in each tenth is noise, not a trend.
    noisy = [60.0 if n % 10 == 3 else 22.0 for n in range(100)]
    assert pace(noisy) == [22.0] * 10
    assert summary(points, settle_s=0, pipeline_s=noisy)["flat"] is True


def test_a_collector_busy_for_a_fifth_of_the_run_is_not_flat() -> None:
    points = [_point(e, 2600) for e in range(1, 41)]
    before = Collector(gc_s=3.0, full_gcs=1, old_used_mb=200.0, old_capacity_mb=700.0)
    busy = collecting(before, Collector(560.0, 399, 700.0, 700.0), wall_s=2850.0)
    assert busy is not None and busy["full_gcs"] == 398 and busy["old_used_after"] == 1.0
    assert busy["share"] > GC_SHARE_LIMIT and not busy["flat"]
    assert summary(points, 0, [22.0] * 100, busy)["flat"] is False
    quiet = collecting(before, Collector(40.0, 3, 300.0, 700.0), wall_s=2850.0)
    assert quiet is not None and quiet["flat"]
    assert summary(points, 0, [22.0] * 100, quiet)["flat"] is True
    # A probe that could not tell judges nothing: the memory and pace rules stand alone.
    assert collecting(None, before, 100.0) is None
    assert summary(points, 0, [22.0] * 100, None)["flat"] is True


def test_the_report_names_the_size_run_and_never_claims_the_full_target_for_a_smaller_run() -> None:
    points = [_point(0, 1200), *(_point(e, 1400) for e in range(1, 21)), _point(20, 1250)]
    run = {
        "pipelines": 10,
        "epochs": 20,
        "records_per_epoch": 100,
        "wall_s": 600.0,
        "interval_s": 2.0,
        "first_epoch_median_s": 3.0,
        "later_epoch_median_s": 2.0,
        **summary(points, settle_s=75, pipeline_s=[30.0] * 10),
        "pipeline_s": [30.0] * 10,
    }
    rows = dict(
        (target, (measured, verdict)) for target, measured, verdict in report.targets({"runtime_memory": run})
    )
    peak = rows["warm runtime's peak ≤ 1.5 GB (distinct small pipelines)"]
    assert peak == ("1400 MB (10 pipelines, 20 epochs)", "met")
    flat = rows["warm runtime flat over 100 pipelines and 1,000 epochs"]
    assert flat[1] == "flat at 10 pipelines, 20 epochs only"
    text = "\n".join(report._runtime_memory_section({"runtime_memory": run}))
    assert "over 10 distinct pipelines (20 epochs)" in text and "| at rest, after | 1250 |" in text
    assert "garbage collection: not measured" in text
    # A run from before pace and GC were measured is not judged flat on its memory alone.
    del run["pipeline_s"], run["pace_s"]  # neither key was written then
    rows = {target: verdict for target, _, verdict in report.targets({"runtime_memory": run})}
    assert rows["warm runtime flat over 100 pipelines and 1,000 epochs"] == "not judged"


def test_footprint_splits_jvms_from_python() -> None:
    found = Footprint({"master": 190, "connect": 560, "executors": 800, "python": 340}, 8, 4, 8)
    assert found.total_mb == 1890 and found.jvm_mb == 1550


def test_the_daemon_exits_only_after_the_idle_time_without_workers() -> None:
    idle = python_daemon.IdleExit(120)
    start = idle.busy_at
    assert not idle.due(0, start + 119)
    assert not idle.due(2, start + 200)  # workers alive: busy again from now
    assert not idle.due(0, start + 300)
    assert not idle.due(-1, start + 500)  # /proc could not tell: counted as busy
    assert idle.due(0, start + 620)


def test_children_are_counted_from_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert python_daemon._children(os.getpid()) >= 1
    finally:
        child.kill()
        child.wait()
    assert python_daemon._children(2**22 + 1) == -1


def test_the_daemon_preloads_what_imports_and_freezes_it_for_its_forks() -> None:
    """In a fresh interpreter (the freeze is process-wide): a module that is not there is left to the
    worker that needs it, the others are imported, and what exists is out of the collector's reach."""
    code = (
        "import gc, sys; from onceflow.engine import python_daemon as d; "
        "loaded = d.preload(('json', 'onceflow_no_such_module', 'pyarrow')); "
        "print(loaded, 'pyarrow' in sys.modules, gc.get_freeze_count() > 1000)"
    )
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["['json',", "'pyarrow']", "True", "True"]


def test_the_daemon_preloads_the_task_modules_and_nothing_of_the_driver() -> None:
    modules = modules_after("from onceflow.engine import python_daemon\npython_daemon.preload()")
    assert set(python_daemon.PRELOADED) <= set(modules)
    assert not [
        m for m in modules if m.startswith(("sqlalchemy", "onceflow.ledger", "onceflow.protocol.coordinator"))
    ]


def _round(peaks: list[float], measure: str | None, runtime: str) -> dict[str, object]:
    """One throughput round at 10^6 records: its runtime and one epoch per peak."""
    tag = {"memory_measure": measure} if measure else {}
    return {
        "runtime": runtime,
        "files": {"epochs": [{"records": 10**6, "peak_total_mb": mb, **tag} for mb in peaks]},
    }


def test_a_10_6_epochs_peak_is_judged_by_pss_only_and_on_the_warm_runtime() -> None:
    lean = "Spark Connect (sc://x; lean: one JVM, the tasks in the Connect server)"
    judged = report._epoch_memory_targets(
        {"throughput": {"1000000": [_round([1200, 1480, 1870], "pss", lean)]}}
    )
    assert judged[0][1].startswith("1480 MB median, 1870 MB at most (lean runtime") and judged[0][2] == "met"
    cluster = _round([2600, 2800], "pss", "Spark Connect (sc://x)")
    missed = report._epoch_memory_targets({"throughput": {"1000000": [cluster]}})
    assert "master, 2 workers" in missed[0][1] and missed[0][2] == "MISSED"
    resident = report._epoch_memory_targets({"throughput": {"1000000": [_round([900], None, lean)]}})
    assert resident[0][2] == "not judged"
    submit = _round([900], "pss", "spark-submit, one per slice")
    assert report._epoch_memory_targets({"throughput": {"1000000": [submit]}}) == []
