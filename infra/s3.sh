#!/usr/bin/env bash
# Local S3-compatible object storage: Versity's S3 gateway (versitygw, Apache-2.0) over its POSIX
# backend, on loopback, with credentials generated once per home (ONCEFLOW_S3_DATA/credentials, mode
# 600) and one bucket (ONCEFLOW_S3_BUCKET). Objects are files under ONCEFLOW_S3_DATA/root/<bucket>/.
#   infra/s3.sh build    build the gateway from its Go module into $ONCEFLOW_CACHE/s3/bin (once; needs go)
#   infra/s3.sh start    start it unless running, wait until it answers, make the bucket, then print the
#                        client settings (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) on stdout
#   infra/s3.sh env      print the client settings (for eval)
#   infra/s3.sh stop     stop by pid (SIGTERM, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/s3.sh status   exit 0 when the gateway answers
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

VERSION="$ONCEFLOW_S3_VERSION"
HOST="$ONCEFLOW_S3_HOST"
PORT="$ONCEFLOW_S3_PORT"
DATA="$ONCEFLOW_S3_DATA"
BUCKET="$ONCEFLOW_S3_BUCKET"
BIN="$ONCEFLOW_CACHE/s3/bin"
GATEWAY="$BIN/versitygw"
PIDFILE="$DATA/s3.pid"
LOG="$DATA/s3.log"
CREDENTIALS="$DATA/credentials"

build() {
  if [ -x "$GATEWAY" ] && [ "$(cat "$BIN/.version" 2>/dev/null)" = "$VERSION" ]; then
    onceflow_say "S3 gateway versitygw $VERSION already in $BIN"
    return
  fi
  command -v go >/dev/null || onceflow_die "go not found: the local S3 gateway is built from its Go module (install Go 1.24 or newer)"
  onceflow_say "building the S3 gateway (github.com/versity/versitygw $VERSION) from the Go module proxy into $BIN (about 2 minutes the first time)"
  mkdir -p "$BIN"
  GOBIN="$BIN" GOFLAGS=-mod=mod go install "github.com/versity/versitygw/cmd/versitygw@$VERSION" >&2 \
    || onceflow_die "could not build github.com/versity/versitygw $VERSION"
  echo "$VERSION" > "$BIN/.version"
}

# The access key and secret of this home's gateway, made on first use (never printed by start's progress).
credentials() {
  if [ ! -s "$CREDENTIALS" ]; then
    mkdir -p "$DATA"
    umask 077
    printf 'onceflow%s %s\n' "$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" \
      "$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" > "$CREDENTIALS"
  fi
  read -r ACCESS_KEY SECRET_KEY < "$CREDENTIALS"
}

status() { onceflow_port_open "$HOST" "$PORT" && curl -s -o /dev/null "http://$HOST:$PORT/"; }

print_env() {
  credentials
  printf 'AWS_ENDPOINT_URL=%q\n' "http://$HOST:$PORT"
  printf 'AWS_ACCESS_KEY_ID=%q\n' "$ACCESS_KEY"
  printf 'AWS_SECRET_ACCESS_KEY=%q\n' "$SECRET_KEY"
  printf 'AWS_REGION=%q\n' "$ONCEFLOW_S3_REGION"
  printf 'ONCEFLOW_S3_BUCKET=%q\n' "$BUCKET"
}

start() {
  build
  credentials
  mkdir -p "$DATA/root/$BUCKET"
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    onceflow_say "S3 gateway already running on $HOST:$PORT (pid $(cat "$PIDFILE"))"
  else
    onceflow_port_open "$HOST" "$PORT" && onceflow_die "port $HOST:$PORT is taken by another process: set ONCEFLOW_S3_PORT"
    onceflow_say "starting the S3 gateway on $HOST:$PORT (objects in $DATA/root, bucket '$BUCKET')"
    # The secret goes through the environment, not the command line, where any user could read it.
    ROOT_ACCESS_KEY="$ACCESS_KEY" ROOT_SECRET_KEY="$SECRET_KEY" \
      nohup "$GATEWAY" --port "$HOST:$PORT" --region "$ONCEFLOW_S3_REGION" posix "$DATA/root" \
      >"$LOG" 2>&1 &
    echo $! > "$PIDFILE"
    onceflow_wait_for "S3 gateway" "$PIDFILE" 30 "$LOG" status
  fi
  print_env
}

case "${1:-}" in
  build) build ;;
  start) start ;;
  env) print_env ;;
  stop)
    if [ "${2:-}" = "--kill" ]; then onceflow_stop_pid "S3 gateway" "$PIDFILE" 5 KILL
    else onceflow_stop_pid "S3 gateway" "$PIDFILE" 10; fi
    ;;
  status) status ;;
  *) echo "usage: $0 build|start|env|stop [--kill]|status" >&2; exit 2 ;;
esac
