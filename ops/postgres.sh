#!/usr/bin/env bash
# ops/postgres.sh start: make sure the local PostgreSQL 15 cluster exists and runs (with or
# without systemd), and that the schema owner role `trnflow` (may create databases and roles,
# for tests and `trnflow project`) and the `trnflow` database exist. The owner's password is
# generated here and kept in /etc/trnflow/owner.url, readable by root only.
# ops/postgres.sh daemon-login: after `trnflow db migrate`, let the catalog's daemon role log
# in with a generated password, kept in /etc/trnflow/daemon.url (root only).
# ops/postgres.sh test-tablespace: the tablespace trnflow_tests on tmpfs
# (/dev/shm/trnflow-test-catalogs), where the test suite makes its catalogs (ops/test.sh,
# tests/README.md); made again, empty, when a reboot emptied the tmpfs. Never for a real catalog.
# Idempotent; passwords already generated are kept.
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

conf=${TRNFLOW_CONFIG_DIR:-/etc/trnflow}
psql_admin() { su postgres -c "psql -v ON_ERROR_STOP=1 -qAt -p $port -d ${DB:-postgres}" ; }
secret() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
# Writes a URL file readable by root only; the password never appears on a command line.
write_url() {  # file user password
  install -d -m 0755 "$conf"
  (umask 077 && printf 'postgresql://%s:%s@localhost:%s/trnflow\n' "$2" "$3" "$port" >"$conf/$1.tmp")
  mv "$conf/$1.tmp" "$conf/$1"
}
# Sets a role's password from stdin's SQL, so no password shows in `ps`.
set_password() {  # role password [options]
  printf "ALTER ROLE %s %s PASSWORD '%s';\n" "$1" "${3:-LOGIN}" "$2" | psql_admin >/dev/null
}

case "${1:-start}" in
start)
  if [ "$(echo "SELECT 1 FROM pg_roles WHERE rolname = 'trnflow'" | psql_admin)" != 1 ]; then
    echo "== creating role trnflow (schema owner)"
    echo "CREATE ROLE trnflow LOGIN CREATEDB CREATEROLE" | psql_admin >/dev/null
  fi
  # A password from before (the old fixed one included) is replaced by a generated one.
  if [ ! -s "$conf/owner.url" ]; then
    echo "== generating the schema owner's password ($conf/owner.url)"
    pw=$(secret)
    set_password trnflow "$pw" "LOGIN CREATEDB CREATEROLE"
    write_url owner.url trnflow "$pw"
  fi
  if [ "$(echo "SELECT 1 FROM pg_database WHERE datname = 'trnflow'" | psql_admin)" != 1 ]; then
    echo "== creating database trnflow"
    echo "CREATE DATABASE trnflow OWNER trnflow" | psql_admin >/dev/null
  fi
  # Nobody but the owner creates objects in the catalog's database, and only the catalog's own
  # roles connect to it (granted by `trnflow db migrate`, migration 0024).
  echo "REVOKE CREATE ON SCHEMA public FROM PUBLIC; REVOKE ALL ON DATABASE trnflow FROM PUBLIC" |
    DB=trnflow psql_admin >/dev/null
  ;;
daemon-login)
  role=$(echo "SELECT trnflow.daemon_role()" | DB=trnflow psql_admin)
  # Also when the URL no longer logs in (the catalog was made anew and its role with it).
  if [ ! -s "$conf/daemon.url" ] || ! grep -q "://$role:" "$conf/daemon.url" ||
     ! PGCONNECT_TIMEOUT=5 psql -w "$(head -n1 "$conf/daemon.url")" -Atc 'SELECT 1' >/dev/null 2>&1; then
    echo "== generating the daemons' password ($conf/daemon.url, role $role)"
    pw=$(secret)
    set_password "$role" "$pw"
    write_url daemon.url "$role" "$pw"
  fi
  ;;
test-tablespace)
  # A database is ~1,000 files; on this disk PostgreSQL spends ~0.5 s of kernel time creating
  # them, on tmpfs 40 ms, and the suite makes one per test.
  dir=/dev/shm/trnflow-test-catalogs
  ts=trnflow_tests
  loc=$(echo "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = '$ts'" | psql_admin)
  if [ -n "$loc" ] && ! compgen -G "$loc/PG_*" >/dev/null; then
    # The tmpfs was emptied (a reboot): the test catalogs in it are gone; so goes the rest.
    echo "== dropping tablespace $ts (its directory $loc is gone)"
    for db in $(echo "SELECT datname FROM pg_database d JOIN pg_tablespace t ON t.oid = d.dattablespace WHERE t.spcname = '$ts'" | psql_admin); do
      echo "DROP DATABASE \"$db\" WITH (FORCE)" | psql_admin >/dev/null 2>&1 || true
    done
    echo "DROP TABLESPACE $ts" | psql_admin >/dev/null
    loc=
  fi
  if [ -z "$loc" ]; then
    echo "== creating tablespace $ts in $dir (tmpfs; for the tests' catalogs)"
    rm -rf "$dir"
    install -d -o postgres -g postgres -m 0700 "$dir"
    echo "CREATE TABLESPACE $ts LOCATION '$dir'" | psql_admin >/dev/null
  fi
  echo "GRANT CREATE ON TABLESPACE $ts TO trnflow" | psql_admin >/dev/null
  ;;
*)
  echo "usage: ops/postgres.sh [start|daemon-login|test-tablespace]" >&2
  exit 2
  ;;
esac
