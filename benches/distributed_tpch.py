#!/usr/bin/env python3
"""TPC-H Q1-Q22 over Parquet on an in-memory cluster of datafusion-distributed workers
(`mphf sql --workers N`), with the MPHF operators on and off, in the same processes.

Usage: benches/distributed_tpch.py BIN DATA_DIR [--workers N] [--processes P] [--runs R]
       [--tune NAME=VALUE ...]

DATA_DIR holds the eight tables as `<table>.parquet` (made with `BIN tpch --scale SF --output
DATA_DIR` when missing). Each process registers the tables (the first one builds and saves the
indexes of `sql-tests/tpch_queries.slt`, later ones load them), then runs every query R times
with the operators on and R times with them off, interleaved. Prints a markdown table of the
median of all timed runs (the first run of each query and mode in a process is a warm-up) and
the ratio off/on, and checks that both modes gave the same row count. `--tune` changes one of
the MPHF planner's thresholds (`mphf sql --tune`) in every process.
"""
import argparse
import pathlib
import re
import statistics
import subprocess
import sys

TABLES = ["lineitem", "orders", "customer", "part", "partsupp", "supplier", "nation", "region"]
ROOT = pathlib.Path(__file__).resolve().parent.parent


def slt_statements():
    lines = (ROOT / "sql-tests" / "tpch_queries.slt").read_text().splitlines()
    indexes = [l.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1) for l in lines if l.startswith("CREATE INDEX")]
    queries = [lines[i + 2] for i in range(len(lines) - 2) if lines[i].startswith("# Q") and lines[i + 1].startswith("query")]
    return indexes, queries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("data")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tune", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args()
    data = pathlib.Path(a.data)
    if not (data / "lineitem.parquet").exists():
        subprocess.run([a.bin, "tpch", "--scale", "1", "--output", str(data)], check=True)
    indexes, queries = slt_statements()
    tables = [f"--table={t}={data / (t + '.parquet')}" for t in TABLES]
    on = "SET mphf.enable_aggregate = true; SET mphf.enable_join = true"
    off = "SET mphf.enable_aggregate = false; SET mphf.enable_join = false"
    times = {(q, m): [] for q in range(len(queries)) for m in ("on", "off")}
    rows = {}
    for p in range(a.processes):
        cmds = []
        for s in indexes:
            cmds += ["-c", s]
        order = []
        for q, sql in enumerate(queries):
            for r in range(a.runs + 1):
                for mode, setting in (("on", on), ("off", off)):
                    for s in setting.split("; "):
                        cmds += ["-c", s]
                    cmds += ["-c", sql]
                    order.append((q, mode, r))
        out = subprocess.run(
            [a.bin, "sql", "--workers", str(a.workers), "--format", "csv", *tables,
             *[f"--tune={t}" for t in a.tune], *cmds],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.exit(f"process {p} failed:\n{out.stderr[-4000:]}")
        found = [(int(n), float(t)) for n, t in re.findall(r"^(\d+) row\(s\) in ([0-9.]+) s$", out.stderr, re.M)]
        # Every statement prints a line: the indexes first, then two settings and the query.
        timed = found[len(indexes):][2::3]
        if len(timed) != len(order):
            sys.exit(f"process {p}: {len(found)} timing lines, expected {len(indexes) + 3 * len(order)}")
        for (q, mode, r), (n, t) in zip(order, timed):
            if rows.setdefault((q, p, r), n) != n:
                sys.exit(f"Q{q + 1}: {mode} gave {n} rows, the other mode {rows[(q, p, r)]}")
            if r > 0:
                times[(q, mode)].append(t)
    print(f"| query | MPHF on (ms) | MPHF off (ms) | off / on |")
    print("|---|---|---|---|")
    ratios = []
    for q in range(len(queries)):
        on_ms = statistics.median(times[(q, "on")]) * 1e3
        off_ms = statistics.median(times[(q, "off")]) * 1e3
        ratios.append(off_ms / on_ms)
        print(f"| Q{q + 1} | {on_ms:.1f} | {off_ms:.1f} | {off_ms / on_ms:.2f}x |")
    print(f"| geometric mean | | | {statistics.geometric_mean(ratios):.2f}x |")


if __name__ == "__main__":
    main()
