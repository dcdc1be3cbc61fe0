#!/bin/bash
# Debezium reads the WAL over a replication connection, which pg_hba.conf must allow from the other
# containers (the image's own line covers ordinary connections only). Run once, when the volume is new.
set -euo pipefail
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
