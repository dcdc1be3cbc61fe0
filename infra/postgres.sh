#!/usr/bin/env bash
# Local PostgreSQL (Debian's server binaries) for onceflow, on loopback, with two-phase commit enabled and
# logical decoding (wal_level=logical, for Debezium's change data capture through pgoutput; the onceflow
# role may replicate).
#   infra/postgres.sh start    initdb on first start, start, wait until it answers, create role and database
#   infra/postgres.sh stop     stop by pid (fast shutdown, then SIGKILL); `stop --kill` sends SIGKILL at once
#   infra/postgres.sh status   exit 0 when the server answers
#   infra/postgres.sh psql     psql as the superuser, for inspection
set -euo pipefail
# shellcheck source=infra/env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# The server runs as the 'postgres' user when we are root; if it cannot reach the default data folder
# (a private parent such as /root), use a folder of its own beside the other system services' data.
if [ "$(id -u)" = 0 ] && [ "$ONCEFLOW_PG_DATA" = "$ONCEFLOW_HOME/postgres" ]; then
  mkdir -p "$ONCEFLOW_HOME"
  if ! runuser -u postgres -- test -x "$ONCEFLOW_HOME"; then
    ONCEFLOW_PG_DATA="/var/lib/onceflow/postgres-$(printf '%s' "$ONCEFLOW_HOME" | md5sum | cut -c1-12)"
    mkdir -p "$(dirname "$ONCEFLOW_PG_DATA")"
  fi
fi
LOG="$ONCEFLOW_PG_DATA.log"
PIDFILE="$ONCEFLOW_PG_DATA/postmaster.pid"

find_bindir() {
  if [ -n "${ONCEFLOW_PG_BINDIR:-}" ]; then echo "$ONCEFLOW_PG_BINDIR"; return; fi
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$dir" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    onceflow_say "PostgreSQL server not installed: installing Debian's postgresql package"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  [ -n "$dir" ] || onceflow_die "PostgreSQL server binaries not found: install Debian's postgresql package or set ONCEFLOW_PG_BINDIR"
  echo "$dir"
}

BINDIR=$(find_bindir)

# PostgreSQL refuses to run as root: as root, run the server as the 'postgres' system user.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

sql() { as_owner "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$ONCEFLOW_PG_HOST" -p "$ONCEFLOW_PG_PORT" -U postgres "$@"; }

answers() { as_owner "$BINDIR/pg_isready" -q -h "$ONCEFLOW_PG_HOST" -p "$ONCEFLOW_PG_PORT"; }

init_once() {
  if [ -f "$ONCEFLOW_PG_DATA/PG_VERSION" ]; then return; fi
  onceflow_say "initialising a PostgreSQL cluster in $ONCEFLOW_PG_DATA"
  mkdir -p "$ONCEFLOW_PG_DATA"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$ONCEFLOW_PG_DATA"
    as_owner test -w "$ONCEFLOW_PG_DATA" || onceflow_die \
      "the postgres user cannot reach $ONCEFLOW_PG_DATA (a parent folder is private): set ONCEFLOW_PG_DATA to a folder it can reach"
  fi
  # Loopback only, trust for local development (README says why, and why never in compose); point
  # ONCEFLOW_PG_DSN at your own server, with a password, anywhere else.
  as_owner "$BINDIR/initdb" -D "$ONCEFLOW_PG_DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale >"$ONCEFLOW_HOME/initdb.log" 2>&1 \
    || { tail -n 20 "$ONCEFLOW_HOME/initdb.log" >&2; onceflow_die "initdb failed"; }
}

start() {
  mkdir -p "$ONCEFLOW_HOME"
  init_once
  if answers; then
    onceflow_say "PostgreSQL already answering on $ONCEFLOW_PG_HOST:$ONCEFLOW_PG_PORT"
  else
    if onceflow_port_open "$ONCEFLOW_PG_HOST" "$ONCEFLOW_PG_PORT"; then
      onceflow_die "port $ONCEFLOW_PG_PORT is taken by another process; set ONCEFLOW_PG_PORT"
    fi
    onceflow_say "starting PostgreSQL $(basename "$(dirname "$BINDIR")") on $ONCEFLOW_PG_HOST:$ONCEFLOW_PG_PORT, data in $ONCEFLOW_PG_DATA"
    touch "$LOG"; [ "$(id -u)" = 0 ] && chown postgres "$LOG"
    as_owner "$BINDIR/pg_ctl" -D "$ONCEFLOW_PG_DATA" -l "$LOG" -w -t 60 start -o "\
      -c listen_addresses=$ONCEFLOW_PG_HOST -p $ONCEFLOW_PG_PORT -c unix_socket_directories='' \
      -c max_prepared_transactions=$ONCEFLOW_PG_MAX_PREPARED -c max_connections=200 \
      -c wal_level=logical -c max_replication_slots=$ONCEFLOW_PG_MAX_REPLICATION_SLOTS \
      -c max_wal_senders=$ONCEFLOW_PG_MAX_REPLICATION_SLOTS \
      -c fsync=on -c synchronous_commit=on" >/dev/null
    onceflow_wait_for PostgreSQL "$PIDFILE" 60 "$LOG" answers
  fi
  sql -d postgres -c "DO \$\$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ONCEFLOW_PG_USER') THEN
        CREATE ROLE \"$ONCEFLOW_PG_USER\" LOGIN PASSWORD '$ONCEFLOW_PG_PASSWORD' CREATEDB;
      END IF; END \$\$;"
  # Debezium connects as this role: a replication slot needs REPLICATION (idempotent).
  sql -d postgres -c "ALTER ROLE \"$ONCEFLOW_PG_USER\" REPLICATION"
  if [ -z "$(sql -d postgres -At -c "SELECT 1 FROM pg_database WHERE datname = '$ONCEFLOW_PG_DATABASE'")" ]; then
    onceflow_say "creating database $ONCEFLOW_PG_DATABASE owned by $ONCEFLOW_PG_USER"
    sql -d postgres -c "CREATE DATABASE \"$ONCEFLOW_PG_DATABASE\" OWNER \"$ONCEFLOW_PG_USER\""
  fi
  local prepared wal_level
  prepared=$(sql -d postgres -At -c 'SHOW max_prepared_transactions')
  wal_level=$(sql -d postgres -At -c 'SHOW wal_level')
  onceflow_say "PostgreSQL is up (database $ONCEFLOW_PG_DATABASE, max_prepared_transactions=$prepared, wal_level=$wal_level)"
  # A server started by an older version of this script runs on: wal_level only changes with a restart,
  # which is left to the user (it breaks every open connection).
  if [ "$wal_level" != logical ]; then
    onceflow_say "this PostgreSQL runs with wal_level=$wal_level: change data capture (Debezium) needs logical; restart it with: infra/postgres.sh restart"
  fi
}

stop() {
  if [ "${1:-}" = "--kill" ]; then
    onceflow_stop_pid PostgreSQL "$PIDFILE" 30 KILL
  elif answers || [ -f "$PIDFILE" ]; then
    onceflow_say "stopping PostgreSQL on port $ONCEFLOW_PG_PORT"
    as_owner "$BINDIR/pg_ctl" -D "$ONCEFLOW_PG_DATA" -m fast -w -t 60 stop >/dev/null \
      || onceflow_stop_pid PostgreSQL "$PIDFILE" 30 KILL
  else
    onceflow_say "PostgreSQL is not running"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) shift; stop "$@" ;;
  restart) stop; start ;;
  status) answers ;;
  psql) shift; sql -d "$ONCEFLOW_PG_DATABASE" "$@" ;;
  *) echo "usage: $0 start|stop [--kill]|restart|status|psql" >&2; exit 2 ;;
esac
