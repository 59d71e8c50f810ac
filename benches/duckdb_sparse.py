#!/usr/bin/env python3
"""DuckDB on the data and queries of `mphf bench sparse`.

`mphf bench sparse --parquet DIR` writes the `events` and `dims` tables as
Parquet (`DIR/events/part-NN.parquet`, `DIR/dims/part-00.parquet`) and the
queries it ran (labels and SQL) as `DIR/queries.json`; the folder is kept. This
script creates DuckDB views over those files, runs the very same SQL texts (so
the two cannot drift), each query `--runs` times, and prints the median times
in ms as a Markdown table. Each result is materialized inside DuckDB (`CREATE
TEMP TABLE ... AS`), as DataFusion's `collect()` materializes Arrow batches, so
no Python conversion of the rows is timed; its row count is checked against
the bench's when `--json` is given.

With `--json FILE` (written by `mphf bench sparse --json FILE`), the table also
shows the bench's Parquet-mode medians of vanilla DataFusion and the MPHF
session, and the ratios DuckDB / mphf and DuckDB / vanilla (above 1: DuckDB is
slower).

    target/release/mphf bench sparse --rows 2000000 --parquet /tmp/sparse --json /tmp/sparse.json
    python3 benches/duckdb_sparse.py /tmp/sparse --json /tmp/sparse.json [--runs 5] [--threads N]

Without DuckDB's Python package it prints a notice and exits 0; it exits 1 when
a result's row count differs from the bench's.
"""

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="the --parquet folder of `mphf bench sparse`")
    p.add_argument("--json", type=Path, help="the --json file of `mphf bench sparse`")
    p.add_argument("--runs", type=int, default=5, help="runs per query (the median is shown)")
    p.add_argument("--threads", type=int, help="DuckDB threads (default: DuckDB's, all cores)")
    p.add_argument("--only", action="append", default=[], help="labels containing this text")
    args = p.parse_args()
    if args.runs < 1:
        p.error("--runs must be at least 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be at least 1")
    return args


def load_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        sys.exit(f"duckdb_sparse: cannot read {path}: {err}")


def connect(duckdb, folder: Path, tables: dict, threads):
    con = duckdb.connect()
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    for view, sub in tables.items():
        files = sorted((folder / sub).glob("*.parquet"))
        if not files:
            sys.exit(f"duckdb_sparse: no Parquet files in {folder / sub}")
        pattern = str(folder / sub / "*.parquet").replace("'", "''")
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet('{pattern}')")
    return con


def time_query(con, sql: str, runs: int):
    """Median ms over `runs` of materializing `sql`'s result, and its row count."""
    times = []
    for _ in range(runs):
        con.execute("DROP TABLE IF EXISTS bench_result")
        t = time.perf_counter()
        con.execute(f"CREATE TEMP TABLE bench_result AS {sql}")
        times.append((time.perf_counter() - t) * 1e3)
    rows = con.execute("SELECT count(*) FROM bench_result").fetchone()[0]
    con.execute("DROP TABLE bench_result")
    return statistics.median(times), rows


def bench_medians(report: dict) -> dict:
    """(vanilla ms, mphf ms, result rows) of the bench's Parquet mode, by label."""
    return {
        r["label"]: (r["vanilla_ms"], r["mphf_ms"], r["result_rows"])
        for r in report.get("results", [])
        if r.get("mode") == "parquet"
    }


def main() -> int:
    args = parse_args()
    try:
        duckdb = importlib.import_module("duckdb")
    except ImportError:
        print("duckdb_sparse: DuckDB's Python package is not installed (pip install duckdb); skipping")
        return 0
    spec = load_json(args.dir / "queries.json")
    ours = bench_medians(load_json(args.json)) if args.json else {}
    only = [o.lower() for o in args.only]
    queries = [q for q in spec["queries"] if not only or any(o in q["label"].lower() for o in only)]
    con = connect(duckdb, args.dir, spec["tables"], args.threads)
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    print(f"DuckDB {duckdb.__version__}, {threads} threads, {args.runs} runs, data in {args.dir}")
    if ours:
        print("| query | DuckDB ms | vanilla ms | mphf ms | DuckDB / mphf | DuckDB / vanilla | same row count |")
        print("|---|---|---|---|---|---|---|")
    else:
        print("| query | DuckDB ms | result rows |")
        print("|---|---|---|")
    mismatches = 0
    for q in queries:
        ms, rows = time_query(con, q["sql"], args.runs)
        if q["label"] in ours:
            v, m, their_rows = ours[q["label"]]
            same = rows == their_rows
            mismatches += not same
            print(
                f"| {q['label']} | {ms:.1f} | {v:.1f} | {m:.1f} | {ms / m:.2f}× | {ms / v:.2f}× | "
                f"{'yes' if same else f'NO ({rows} vs {their_rows})'} |"
            )
        else:
            print(f"| {q['label']} | {ms:.1f} | {rows} |")
    if mismatches:
        print(f"duckdb_sparse: {mismatches} queries returned a different number of rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
