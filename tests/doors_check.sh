#!/usr/bin/env bash
# The catalog's doors hold (schema/worker_catalog.h, schema/scheduler_catalog.h): no file under
# workers/ or scheduler/ includes schema/catalog.h (nor catalog_impl.h or catalog_testing.h) or
# names schema::Catalog; each holds its door. sim::Catalog, the hardware catalog, is another
# class and may be named.
#   doors_check.sh ROOT       checks the tree at ROOT; exit 1 listing each breach as FILE:LINE
#   doors_check.sh --self-test  plants breaches in a scratch tree and checks they are caught
set -u

check() {
  local root=$1 found=0 f
  for dir in workers scheduler; do
    [ -d "$root/$dir" ] || { echo "doors_check: no $root/$dir" >&2; return 2; }
  done
  while IFS= read -r f; do
    local hits
    hits=$(grep -nE '#[[:space:]]*include[[:space:]]*[<"]schema/catalog(_impl|_testing)?\.h[">]' "$f")
    # Catalog as a word, unless it is sim::Catalog.
    hits+=$'\n'$(sed -E 's/sim::Catalog\b//g' "$f" | grep -nE '\bCatalog\b')
    while IFS= read -r h; do
      [ -n "$h" ] || continue
      echo "${f#"$root"/}:$h"
      found=1
    done <<<"$hits"
  done < <(find "$root/workers" "$root/scheduler" -type f \( -name '*.h' -o -name '*.cpp' \) | sort)
  if [ "$found" -ne 0 ]; then
    echo "doors_check: the lines above reach past their door: include schema/worker_catalog.h" \
         "(workers/) or schema/scheduler_catalog.h (scheduler/) and hold a WorkerCatalog or" \
         "SchedulerCatalog; add a method to the door if the consumer needs one" >&2
    return 1
  fi
  return 0
}

self_test() {
  local tmp rc fail=0
  tmp=$(mktemp -d) || return 2
  trap 'rm -rf "$tmp"' RETURN
  plant() {  # plant NAME DIR CONTENT EXPECTED_RC
    rm -rf "$tmp/t" && mkdir -p "$tmp/t/workers" "$tmp/t/scheduler"
    printf '%s\n' "$3" >"$tmp/t/$2/x.cpp"
    check "$tmp/t" >/dev/null 2>&1
    rc=$?
    if [ "$rc" -ne "$4" ]; then echo "self-test $1: exit $rc, expected $4"; fail=1; fi
  }
  plant clean workers '#include "schema/worker_catalog.h"
const sim::Catalog& hw = sim::Catalog::Builtin();  // the hardware catalog
void F(schema::WorkerCatalog& c);' 0
  plant include workers '#include "schema/catalog.h"' 1
  plant include_impl scheduler '#include <schema/catalog_impl.h>' 1
  plant include_testing workers '#  include "schema/catalog_testing.h"' 1
  plant named scheduler 'void F(schema::Catalog& c);' 1
  plant unqualified workers 'using schema::Catalog; std::unique_ptr<Catalog> c;' 1
  [ "$fail" -eq 0 ] && echo "doors_check self-test: every planted breach caught"
  return "$fail"
}

if [ "${1:-}" = "--self-test" ]; then self_test; exit; fi
[ $# -eq 1 ] || { echo "usage: doors_check.sh ROOT | --self-test" >&2; exit 2; }
check "$1"
