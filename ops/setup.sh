#!/usr/bin/env bash
# Idempotent set-up on Debian 12, as root: installs every dependency from Debian's packages,
# builds into build/, makes sure a local PostgreSQL 15 runs, creates the schema owner and the
# catalog database with generated passwords (/etc/trnflow, root only), applies migrations and
# lets the daemons' least-privilege role log in. Safe to run again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libpqxx-dev libtbb-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libboost-dev
  libboost-filesystem-dev libssl-dev libcli11-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  postgresql-15 python3 procps
  clang libclang-rt-14-dev python3-yaml python3-jsonschema libhowardhinnant-date-dev tzdata
  slurmctld slurmd slurm-client munge util-linux bubblewrap
  slurmdbd slurm-wlm-mysql-plugin mariadb-server
  libcpp-httplib-dev chromium prometheus
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "ops/setup.sh: missing packages (${missing[*]}); run it as root to install them" >&2
    exit 1
  fi
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The test Slurm (ops/slurm.sh) runs its own MariaDB and slurmdbd: the packages' system
  # services are not started (a policy-rc.d for this install, unless the host has its own).
  policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# ops/setup.sh, while it installs\ncase "$1" in mariadb|mysql|slurmdbd) exit 101;; esac\nexit 0\n' > "$policy"
    chmod 0755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ -n "$policy" ]]; then rm -f "$policy"; trap - EXIT; fi
  # Nor started at boot, when this run installed them.
  for pkg_service in mariadb-server:mariadb slurmdbd:slurmdbd; do
    if [[ " ${missing[*]} " == *" ${pkg_service%%:*} "* ]]; then
      update-rc.d "${pkg_service#*:}" disable >/dev/null 2>&1 || true
      systemctl disable "${pkg_service#*:}" >/dev/null 2>&1 || true
    fi
  done
fi

echo "== building into build/"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"

ops/postgres.sh start

echo "== applying migrations"
build/trnflow db migrate
ops/postgres.sh daemon-login
