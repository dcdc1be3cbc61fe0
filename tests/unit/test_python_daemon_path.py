"""The runtime's Python daemon takes Spark's archives off its path where pyspark is installed: each task's
worker calls ``importlib.invalidate_caches()``, which re-reads every archive a module came from."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

from onceflow.engine.python_daemon import drop_spark_archives, spark_archives


def _package(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    return root / name


def _archive(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    return str(path)


def test_only_the_installed_pysparks_own_archives_are_dropped(tmp_path: Path) -> None:
    site = tmp_path / "site"
    home = _package(site, "pyspark")
    _package(site, "py4j")
    inside = [_archive(home / "python/lib/pyspark.zip"), _archive(home / "jars/spark-core.jar")]
    elsewhere = _archive(tmp_path / "deps/user-code.zip")  # a user's archive: never touched
    path = [*inside, elsewhere, str(site)]
    assert spark_archives(path) == inside
    # Without the installed package (a Spark distribution), or without py4j, nothing is dropped.
    assert spark_archives([*inside, elsewhere]) == []
    bare = tmp_path / "bare"
    _package(bare, "pyspark")
    assert spark_archives([_archive(bare / "pyspark/python/lib/pyspark.zip"), str(bare)]) == []


def test_the_daemon_imports_pyspark_installed_and_invalidating_caches_reads_no_archive() -> None:
    """With the path Spark gives a worker, the daemon's pyspark is the installed one, and the call every
    task makes has no archive directory left to read."""
    home = Path(pyspark.__file__).parent
    archives = [*home.glob("python/lib/*.zip"), *home.glob("jars/spark-core_*.jar")]
    assert len(archives) == 3
    code = (
        "import sys, importlib\n"
        "from onceflow.engine import python_daemon\n"
        "assert len(python_daemon.drop_spark_archives()) == 3\n"
        "import pyspark.worker\n"
        "print(pyspark.__file__)\n"
        "importlib.invalidate_caches()\n"
        "print(sum(type(f).__name__ == 'zipimporter' for f in sys.path_importer_cache.values()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, archives))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    imported_from, zip_importers = out.stdout.split()
    assert Path(imported_from).parent == home and int(zip_importers) == 0


def test_nothing_is_dropped_once_pyspark_is_imported() -> None:
    assert "pyspark" in sys.modules  # this test's own import
    assert drop_spark_archives() == []
