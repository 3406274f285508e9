#!/usr/bin/env bash
# Installs trnflow's daemons on this host, as root, from a checkout built by ops/setup.sh:
#   - the binary in PREFIX/bin and the systemd units, whose ExecStart names that binary
#     (`cmake --install`; PREFIX is /opt/trnflow);
#   - the system user `trnflow` (no login shell, no home) that the scheduler runs as;
#   - /etc/trnflow (0755) with env (0600: TRNFLOW_DATABASE_URL from daemon.url if there is one),
#     and /var/lib/trnflow (0755), the workers' TRNFLOW_HOME;
#   - the dashboard's proxy secret, /etc/trnflow/serve-proxy.secret (0600, the trnflow user's),
#     serve-proxy.nginx.conf (0600, root's) for nginx to include, and, when a prometheus user
#     exists, a copy for it in /etc/prometheus/trnflow-serve.secret (docs/serve.md).
# It enables nothing: `systemctl enable --now trnflow-scheduler trnflow-worker@NAME` does.
# Idempotent: run it again after every upgrade.
#
#   ops/install.sh [--prefix DIR] [--build DIR]
#
# DESTDIR=/some/root installs into that tree instead of / (packaging, tests): files go under
# it and the user is added to DESTDIR/etc/passwd (useradd --prefix).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=/opt/trnflow
build=build
while (($#)); do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ops/install.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
root="${DESTDIR:-}"
config=/etc/trnflow  # the units read /etc/trnflow/env and /etc/trnflow/pools-NAME

if [[ $(id -u) -ne 0 ]]; then
  echo "ops/install.sh: run it as root (it creates a system user and writes to $prefix)" >&2
  exit 2
fi
if [[ ! -x "$build/trnflow" ]]; then
  echo "ops/install.sh: $build/trnflow is missing: run ops/setup.sh first (it builds it)" >&2
  exit 2
fi

echo "== installing $build/trnflow and the systemd units under ${root:-/}"
DESTDIR="$root" cmake --install "$build" --prefix "$prefix"

echo "== the service user"
if grep -q '^trnflow:' "$root/etc/passwd"; then
  echo "   trnflow exists"
else
  prefix_opt=()
  [[ -n $root ]] && prefix_opt=(--prefix "$root")
  useradd "${prefix_opt[@]}" --system --user-group --no-create-home \
    --home-dir /nonexistent --shell /usr/sbin/nologin --comment "trnflow scheduler" trnflow
  echo "   created trnflow"
fi

echo "== $config and /var/lib/trnflow"
install -d -m 0755 "$root$config" "$root/var/lib/trnflow"
if [[ ! -e "$root$config/env" ]]; then
  if [[ -r "$root$config/daemon.url" ]]; then
    (umask 077; echo "TRNFLOW_DATABASE_URL=$(cat "$root$config/daemon.url")" > "$root$config/env")
    echo "   wrote $config/env from $config/daemon.url"
  else
    (umask 077; echo "# TRNFLOW_DATABASE_URL=postgresql://trnflow_daemon:PASSWORD@HOST:5432/trnflow" \
      > "$root$config/env")
    echo "   wrote $config/env: put the daemons' URL in it (ops/postgres.sh daemon-login makes one)"
  fi
fi

echo "== the dashboard's proxy secret"
secret_file="$root$config/serve-proxy.secret"
if [[ ! -s $secret_file ]]; then
  (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$secret_file"; echo >> "$secret_file")
  echo "   made $config/serve-proxy.secret"
fi
chmod 0600 "$secret_file"
if [[ -n $root ]]; then
  chown "$(awk -F: '$1 == "trnflow" {print $3 ":" $4}' "$root/etc/passwd")" "$secret_file"
else
  chown trnflow:trnflow "$secret_file"
fi
(umask 077; printf 'proxy_set_header X-Trnflow-Proxy-Secret "%s";\n' "$(head -n1 "$secret_file")" \
  > "$root$config/serve-proxy.nginx.conf")
if [[ -z $root ]] && id prometheus > /dev/null 2>&1 && [[ -d /etc/prometheus ]]; then
  install -m 0600 -o prometheus -g prometheus "$secret_file" /etc/prometheus/trnflow-serve.secret
  echo "   copied it for prometheus: /etc/prometheus/trnflow-serve.secret"
fi

if [[ -z $root && -d /run/systemd/system ]]; then
  systemctl daemon-reload
fi
echo "== done. Next: echo 'TRNFLOW_POOLS=--pool trn1=4' > $config/pools-trn1 and"
echo "   systemctl enable --now trnflow-scheduler trnflow-worker@trn1"
