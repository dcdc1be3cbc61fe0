#!/usr/bin/env bash
# Local Apache Kafka (KRaft, one combined broker+controller on loopback) for onceflow.
#   infra/kafka.sh jars      resolve the broker jars from Maven Central into $ONCEFLOW_CACHE
#   infra/kafka.sh start     format storage on first start, start, wait until it answers (data kept on restart)
#   infra/kafka.sh stop      stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/kafka.sh status    exit 0 when the broker answers
#   infra/kafka.sh consumer-groups|topics ARGS   Kafka's own tools against the local broker
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

LIBS="$ONCEFLOW_CACHE/kafka-$ONCEFLOW_KAFKA_VERSION/libs"
PIDFILE="$ONCEFLOW_KAFKA_DATA/kafka.pid"
LOG="$ONCEFLOW_KAFKA_DATA/kafka.log"
CONF="$ONCEFLOW_KAFKA_DATA/server.properties"

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

write_config() {
  mkdir -p "$ONCEFLOW_KAFKA_DATA/log"
  cat > "$CONF" <<CONF
# Written by infra/kafka.sh; edit ONCEFLOW_KAFKA_* variables instead.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$ONCEFLOW_KAFKA_HOST:$ONCEFLOW_KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$ONCEFLOW_KAFKA_HOST:$ONCEFLOW_KAFKA_PORT,CONTROLLER://$ONCEFLOW_KAFKA_HOST:$ONCEFLOW_KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$ONCEFLOW_KAFKA_HOST:$ONCEFLOW_KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$ONCEFLOW_KAFKA_DATA/log
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Pipelines may hold a transaction open for a long epoch; the client's transaction.timeout.ms may not exceed this.
transaction.max.timeout.ms=3600000
group.initial.rebalance.delay.ms=0
CONF
}

format_once() {
  if [ -f "$ONCEFLOW_KAFKA_DATA/log/meta.properties" ]; then
    return
  fi
  local cluster_id
  cluster_id=$(java -cp "$(classpath)" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
  onceflow_say "formatting KRaft storage in $ONCEFLOW_KAFKA_DATA/log (cluster $cluster_id)"
  java -cp "$(classpath)" kafka.tools.StorageTool format -t "$cluster_id" -c "$CONF" 2>/dev/null >&2
}

answers() {
  onceflow_port_open "$ONCEFLOW_KAFKA_HOST" "$ONCEFLOW_KAFKA_PORT" \
    && grep -q "Kafka Server started" "$LOG" 2>/dev/null
}

running() { kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; }

start() {
  jars
  if running; then
    onceflow_say "Kafka already running (pid $(cat "$PIDFILE")) on $ONCEFLOW_KAFKA_BOOTSTRAP"
    onceflow_wait_for Kafka "$PIDFILE" 120 "$LOG" answers
    return
  fi
  if onceflow_port_open "$ONCEFLOW_KAFKA_HOST" "$ONCEFLOW_KAFKA_PORT"; then
    onceflow_die "port $ONCEFLOW_KAFKA_PORT is taken by another process; set ONCEFLOW_KAFKA_PORT"
  fi
  write_config
  format_once
  onceflow_say "starting Kafka $ONCEFLOW_KAFKA_VERSION (KRaft) on $ONCEFLOW_KAFKA_BOOTSTRAP, data in $ONCEFLOW_KAFKA_DATA"
  : > "$LOG"
  nohup java -Xms256m "-Xmx$ONCEFLOW_KAFKA_HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$ONCEFLOW_ROOT/infra/kafka/log4j2.yaml" \
    -cp "$(classpath)" kafka.Kafka "$CONF" >>"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  onceflow_wait_for Kafka "$PIDFILE" 120 "$LOG" answers
  onceflow_say "Kafka is up (pid $(cat "$PIDFILE"))"
}

# Kafka's own command-line tools against the local broker, e.g.
#   infra/kafka.sh consumer-groups --describe --group onceflow-orders
tool() {
  local class
  case "$1" in
    consumer-groups) class=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
    topics) class=kafka.admin.TopicCommand ;;
    *) onceflow_die "unknown tool $1 (consumer-groups or topics)" ;;
  esac
  shift
  [ -f "$LIBS/.complete" ] || jars
  java -Dlog4j2.configurationFile="$ONCEFLOW_ROOT/infra/kafka/log4j2-tools.yaml" -cp "$(classpath)" "$class" \
    --bootstrap-server "$ONCEFLOW_KAFKA_BOOTSTRAP" "$@"
}

stop() {
  local signal=TERM
  [ "${1:-}" = "--kill" ] && signal=KILL
  onceflow_stop_pid Kafka "$PIDFILE" 60 "$signal"
}

case "${1:-}" in
  jars) jars ;;
  start) start ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) answers && running ;;
  consumer-groups|topics) tool "$@" ;;
  *) echo "usage: $0 jars|start|stop [--kill]|restart|status|consumer-groups ARGS|topics ARGS" >&2; exit 2 ;;
esac
