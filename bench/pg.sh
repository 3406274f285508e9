#!/usr/bin/env bash
# Private PostgreSQL 15 instance for benchmarks.
#
#   bench/pg.sh start DIR PORT   initdb DIR if empty/missing, start if not running,
#                                wait until ready, ensure role+db "bench" exist, then
#                                print  postgresql://bench:bench@127.0.0.1:PORT/bench
#   bench/pg.sh stop DIR         fast shutdown (no-op if not running)
#
# Default durability settings (fsync, synchronous_commit, full_page_writes all ON).
# Only max_connections=200 is changed; the server listens on 127.0.0.1:PORT only and
# its unix socket lives in DIR. When run as root the binaries run as the "postgres"
# OS user (DIR is chowned to it); otherwise as the current user.
# Nothing is printed on success except the URL line of "start"; errors go to stderr.
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}

die() { echo "pg.sh: $*" >&2; exit 1; }
usage() { die "usage: $0 start DIR PORT | $0 stop DIR"; }

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
[ -x "$PGBIN/postgres" ] || die "PostgreSQL binaries not found in $PGBIN"

# absolute DIR (it may not exist yet)
case "$dir" in
  /*) ;;
  *) dir="$PWD/$dir" ;;
esac
dir=${dir%/}

if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' OS user"
  as_pg() { (cd / && runuser -u postgres -- "$@"); }
else
  as_pg() { "$@"; }
fi

# Print the server log tail on failure, to stderr.
log_tail() {
  if [ -f "$dir/postgres.log" ]; then
    echo "--- last lines of $dir/postgres.log ---" >&2
    tail -n 20 "$dir/postgres.log" >&2 || true
  fi
}

is_running() {
  [ -f "$dir/PG_VERSION" ] || return 1
  as_pg "$PGBIN/pg_ctl" status -D "$dir" >/dev/null 2>&1
}

running_port() {
  # postmaster.pid line 4 is the port
  sed -n 4p "$dir/postmaster.pid" 2>/dev/null || true
}

do_start() {
  local port=$1
  case "$port" in
    ''|*[!0-9]*) die "PORT must be a number, got '$port'" ;;
  esac

  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown postgres:postgres "$dir"
    chmod 700 "$dir"
    # every parent directory must be traversable by postgres
    as_pg test -x "$dir" || die "user postgres cannot reach $dir (check the permissions of its parent directories)"
  fi

  if [ ! -f "$dir/PG_VERSION" ]; then
    if [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
      die "$dir is neither empty nor a PostgreSQL data directory"
    fi
    local ilog
    ilog=$(mktemp)
    as_pg "$PGBIN/initdb" -D "$dir" --auth-local=trust --auth-host=scram-sha-256 \
      --encoding=UTF8 --locale=C.UTF-8 >"$ilog" 2>&1 \
      || { cat "$ilog" >&2; rm -f "$ilog"; die "initdb failed"; }
    rm -f "$ilog"
    # Non-durability settings only. fsync/synchronous_commit stay at their defaults (on).
    as_pg tee -a "$dir/postgresql.conf" >/dev/null <<EOF

# --- added by bench/pg.sh ---
max_connections = 200
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
EOF
  fi
  # Where the time goes, per statement (the benchmarks read it before and after a workload).
  if ! grep -q "^shared_preload_libraries = 'pg_stat_statements'" "$dir/postgresql.conf"; then
    as_pg tee -a "$dir/postgresql.conf" >/dev/null <<EOF
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = top
EOF
    if is_running; then
      as_pg "$PGBIN/pg_ctl" restart -D "$dir" -l "$dir/postgres.log" -w -t 60 -m fast >/dev/null 2>&1 \
        || { log_tail; die "could not restart PostgreSQL in $dir with pg_stat_statements"; }
    fi
  fi

  if is_running; then
    local rp
    rp=$(running_port)
    [ "$rp" = "$port" ] || die "server in $dir is already running on port $rp, not $port"
  else
    # A stale postmaster.pid from a crash is handled by pg_ctl/postgres itself.
    if ! as_pg "$PGBIN/pg_ctl" start -D "$dir" -l "$dir/postgres.log" -w -t 60 \
         -o "-p $port" >/dev/null 2>&1; then
      log_tail
      die "could not start PostgreSQL in $dir on port $port"
    fi
  fi

  local i
  for i in $(seq 1 120); do
    if "$PGBIN/pg_isready" -q -h "$dir" -p "$port"; then break; fi
    [ "$i" = 120 ] && { log_tail; die "server did not become ready"; }
    sleep 0.5
  done
  for i in $(seq 1 40); do
    if "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port"; then break; fi
    [ "$i" = 40 ] && { log_tail; die "server does not accept TCP connections on 127.0.0.1:$port"; }
    sleep 0.25
  done

  # Superuser over the unix socket (trust auth). The superuser is the OS user that ran initdb.
  local su
  if [ "$(id -u)" = 0 ]; then su=postgres; else su=$(id -un); fi
  psql_su() {
    as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U "$su" -d postgres "$@"
  }
  psql_su >/dev/null <<'EOF' || die "could not create role/database bench"
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bench') THEN
    CREATE ROLE bench LOGIN CREATEDB CREATEROLE PASSWORD 'bench';  -- trnflow's migrations add roles
  ELSE
    ALTER ROLE bench LOGIN CREATEDB CREATEROLE PASSWORD 'bench';
  END IF;
END
$$;
-- Benchmarks settle a bulk load (claim_bench's history) with a checkpoint before measuring.
GRANT pg_checkpoint TO bench;
SELECT 'CREATE DATABASE bench OWNER bench'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'bench')\gexec
EOF

  echo "postgresql://bench:bench@127.0.0.1:$port/bench"
}

do_stop() {
  [ -f "$dir/PG_VERSION" ] || return 0
  if is_running; then
    as_pg "$PGBIN/pg_ctl" stop -D "$dir" -m fast -w -t 120 >/dev/null 2>&1 \
      || { log_tail; die "could not stop PostgreSQL in $dir"; }
  fi
}

case "$cmd" in
  start) [ $# -eq 3 ] || usage; do_start "$3" ;;
  stop)  [ $# -eq 2 ] || usage; do_stop ;;
  *) usage ;;
esac
