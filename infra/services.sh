#!/usr/bin/env bash
# Start or stop the whole local stack: PostgreSQL, Kafka, the schema registry (Apicurio Registry,
# infra/registry.sh; left out, in one line, where no Java 21+ is there to run it) and the warm Spark
# runtime (a standalone cluster with a Spark Connect server, infra/spark.sh; ONCEFLOW_WARM_SPARK=0 leaves
# it out, and slices then run through spark-submit) and Kafka Connect with Debezium's PostgreSQL connector
# (infra/connect.sh; ONCEFLOW_KAFKA_CONNECT=0 leaves it out) and an S3-compatible object store (infra/s3.sh;
# ONCEFLOW_S3=0 leaves it out). `start` ends by printing the connection
# settings as KEY=VALUE lines on stdout (progress goes to stderr), so that
# `eval "$(infra/services.sh start)"` works.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=infra/env.sh
. "$here/env.sh"

print_env() {
  local key
  for key in ONCEFLOW_HOME ONCEFLOW_KAFKA_BOOTSTRAP ONCEFLOW_PG_DSN ONCEFLOW_LEDGER_URL; do
    printf '%s=%q\n' "$key" "${!key}"
  done
  if "$here/registry.sh" usable 2>/dev/null; then
    printf '%s=%q\n' ONCEFLOW_SCHEMA_REGISTRY_URL "$ONCEFLOW_SCHEMA_REGISTRY_URL"
  fi
  if warm_spark; then "$here/spark.sh" env; fi
  if kafka_connect; then "$here/connect.sh" env; fi
  if object_store; then "$here/s3.sh" env; fi
}

warm_spark() { [ "${ONCEFLOW_WARM_SPARK:-1}" != "0" ]; }
kafka_connect() { [ "${ONCEFLOW_KAFKA_CONNECT:-1}" != "0" ]; }
object_store() { [ "${ONCEFLOW_S3:-1}" != "0" ]; }

case "${1:-}" in
  start)
    mkdir -p "$ONCEFLOW_HOME"
    "$here/postgres.sh" start
    "$here/kafka.sh" start
    # Without a Java 21+, `usable` says in one line that the registry is left out, and the stack goes on.
    if "$here/registry.sh" usable; then "$here/registry.sh" start >/dev/null; fi
    if kafka_connect; then
      "$here/connect.sh" start >/dev/null
    else
      onceflow_say "ONCEFLOW_KAFKA_CONNECT=0: no Kafka Connect (change data capture)"
    fi
    if object_store; then
      "$here/s3.sh" start >/dev/null
    else
      onceflow_say "ONCEFLOW_S3=0: no S3 object store"
    fi
    if warm_spark; then
      "$here/spark.sh" start >/dev/null
    else
      onceflow_say "ONCEFLOW_WARM_SPARK=0: no Spark runtime; slices run through spark-submit"
    fi
    onceflow_say "local stack is up; stop it with: make services-stop"
    print_env
    ;;
  stop)
    "$here/s3.sh" stop
    "$here/connect.sh" stop
    "$here/spark.sh" stop
    "$here/registry.sh" stop
    "$here/kafka.sh" stop
    "$here/postgres.sh" stop
    ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
