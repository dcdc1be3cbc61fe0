#!/usr/bin/env bash
# Local Kafka Connect for change data capture: one distributed-mode worker on loopback, from the Kafka jars
# infra/kafka.sh resolves (they hold connect-runtime, connect-json and connect-transforms of the same
# version), with two plugins on its plugin path, resolved from Maven Central: Debezium's PostgreSQL
# connector and Apicurio Registry's converters (Avro through the schema registry). With
# ONCEFLOW_CONNECT_JDBC_SINK=1, a third one, kept out of the default (bench/cdc.py's peer, about 40 MB):
# Debezium's JDBC sink connector (ONCEFLOW_CONNECT_JDBC_SINK_VERSION, default 3.6.0.Final, the newest that
# Maven Central serves), resolved into $ONCEFLOW_CACHE/connect-plugins-optional/ and added to the plugin path.
#   infra/connect.sh jars     resolve the plugins into $ONCEFLOW_CACHE/connect-plugins/ (about 35 MB)
#   infra/connect.sh start    start the worker unless running, wait until its REST API answers and the
#                             Debezium connector is loaded, then print ONCEFLOW_CONNECT_URL=... on stdout
#   infra/connect.sh env      print ONCEFLOW_CONNECT_URL=... (for eval)
#   infra/connect.sh stop     stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/connect.sh status   exit 0 when the REST API answers
#   infra/connect.sh config   print the worker's properties as start writes them
# Distributed mode, not standalone: connector configs, source offsets and statuses live in Kafka topics
# (onceflow-connect-configs/-offsets/-status), so a restarted worker resumes its connectors where they
# were, connectors are added and removed through the REST API alone, and Kafka Connect's exactly-once
# source support (a distributed-mode feature) can be switched on with ONCEFLOW_CONNECT_CONF. Its settings
# (ONCEFLOW_CONNECT_*) are in infra/env.sh.
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LIBS="$ONCEFLOW_CACHE/kafka-$ONCEFLOW_KAFKA_VERSION/libs"
PLUGINS="$ONCEFLOW_CACHE/connect-plugins"
OPTIONAL_PLUGINS="$ONCEFLOW_CACHE/connect-plugins-optional"
JDBC_SINK="${ONCEFLOW_CONNECT_JDBC_SINK:-0}"
JDBC_SINK_VERSION="${ONCEFLOW_CONNECT_JDBC_SINK_VERSION:-3.6.0.Final}"
HOST="$ONCEFLOW_CONNECT_HOST"
PORT="$ONCEFLOW_CONNECT_PORT"
DATA="$ONCEFLOW_CONNECT_DATA"
PIDFILE="$DATA/connect.pid"
LOG="$DATA/connect.log"
CONF="$DATA/connect-distributed.properties"
URL="http://$HOST:$PORT"

# Resolve one plugin (its pom in infra/connect/) into $PLUGINS/NAME, a folder of its own (the worker gives
# each folder of its plugin path a class loader of its own), unless resolved from that pom and version
# already (the marker holds the pom's checksum and the version).
plugin() {
  local name=$1 pom=$ONCEFLOW_ROOT/infra/connect/$1.pom.xml property=$2 version=$3 root=${4:-$PLUGINS}
  local dir="$root/$name" want
  want="$(sha256sum "$pom" | cut -c1-64) $version"
  if [ -f "$dir/.complete" ] && [ "$(cat "$dir/.complete")" = "$want" ]; then
    onceflow_say "Kafka Connect plugin $name $version already in $dir"
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven) to resolve the Kafka Connect plugins"
  onceflow_say "resolving Kafka Connect plugin $name $version from Maven Central into $dir"
  rm -rf "$dir"; mkdir -p "$dir"
  # Kafka's classes and SLF4J are the worker's: a plugin's own copies would only be shadowed.
  if ! mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies "-D$property=$version" \
    -DincludeScope=runtime -DexcludeGroupIds=org.apache.kafka,org.slf4j -DoutputDirectory="$dir" 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' >&2; then
    onceflow_die "could not resolve the Kafka Connect plugin $name $version (infra/connect/$name.pom.xml)"
  fi
  echo "$want" > "$dir/.complete"
}

jars() {
  "$ONCEFLOW_ROOT/infra/kafka.sh" jars
  [ -f "$LIBS/connect-runtime-$ONCEFLOW_KAFKA_VERSION.jar" ] \
    || onceflow_die "$LIBS has no connect-runtime-$ONCEFLOW_KAFKA_VERSION.jar (infra/kafka/pom.xml brings it with kafka-tools)"
  mkdir -p "$PLUGINS"
  plugin debezium-postgres debezium.version "$ONCEFLOW_DEBEZIUM_VERSION"
  plugin apicurio-converter apicurio.version "$ONCEFLOW_CONNECT_APICURIO_VERSION"
  if jdbc_sink; then
    mkdir -p "$OPTIONAL_PLUGINS"
    plugin debezium-jdbc-sink debezium.jdbc.version "$JDBC_SINK_VERSION" "$OPTIONAL_PLUGINS"
  fi
}

jdbc_sink() { [ "$JDBC_SINK" = "1" ]; }
# Each folder of the plugin path holds plugins, a folder each; the optional ones only when switched on.
plugin_path() { if jdbc_sink; then echo "$PLUGINS,$OPTIONAL_PLUGINS"; else echo "$PLUGINS"; fi; }

# The worker's properties, on stdout.
render_config() {
  cat <<CONF
# Written by infra/connect.sh; edit ONCEFLOW_CONNECT_* variables instead.
bootstrap.servers=$ONCEFLOW_KAFKA_BOOTSTRAP
group.id=onceflow-connect
config.storage.topic=onceflow-connect-configs
offset.storage.topic=onceflow-connect-offsets
status.storage.topic=onceflow-connect-status
# -1: the brokers' default.replication.factor (1 on one broker, 3 on the replicated cluster).
config.storage.replication.factor=-1
offset.storage.replication.factor=-1
status.storage.replication.factor=-1
offset.storage.partitions=5
status.storage.partitions=1
# Connectors name their own converters; these are the defaults for those that do not.
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
listeners=http://$HOST:$PORT
rest.advertised.host.name=$HOST
rest.advertised.port=$PORT
plugin.path=$(plugin_path)
# Source offsets reach Kafka within a second; one worker: a restarted worker takes its connectors back
# at once instead of waiting for a lost member to return.
offset.flush.interval.ms=1000
scheduled.rebalance.max.delay.ms=0
CONF
  extra_config
}

# ONCEFLOW_CONNECT_CONF's key=value pairs, one a line (they come last, so they win).
extra_config() {
  local pair pairs
  read -r -a pairs <<< "$ONCEFLOW_CONNECT_CONF"
  [ "${#pairs[@]}" -gt 0 ] || return 0
  echo "# From ONCEFLOW_CONNECT_CONF."
  for pair in "${pairs[@]}"; do
    case "$pair" in
      [a-z]*=*) echo "$pair" ;;
      *) onceflow_die "ONCEFLOW_CONNECT_CONF: '$pair' is not key=value (e.g. exactly.once.source.support=enabled)" ;;
    esac
  done
}

answers() { curl -fsS -o /dev/null --max-time 3 "$URL/connectors"; }
# The worker lists Debezium's connector once it has scanned its plugin path.
has_debezium() {
  curl -fsS --max-time 3 "$URL/connector-plugins" 2>/dev/null | grep -q 'io.debezium.connector.postgresql.PostgresConnector'
}
has_jdbc_sink() {
  curl -fsS --max-time 3 "$URL/connector-plugins" 2>/dev/null | grep -q 'io.debezium.connector.jdbc.JdbcSinkConnector'
}
running() { kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; }

start() {
  jars
  if running && answers; then
    onceflow_say "Kafka Connect already running on $URL"
  else
    onceflow_port_open "$HOST" "$PORT" && onceflow_die "port $HOST:$PORT is taken by another process; set ONCEFLOW_CONNECT_PORT"
    mkdir -p "$DATA"
    render_config > "$CONF"
    onceflow_say "starting Kafka Connect $ONCEFLOW_KAFKA_VERSION (one distributed worker) on $URL with Debezium $ONCEFLOW_DEBEZIUM_VERSION (PostgreSQL) and Apicurio's converters $ONCEFLOW_CONNECT_APICURIO_VERSION, log in $LOG"
    : > "$LOG"
    # The client JIT and the serial collector: a worker that mostly waits starts sooner and stays smaller.
    nohup java -Xms128m "-Xmx$ONCEFLOW_CONNECT_HEAP" -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
      -Djava.awt.headless=true "-Dlog4j2.configurationFile=$ONCEFLOW_ROOT/infra/connect/log4j2.yaml" \
      -cp "$LIBS/*" org.apache.kafka.connect.cli.ConnectDistributed "$CONF" >>"$LOG" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    onceflow_wait_for "Kafka Connect" "$PIDFILE" 180 "$LOG" answers
  fi
  onceflow_wait_for "Kafka Connect's plugins" "$PIDFILE" 60 "$LOG" has_debezium
  if jdbc_sink && ! has_jdbc_sink; then
    onceflow_say "the running worker has no JDBC sink connector: infra/connect.sh restart (with ONCEFLOW_CONNECT_JDBC_SINK=1) adds it"
  fi
  onceflow_say "Kafka Connect is up (pid $(cat "$PIDFILE")) on $URL"
  printf 'ONCEFLOW_CONNECT_URL=%s\n' "$URL"
}

stop() {
  local signal=TERM
  [ "${1:-}" = "--kill" ] && signal=KILL
  onceflow_stop_pid "Kafka Connect" "$PIDFILE" 30 "$signal"
}

case "${1:-}" in
  jars) jars ;;
  start) start ;;
  env) printf 'ONCEFLOW_CONNECT_URL=%s\n' "$URL" ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) if running && answers; then onceflow_say "Kafka Connect answers on $URL"; else onceflow_say "Kafka Connect is not running"; exit 1; fi ;;
  config) render_config ;;
  *) echo "usage: $0 jars|start|env|stop [--kill]|restart|status|config" >&2; exit 2 ;;
esac
