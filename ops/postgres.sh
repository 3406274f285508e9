#!/usr/bin/env bash
# ops/postgres.sh start: make sure the local PostgreSQL 15 cluster exists and runs (with or
# without systemd), and that the trnflow role (password trnflow, may create databases for
# tests) and database exist. Idempotent.
set -euo pipefail
ver=15
cluster=main

if ! pg_lsclusters -h 2>/dev/null | awk '{print $1"/"$2}' | grep -qx "$ver/$cluster"; then
  echo "== creating PostgreSQL cluster $ver/$cluster"
  pg_createcluster "$ver" "$cluster" >/dev/null
fi
status=$(pg_lsclusters -h | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {print $4}')
if [ "$status" != "online" ]; then
  echo "== starting PostgreSQL $ver/$cluster"
  # A stale pid file from a killed server would stop it from starting.
  pidfile=/var/lib/postgresql/$ver/$cluster/postmaster.pid
  if [ -f "$pidfile" ] && ! kill -0 "$(head -1 "$pidfile")" 2>/dev/null; then rm -f "$pidfile"; fi
  pg_ctlcluster "$ver" "$cluster" start
fi
port=$(pg_lsclusters -h | awk -v v="$ver" -v c="$cluster" '$1==v && $2==c {print $3}')
for _ in $(seq 1 50); do
  pg_isready -q -h localhost -p "$port" && break
  sleep 0.2
done

psql_admin() { su postgres -c "psql -v ON_ERROR_STOP=1 -qAt -p $port $*"; }
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_roles WHERE rolname = 'trnflow'\"")" != 1 ]; then
  echo "== creating role trnflow"
  psql_admin "-c \"CREATE ROLE trnflow LOGIN PASSWORD 'trnflow' CREATEDB CREATEROLE\""
fi
if [ "$(psql_admin "-c \"SELECT 1 FROM pg_database WHERE datname = 'trnflow'\"")" != 1 ]; then
  echo "== creating database trnflow"
  psql_admin "-c \"CREATE DATABASE trnflow OWNER trnflow\""
fi
