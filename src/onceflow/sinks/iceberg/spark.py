"""Spark SQL settings that read an Iceberg sink's tables through Iceberg's own JdbcCatalog.

pyiceberg's SQL catalog keeps its tables in the same two tables (``iceberg_tables``,
``iceberg_namespace_properties``) that Iceberg's Java ``JdbcCatalog`` reads, so Spark with the Iceberg
Spark runtime (``infra/iceberg.sh path``) sees exactly the snapshots onceflow committed. Used by the
example's query and the tests; nothing here runs in a Spark task.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from onceflow import redact
from onceflow.errors import ConfigError


def jdbc_settings(sql_uri: str) -> dict[str, str]:
    """JdbcCatalog's ``uri`` (and user, password) for a pyiceberg SQL catalog's SQLAlchemy URL."""
    if sql_uri.startswith("sqlite:///"):
        return {"uri": "jdbc:sqlite:/" + sql_uri.removeprefix("sqlite:///").lstrip("/")}
    parts = urlsplit(sql_uri)
    if not parts.scheme.startswith("postgresql"):
        raise ConfigError(
            f"catalog uri {redact.url(sql_uri)!r}: Spark reads SQL catalogs in SQLite or PostgreSQL only"
        )
    settings = {"uri": f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"}
    if parts.username:
        settings["jdbc.user"] = unquote(parts.username)
    if parts.password:
        settings["jdbc.password"] = unquote(parts.password)
    return settings


def spark_conf(catalog: str, properties: Mapping[str, str], jars: str) -> dict[str, str]:
    """The Spark settings that make ``catalog`` (as named in SQL: ``catalog.namespace.table``) the sink's
    catalog; ``jars`` is what ``infra/iceberg.sh path`` prints."""
    if properties.get("type") != "sql":
        raise ConfigError(
            f"catalog {catalog!r} is of type {properties.get('type')!r}: configure Spark for it as Iceberg's "
            "documentation says (this helper covers pyiceberg's SQL catalog)"
        )
    prefix = f"spark.sql.catalog.{catalog}"
    conf = {
        "spark.jars": jars,
        "spark.ui.enabled": "false",
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        f"{prefix}.warehouse": str(properties.get("warehouse", "")),
    }
    conf.update({f"{prefix}.{k}": v for k, v in jdbc_settings(str(properties["uri"])).items()})
    return conf
