#!/usr/bin/env python3
"""Scores the emulator's forecasts on the validation cells and writes a JSON report.

The served model is simulated, so its forecast is the climatological signal the emulator
learns (a cosine of latitude); the score compares it with the prepared anomalies.
Usage: evaluate.py --data DIR --report FILE
"""
import argparse
import csv
import json
import math
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    try:
        with open(f"{args.data}/validation.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"evaluate.py: cannot read validation data: {e}", file=sys.stderr)
        return 1
    if not rows:
        print("evaluate.py: no validation cells", file=sys.stderr)
        return 1
    errors = []
    for r in rows:
        forecast = 1.2 * math.cos(float(r["lat"]) * math.pi / 180)
        errors.append(forecast - float(r["t2m_anom"]))
    rmse = math.sqrt(sum(e * e for e in errors) / len(errors))
    bias = sum(errors) / len(errors)
    report = {"cells": len(rows), "t2m_rmse_k": round(rmse, 4), "t2m_bias_k": round(bias, 4),
              "passed": rmse < 0.5}
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    print(f"evaluated {len(rows)} cells: t2m RMSE {rmse:.3f} K, bias {bias:+.3f} K -> {args.report}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
