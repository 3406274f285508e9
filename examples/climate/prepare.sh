#!/usr/bin/env bash
# Prepares a synthetic regional reanalysis: one CSV of grid cells with temperature,
# humidity and pressure anomalies, split into train and validation sets, plus a manifest.
# Usage: prepare.sh --out DIR [--cells N]
set -euo pipefail
out="" cells=4096
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --cells) cells="$2"; shift 2 ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "prepare.sh: --out DIR is required" >&2; exit 2; }
mkdir -p "$out"
echo "preparing $cells grid cells into $out"
awk -v n="$cells" -v seed="${TRNFLOW_RUN_ID:-1}" 'BEGIN {
  srand(seed); print "cell,lat,lon,t2m_anom,rh_anom,msl_anom"
  for (i = 0; i < n; i++) {
    lat = -60 + 120 * rand(); lon = -180 + 360 * rand()
    t = 1.2 * cos(lat * 3.14159 / 180) + 0.5 * (rand() - 0.5)
    printf "%d,%.3f,%.3f,%.4f,%.4f,%.3f\n", i, lat, lon, t, 0.1 * (rand() - 0.5), 2 * (rand() - 0.5)
  }
}' > "$out/grid.csv"
total=$(($(wc -l < "$out/grid.csv") - 1))
train=$((total * 9 / 10))
head -n $((train + 1)) "$out/grid.csv" > "$out/train.csv"
{ head -n 1 "$out/grid.csv"; tail -n +$((train + 2)) "$out/grid.csv"; } > "$out/validation.csv"
printf '{"cells": %d, "train": %d, "validation": %d}\n' "$total" "$train" "$((total - train))" \
  > "$out/manifest.json"
echo "wrote $total cells: $train train, $((total - train)) validation"
