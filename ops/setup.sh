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
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "== building into build/"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)"

ops/postgres.sh start

echo "== applying migrations"
build/trnflow db migrate
ops/postgres.sh daemon-login
