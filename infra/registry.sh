#!/usr/bin/env bash
# Local schema registry for Avro pipelines: Apicurio Registry (its Quarkus application, the
# `apicurio-registry-app` distribution from Maven Central) with its default in-memory storage, on
# loopback. onceflow talks to its Confluent-compatible API (/apis/ccompat/v7). Schemas live as long as
# the process: a restart starts an empty registry.
#   infra/registry.sh jars     resolve and unpack the application into $ONCEFLOW_CACHE
#   infra/registry.sh start    start it unless running, wait until the API answers, then print
#                              ONCEFLOW_SCHEMA_REGISTRY_URL=... on stdout (progress on stderr)
#   infra/registry.sh env      print ONCEFLOW_SCHEMA_REGISTRY_URL=... (for eval)
#   infra/registry.sh stop     stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/registry.sh status   exit 0 when the API answers
# The application is built for Java 21 or newer: ONCEFLOW_REGISTRY_JAVA names the java to run it with,
# else the first java 21+ among JAVA_HOME, PATH and /usr/lib/jvm.
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

VERSION="${ONCEFLOW_REGISTRY_VERSION:-3.3.3}"
HOST="${ONCEFLOW_REGISTRY_HOST:-127.0.0.1}"
PORT="${ONCEFLOW_REGISTRY_PORT:-18081}"
# Quarkus's management interface (health, metrics): on loopback too, never on every address.
MANAGEMENT_PORT="${ONCEFLOW_REGISTRY_MANAGEMENT_PORT:-18082}"
HEAP="${ONCEFLOW_REGISTRY_HEAP:-384m}"
DATA="${ONCEFLOW_REGISTRY_DATA:-$ONCEFLOW_HOME/registry}"
APP="$ONCEFLOW_CACHE/apicurio-registry-$VERSION"
PIDFILE="$DATA/registry.pid"
LOG="$DATA/registry.log"
URL="http://$HOST:$PORT/apis/ccompat/v7"

java_major() { "$1" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p'; }

find_java() {
  local candidates=()
  [ -n "${ONCEFLOW_REGISTRY_JAVA:-}" ] && candidates+=("$ONCEFLOW_REGISTRY_JAVA")
  [ -n "${JAVA_HOME:-}" ] && candidates+=("$JAVA_HOME/bin/java")
  command -v java >/dev/null && candidates+=("$(command -v java)")
  local jvm
  for jvm in /usr/lib/jvm/*/bin/java; do [ -x "$jvm" ] && candidates+=("$jvm"); done
  local candidate major
  for candidate in "${candidates[@]}"; do
    [ -x "$candidate" ] || continue
    major=$(java_major "$candidate")
    if [ -n "$major" ] && [ "$major" -ge 21 ]; then printf '%s' "$candidate"; return; fi
  done
  onceflow_die "Apicurio Registry $VERSION needs Java 21 or newer and none was found: install one \
(apt-get install openjdk-21-jdk-headless where Debian has it) or set ONCEFLOW_REGISTRY_JAVA"
}

jars() {
  if [ -f "$APP/.complete" ]; then
    onceflow_say "Apicurio Registry $VERSION already in $APP"
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven)"
  onceflow_say "resolving Apicurio Registry $VERSION (io.apicurio:apicurio-registry-app, the 'all' tar.gz) from Maven Central"
  local download="$ONCEFLOW_CACHE/apicurio-download"
  rm -rf "$APP" "$download"; mkdir -p "$APP" "$download"
  mvn -q -B -Dstyle.color=never dependency:copy >&2 \
    "-Dartifact=io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" "-DoutputDirectory=$download" \
    || onceflow_die "could not resolve io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all"
  tar xzf "$download/apicurio-registry-app-$VERSION-all.tar.gz" -C "$APP"
  rm -rf "$download"
  [ -f "$APP/quarkus-run.jar" ] || onceflow_die "$APP has no quarkus-run.jar: not a runnable Quarkus application"
  touch "$APP/.complete"
}

answers() { curl -fsS -o /dev/null --max-time 3 "$URL/subjects"; }
running() { kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; }

start() {
  jars
  if running && answers; then
    onceflow_say "schema registry already running on $URL"
  else
    onceflow_port_open "$HOST" "$PORT" && onceflow_die "port $HOST:$PORT is taken by another process"
    local java
    java=$(find_java)
    mkdir -p "$DATA"
    onceflow_say "starting Apicurio Registry $VERSION on $URL (in-memory storage, java $(java_major "$java"))"
    (
      cd "$DATA"
      nohup "$java" "-Xmx$HEAP" \
        "-Dquarkus.http.host=$HOST" "-Dquarkus.http.port=$PORT" \
        "-Dquarkus.management.host=$HOST" "-Dquarkus.management.port=$MANAGEMENT_PORT" \
        -jar "$APP/quarkus-run.jar" >"$LOG" 2>&1 &
      echo $! >"$PIDFILE"
    )
    onceflow_wait_for "the schema registry" "$PIDFILE" 120 "$LOG" answers
  fi
  printf 'ONCEFLOW_SCHEMA_REGISTRY_URL=%s\n' "$URL"
}

stop() {
  local signal=TERM
  [ "${1:-}" = "--kill" ] && signal=KILL
  onceflow_stop_pid "the schema registry" "$PIDFILE" 30 "$signal"
}

case "${1:-}" in
  jars) jars ;;
  start) start ;;
  env) printf 'ONCEFLOW_SCHEMA_REGISTRY_URL=%s\n' "$URL" ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) if running && answers; then onceflow_say "schema registry answers on $URL"; else onceflow_say "schema registry is not running"; exit 1; fi ;;
  *) echo "usage: $0 jars|start|env|stop [--kill]|restart|status" >&2; exit 2 ;;
esac
