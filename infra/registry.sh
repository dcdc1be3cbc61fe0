#!/usr/bin/env bash
# Local schema registry for Avro pipelines: Apicurio Registry (its Quarkus application, the
# `apicurio-registry-app` distribution from Maven Central) with its default in-memory storage, on
# loopback. onceflow talks to its Confluent-compatible API (/apis/ccompat/v7). Schemas live as long as
# the process: a restart starts an empty registry.
#   infra/registry.sh jars     resolve and unpack the application into $ONCEFLOW_CACHE (about 158 MB)
#   infra/registry.sh usable   exit 0 when a Java 21+ is there to run it, else say why in one line
#   infra/registry.sh start    start it unless running, wait until the API answers, then print
#                              ONCEFLOW_SCHEMA_REGISTRY_URL=... on stdout (progress on stderr)
#   infra/registry.sh env      print ONCEFLOW_SCHEMA_REGISTRY_URL=... (for eval)
#   infra/registry.sh stop     stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/registry.sh status   exit 0 when the API answers
# The application is built for Java 21 or newer: ONCEFLOW_REGISTRY_JAVA names the java to run it with,
# else the first java 21+ among JAVA_HOME, PATH and /usr/lib/jvm. `make jars` and `make services` leave
# the registry out (one line says so) where there is none. Its settings (ONCEFLOW_REGISTRY_*) are in
# infra/env.sh.
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

VERSION="$ONCEFLOW_REGISTRY_VERSION"
HOST="$ONCEFLOW_REGISTRY_HOST"
PORT="$ONCEFLOW_REGISTRY_PORT"
MANAGEMENT_PORT="$ONCEFLOW_REGISTRY_MANAGEMENT_PORT"
HEAP="$ONCEFLOW_REGISTRY_HEAP"
DATA="$ONCEFLOW_REGISTRY_DATA"
APP="$ONCEFLOW_CACHE/apicurio-registry-$VERSION"
PIDFILE="$DATA/registry.pid"
LOG="$DATA/registry.log"
URL="http://$HOST:$PORT/apis/ccompat/v7"

java_major() { "$1" -version 2>&1 | sed -n '1s/.*version "\([0-9]*\).*/\1/p'; }

# The first java 21+ of ONCEFLOW_REGISTRY_JAVA, JAVA_HOME, PATH and /usr/lib/jvm, or nothing.
java_21() {
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
}

NO_JAVA="Apicurio Registry $VERSION needs Java 21 or newer and none was found: install one \
(apt-get install openjdk-21-jdk-headless where Debian has it) or set ONCEFLOW_REGISTRY_JAVA"

find_java() {
  local java
  java=$(java_21)
  [ -n "$java" ] || onceflow_die "$NO_JAVA"
  printf '%s' "$java"
}

jars() {
  if [ -f "$APP/.complete" ]; then
    onceflow_say "Apicurio Registry $VERSION already in $APP"
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven)"
  onceflow_say "resolving Apicurio Registry $VERSION (io.apicurio:apicurio-registry-app, the 'all' tar.gz, about 158 MB) from Maven Central into $APP"
  local download="$ONCEFLOW_CACHE/apicurio-download"
  rm -rf "$APP" "$download"; mkdir -p "$APP" "$download"
  # -q prints only errors; the escape codes Maven writes even with style.color=never are stripped.
  if ! mvn -q -B -Dstyle.color=never dependency:copy \
    "-Dartifact=io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all" "-DoutputDirectory=$download" 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' >&2; then
    onceflow_die "could not resolve io.apicurio:apicurio-registry-app:$VERSION:tar.gz:all"
  fi
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
  usable) [ -n "$(java_21)" ] || { onceflow_say "schema registry left out: $NO_JAVA"; exit 1; } ;;
  start) start ;;
  env) printf 'ONCEFLOW_SCHEMA_REGISTRY_URL=%s\n' "$URL" ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) if running && answers; then onceflow_say "schema registry answers on $URL"; else onceflow_say "schema registry is not running"; exit 1; fi ;;
  *) echo "usage: $0 jars|usable|start|env|stop [--kill]|restart|status" >&2; exit 2 ;;
esac
