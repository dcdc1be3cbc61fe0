"""What the peers need, installed on first use into the git-ignored .cache/ folder.

* Spark's Kafka source jars, resolved from Maven Central with ``mvn`` (as infra/kafka.sh resolves the
  broker), for the Structured Streaming peer, spark-avro for its ``from_avro`` variant, delta-spark
  (with delta-storage) for its Delta sink and Hadoop's S3A connector (hadoop-aws of pyspark's Hadoop,
  with the AWS SDK v2 bundle it was built with) for its Parquet in a bucket.
* A separate virtualenv for quix-streams: it requires confluent-kafka < 2.13, while onceflow pins 2.16.1,
  so it cannot share onceflow's environment without changing a pinned version. Its packages are pinned
  in quix-requirements.txt.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = ROOT / ".cache"
SPARK_KAFKA_JARS = CACHE / "spark-kafka"
SPARK_AVRO_JARS = CACHE / "spark-avro"
SPARK_DELTA_JARS = CACHE / "spark-delta"
SPARK_S3A_JARS = CACHE / "spark-s3a"  # one folder per Hadoop version: spark-s3a-<version>
QUIX_VENV = CACHE / "quix-venv"
# Only these artifacts: everything else the Kafka source needs is already in pyspark's jars.
JAR_ARTIFACTS = "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
# spark-avro alone: the avro jars it uses are pyspark's.
AVRO_JAR_ARTIFACTS = "spark-avro_2.13"
# delta-spark and delta-storage: the rest of what they use (antlr4, scala) is in pyspark's jars.
DELTA_JAR_ARTIFACTS = "delta-spark_2.13,delta-storage"
# hadoop-aws, the SDK bundle and the analytics accelerator (hadoop-aws links its input stream factory
# against it): hadoop-common and the rest are pyspark's hadoop-client jars.
S3A_JAR_ARTIFACTS = "hadoop-aws,bundle,analyticsaccelerator-s3"
# The Spark settings a session needs to write Delta tables (the SQL commands and the catalog of delta-spark).
DELTA_SPARK_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def _say(message: str) -> None:
    print(f"[onceflow bench] {message}", file=sys.stderr, flush=True)


def spark_kafka_jars() -> list[Path]:
    """The jar files to pass to spark-submit ``--jars``, resolved once."""
    return _maven_jars("Spark's Kafka source", JAR_ARTIFACTS, SPARK_KAFKA_JARS)


def spark_avro_jars() -> list[Path]:
    """spark-avro's jar (``from_avro``) for spark-submit ``--jars``, resolved once."""
    return _maven_jars("spark-avro", AVRO_JAR_ARTIFACTS, SPARK_AVRO_JARS)


def spark_delta_jars() -> list[Path]:
    """delta-spark's and delta-storage's jars (``format("delta")``) for spark-submit ``--jars``, resolved
    once."""
    return _maven_jars("delta-spark", DELTA_JAR_ARTIFACTS, SPARK_DELTA_JARS)


def pyspark_hadoop_version() -> str:
    """The Hadoop version of the pyspark wheel's jars (``hadoop-client-api-<version>.jar``): hadoop-aws
    must be the same release as the hadoop-common classes it runs against."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    found = sorted(
        m.group(1)
        for j in jars.glob("hadoop-client-api-*.jar")
        if (m := re.fullmatch(r"hadoop-client-api-(.+)\.jar", j.name))
    )
    if len(found) != 1:
        raise RuntimeError(f"expected one hadoop-client-api jar in {jars}, found {found}")
    return found[0]


def spark_s3a_jars() -> list[Path]:
    """hadoop-aws (``s3a://``) of pyspark's Hadoop and the AWS SDK v2 bundle it was built with, for
    spark-submit ``--jars``, resolved once per Hadoop version (the bundle alone is over 600 MB)."""
    version = pyspark_hadoop_version()
    return _maven_jars(
        f"hadoop-aws {version} and its AWS SDK bundle",
        S3A_JAR_ARTIFACTS,
        SPARK_S3A_JARS.with_name(f"{SPARK_S3A_JARS.name}-{version}"),
        {"s3a": True, "hadoop.version": version},
    )


def _maven_jars(
    what: str, artifacts: str, folder: Path, profile: Mapping[str, str | bool] | None = None
) -> list[Path]:
    """``artifacts`` of pom.xml's dependencies, copied from Maven Central into ``folder`` on first use.
    ``profile``: profiles to activate (True) and properties to set (a string), e.g. the s3a profile."""
    done = folder / ".complete"
    if not done.exists():
        _say(f"resolving {what} from Maven Central into {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        options = [
            f"-P{name}" if value is True else f"-D{name}={value}" for name, value in (profile or {}).items()
        ]
        subprocess.run(
            [
                "mvn", "-q", "-B", "-Dstyle.color=never",
                "-s", str(HERE / "maven-settings.xml"),
                "-f", str(HERE / "pom.xml"),
                *options,
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DincludeArtifactIds={artifacts}",
                f"-DoutputDirectory={folder}",
            ],
            check=True,
        )  # fmt: skip
        done.touch()
    return sorted(folder.glob("*.jar"))


def quix_python() -> Path:
    """The quix-streams virtualenv's Python, created and filled from quix-requirements.txt once."""
    python = QUIX_VENV / "bin" / "python"
    done = QUIX_VENV / ".complete"
    if not done.exists():
        _say(f"creating the quix-streams virtualenv {QUIX_VENV}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(QUIX_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-r", str(HERE / "quix-requirements.txt")], check=True
        )
        done.touch()
    return python
