#!/usr/bin/env bash
# Local Apache Kafka (KRaft) for onceflow: one combined broker+controller on loopback, or with
# ONCEFLOW_KAFKA_BROKERS=3 (up to 9) a cluster of that many combined broker+controller processes, with
# topics and the transaction state log replicated 3 times and min.insync.replicas=2.
#   infra/kafka.sh jars      resolve the broker jars from Maven Central into $ONCEFLOW_CACHE
#   infra/kafka.sh start     format storage on first start, start every broker, wait until each answers
#   infra/kafka.sh stop      stop every broker by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL
#   infra/kafka.sh status    exit 0 when every broker answers
#   infra/kafka.sh config [N]   print broker N's server.properties (default 1) as start writes it
#   infra/kafka.sh start-broker N            start broker N of the cluster alone (the others keep running)
#   infra/kafka.sh stop-broker N [--kill]    stop broker N alone
#   infra/kafka.sh consumer-groups|topics|transactions|metadata-quorum ARGS   Kafka's own tools
# Broker n (node.id n) listens on ONCEFLOW_KAFKA_PORT + 2(n-1), its controller on
# ONCEFLOW_KAFKA_CONTROLLER_PORT + 2(n-1); with one broker its files are right in ONCEFLOW_KAFKA_DATA,
# in a cluster under ONCEFLOW_KAFKA_DATA/broker-n (server.properties, kafka.pid, kafka.log, log/).
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LIBS="$ONCEFLOW_CACHE/kafka-$ONCEFLOW_KAFKA_VERSION/libs"
BROKERS="$ONCEFLOW_KAFKA_BROKERS"

case "$BROKERS" in
  1 | [3-9]) ;;
  *) onceflow_die "ONCEFLOW_KAFKA_BROKERS=$BROKERS: expected 1 (one broker) or 3 to 9 (a replicated cluster)" ;;
esac

jars() {
  # The marker holds the pom's checksum: a pom that gained an artifact resolves again.
  local want
  want=$(sha256sum "$ONCEFLOW_ROOT/infra/kafka/pom.xml" | cut -c1-64)
  if [ -f "$LIBS/.complete" ] && [ "$(cat "$LIBS/.complete")" = "$want" ]; then
    onceflow_say "Kafka $ONCEFLOW_KAFKA_VERSION jars already in $LIBS"
    return
  fi
  command -v mvn >/dev/null || onceflow_die "mvn not found: install Maven (apt-get install maven) to resolve the Kafka jars"
  command -v java >/dev/null || onceflow_die "java not found: install a JDK 17 (apt-get install openjdk-17-jdk-headless)"
  onceflow_say "resolving Kafka $ONCEFLOW_KAFKA_VERSION broker jars from Maven Central into $LIBS"
  rm -rf "$LIBS"; mkdir -p "$LIBS"
  mvn -q -B -Dstyle.color=never -f "$ONCEFLOW_ROOT/infra/kafka/pom.xml" dependency:copy-dependencies \
    -Dkafka.version="$ONCEFLOW_KAFKA_VERSION" -DincludeScope=runtime -DoutputDirectory="$LIBS" 2>&1 \
    | sed 's/\x1b\[[0-9;]*m//g' >&2
  echo "$want" > "$LIBS/.complete"
}

classpath() { printf '%s' "$LIBS/*"; }

# Where broker N keeps its files, and its ports.
dir_of() { if [ "$BROKERS" = 1 ]; then printf '%s' "$ONCEFLOW_KAFKA_DATA"; else printf '%s' "$ONCEFLOW_KAFKA_DATA/broker-$1"; fi; }
port_of() { onceflow_kafka_port "$1" "$ONCEFLOW_KAFKA_PORT"; }
controller_port_of() { onceflow_kafka_port "$1" "$ONCEFLOW_KAFKA_CONTROLLER_PORT"; }
pidfile_of() { printf '%s/kafka.pid' "$(dir_of "$1")"; }
log_of() { printf '%s/kafka.log' "$(dir_of "$1")"; }
conf_of() { printf '%s/server.properties' "$(dir_of "$1")"; }
what_of() { if [ "$BROKERS" = 1 ]; then printf 'Kafka'; else printf 'Kafka broker %s' "$1"; fi; }

voters() {
  local n list=""
  for ((n = 1; n <= BROKERS; n++)); do
    list+="${list:+,}$n@$ONCEFLOW_KAFKA_HOST:$(controller_port_of "$n")"
  done
  printf '%s' "$list"
}

# Replication of topics and internal state: 1 on one broker, 3 with min.insync.replicas=2 on a cluster.
replication() {
  local replicas=1 isr=1
  if [ "$BROKERS" != 1 ]; then
    replicas=3 isr=2
    printf 'default.replication.factor=3\nmin.insync.replicas=2\n'
  fi
  cat <<CONF
offsets.topic.replication.factor=$replicas
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$isr
CONF
}

# Broker N's server.properties, on stdout.
render_config() {
  local n=$1 dir port cport
  dir=$(dir_of "$n"); port=$(port_of "$n"); cport=$(controller_port_of "$n")
  cat <<CONF
# Written by infra/kafka.sh; edit ONCEFLOW_KAFKA_* variables instead.
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=PLAINTEXT://$ONCEFLOW_KAFKA_HOST:$port,CONTROLLER://$ONCEFLOW_KAFKA_HOST:$cport
advertised.listeners=PLAINTEXT://$ONCEFLOW_KAFKA_HOST:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/log
num.partitions=1
auto.create.topics.enable=false
$(replication)
# Pipelines may hold a transaction open for a long epoch; the client's transaction.timeout.ms may not exceed this.
transaction.max.timeout.ms=3600000
group.initial.rebalance.delay.ms=0
CONF
  extra_config
}

write_config() {
  mkdir -p "$(dir_of "$1")/log"
  render_config "$1" > "$(conf_of "$1")"
}

# ONCEFLOW_KAFKA_CONF's key=value pairs, one a line (a later line wins over an earlier one).
extra_config() {
  local pair pairs
  read -r -a pairs <<< "$ONCEFLOW_KAFKA_CONF"
  [ "${#pairs[@]}" -gt 0 ] || return 0
  echo "# From ONCEFLOW_KAFKA_CONF."
  for pair in "${pairs[@]}"; do
    case "$pair" in
      [a-z]*=*) echo "$pair" ;;
      *) onceflow_die "ONCEFLOW_KAFKA_CONF: '$pair' is not key=value (e.g. broker.session.timeout.ms=4000)" ;;
    esac
  done
}

# The id every broker of the local cluster is formatted with (one broker: a fresh one on its first start).
cluster_id() {
  local file="$ONCEFLOW_KAFKA_DATA/cluster.id"
  if [ "$BROKERS" != 1 ] && [ -s "$file" ]; then
    cat "$file"
    return
  fi
  local id
  id=$(java -cp "$(classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
  if [ "$BROKERS" != 1 ]; then
    mkdir -p "$ONCEFLOW_KAFKA_DATA"
    echo "$id" > "$file"
  fi
  printf '%s' "$id"
}

format_once() {
  local n=$1 dir
  dir=$(dir_of "$n")
  if [ -f "$dir/log/meta.properties" ]; then
    return
  fi
  local id
  id=$(cluster_id)
  onceflow_say "formatting KRaft storage in $dir/log (cluster $id)"
  java -cp "$(classpath)" kafka.tools.StorageTool format -t "$id" -c "$(conf_of "$n")" 2>/dev/null >&2
}

answers() {
  onceflow_port_open "$ONCEFLOW_KAFKA_HOST" "$(port_of "$1")" \
    && grep -q "Kafka Server started" "$(log_of "$1")" 2>/dev/null
}

running() { kill -0 "$(cat "$(pidfile_of "$1")" 2>/dev/null)" 2>/dev/null; }

# Pid files of the other layout (the cluster's when BROKERS=1, the single broker's otherwise) whose
# process is a live broker of that file's config: ONCEFLOW_KAFKA_BROKERS changed while Kafka ran. (A
# stale pid file whose pid now belongs to another process does not count.)
other_layout() {
  local pidfile pid
  if [ "$BROKERS" = 1 ]; then
    set -- "$ONCEFLOW_KAFKA_DATA"/broker-*/kafka.pid
  else
    set -- "$ONCEFLOW_KAFKA_DATA/kafka.pid"
  fi
  for pidfile in "$@"; do
    pid=$(head -n 1 "$pidfile" 2>/dev/null) || continue
    case "$(ps -o args= -p "$pid" 2>/dev/null)" in
      *kafka.Kafka\ "$(dirname "$pidfile")/server.properties"*) printf '%s\n' "$pidfile" ;;
    esac
  done
}

# Launch broker N unless it runs already (no waiting: a cluster's brokers only answer once a quorum is up).
launch() {
  local n=$1 port log pidfile
  port=$(port_of "$n"); log=$(log_of "$n"); pidfile=$(pidfile_of "$n")
  if running "$n"; then
    onceflow_say "$(what_of "$n") already running (pid $(cat "$pidfile")) on $ONCEFLOW_KAFKA_HOST:$port"
    return
  fi
  if onceflow_port_open "$ONCEFLOW_KAFKA_HOST" "$port"; then
    onceflow_die "port $port is taken by another process; set ONCEFLOW_KAFKA_PORT"
  fi
  write_config "$n"
  format_once "$n"
  onceflow_say "starting $(what_of "$n") $ONCEFLOW_KAFKA_VERSION (KRaft) on $ONCEFLOW_KAFKA_HOST:$port, data in $(dir_of "$n")"
  : > "$log"
  nohup java -Xms256m "-Xmx$ONCEFLOW_KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$ONCEFLOW_ROOT/infra/kafka/log4j2.yaml" \
    -cp "$(classpath)" kafka.Kafka "$(conf_of "$n")" >>"$log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
}

wait_up() {
  local n=$1
  onceflow_wait_for "$(what_of "$n")" "$(pidfile_of "$n")" 120 "$(log_of "$n")" answers "$n"
  onceflow_say "$(what_of "$n") is up (pid $(cat "$(pidfile_of "$n")"))"
}

start() {
  local n others
  others=$(other_layout)
  if [ -n "$others" ]; then
    if [ "$BROKERS" = 1 ]; then others="a cluster"; else others="a single broker"; fi
    onceflow_die "Kafka runs as $others in $ONCEFLOW_KAFKA_DATA, not ONCEFLOW_KAFKA_BROKERS=$BROKERS; stop it first (infra/kafka.sh stop)"
  fi
  jars
  if [ "$BROKERS" != 1 ]; then  # a first start formats every broker's storage at once (a JVM each)
    cluster_id >/dev/null
    for ((n = 1; n <= BROKERS; n++)); do
      running "$n" || { write_config "$n" && format_once "$n"; } &
    done
    wait
  fi
  for ((n = 1; n <= BROKERS; n++)); do launch "$n"; done
  for ((n = 1; n <= BROKERS; n++)); do wait_up "$n"; done
  [ "$BROKERS" = 1 ] || onceflow_say "Kafka cluster of $BROKERS brokers is up on $ONCEFLOW_KAFKA_BOOTSTRAP"
}

# Kafka's own command-line tools against the local cluster, e.g.
#   infra/kafka.sh consumer-groups --describe --group onceflow-orders
#   infra/kafka.sh transactions describe --transactional-id onceflow-orders-out-s0
#   infra/kafka.sh metadata-quorum describe --status
tool() {
  local class
  case "$1" in
    consumer-groups) class=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    topics) class=kafka.admin.TopicCommand ;;
    transactions) class=org.apache.kafka.tools.TransactionsCommand ;;
    metadata-quorum) class=org.apache.kafka.tools.MetadataQuorumCommand ;;
    *) onceflow_die "unknown tool $1 (consumer-groups, topics, transactions or metadata-quorum)" ;;
  esac
  shift
  [ -f "$LIBS/.complete" ] || jars
  java -Dlog4j2.configurationFile="$ONCEFLOW_ROOT/infra/kafka/log4j2-tools.yaml" -cp "$(classpath)" "$class" \
    --bootstrap-server "$ONCEFLOW_KAFKA_BOOTSTRAP" "$@"
}

signal_of() { if [ "${1:-}" = "--kill" ]; then printf 'KILL'; else printf 'TERM'; fi; }

stop() {
  local signal n pidfile
  signal=$(signal_of "${1:-}")
  for pidfile in $(other_layout); do  # whatever runs here goes, whichever ONCEFLOW_KAFKA_BROKERS started it
    case "$pidfile" in
      */broker-*/kafka.pid) onceflow_stop_pid "Kafka $(basename "$(dirname "$pidfile")")" "$pidfile" 30 "$signal" & ;;
      *) onceflow_stop_pid "Kafka (single broker)" "$pidfile" 60 "$signal" & ;;
    esac
  done
  if [ "$BROKERS" = 1 ]; then
    onceflow_stop_pid Kafka "$(pidfile_of 1)" 60 "$signal"
  else
    # All at once: stopped one by one, the last brokers would wait for a controller quorum that is gone.
    for ((n = 1; n <= BROKERS; n++)); do
      onceflow_stop_pid "$(what_of "$n")" "$(pidfile_of "$n")" 30 "$signal" &
    done
  fi
  wait
}

# The broker number of `start-broker N` / `stop-broker N`, checked.
broker_arg() {
  case "${1:-}" in
    '' | *[!0-9]*) onceflow_die "expected a broker number 1..$BROKERS, got '${1:-}'" ;;
  esac
  [ "$1" -ge 1 ] && [ "$1" -le "$BROKERS" ] || onceflow_die "broker $1: the cluster has brokers 1..$BROKERS (ONCEFLOW_KAFKA_BROKERS)"
  printf '%s' "$1"
}

status() {
  local n
  for ((n = 1; n <= BROKERS; n++)); do
    answers "$n" && running "$n" || return 1
  done
}

case "${1:-}" in
  jars) jars ;;
  start) start ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) status ;;
  config) n=$(broker_arg "${2:-1}"); render_config "$n" ;;
  start-broker) n=$(broker_arg "${2:-}"); jars; launch "$n"; wait_up "$n" ;;
  stop-broker)
    n=$(broker_arg "${2:-}")
    onceflow_stop_pid "$(what_of "$n")" "$(pidfile_of "$n")" 60 "$(signal_of "${3:-}")"
    ;;
  consumer-groups | topics | transactions | metadata-quorum) tool "$@" ;;
  *)
    echo "usage: $0 jars|start|stop [--kill]|restart|status|config [N]|start-broker N|stop-broker N [--kill]|consumer-groups ARGS|topics ARGS|transactions ARGS|metadata-quorum ARGS" >&2
    exit 2
    ;;
esac
