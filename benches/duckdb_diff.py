#!/usr/bin/env python3
"""Differential test: the `mphf` binary's query results against DuckDB's.

`mphf difftest` writes Parquet tables (one `*.parquet` per table, the file stem
being the table name) and `queries.jsonl` (each query's SQL, declared column
types and the rows our engine returned) into a folder. This script runs it for
each seed (and once for TPC-H), loads the same Parquet files into an in-memory
DuckDB, runs every query marked `"duckdb": true` there and compares the rows:
integers exactly, floats and decimals with a relative tolerance of 1e-9 (decimals
also within 1e-6: DataFusion rounds a decimal avg to 6 digits), other
types as strings; in order when the query's ORDER BY fixes it, else as
multisets.

Run from the repository root, after `cargo build --release --features cli`:

    python3 benches/duckdb_diff.py [--mphf target/release/mphf] [--seeds 1,2]
        [--queries 1500] [--tpch-sf 1] [--work DIR] [--keep]

An existing difftest folder can be checked without running `mphf`:

    python3 benches/duckdb_diff.py --check-dir DIR [--check-dir DIR2 ...]

The last line printed is `duckdb_diff: N passed, M failed[, K skipped]`; the
exit status is 1 when anything failed, else 0 (also 0, with a message, when
DuckDB's Python package is not installed).
"""

import argparse
import datetime
import importlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

REL_TOL = 1e-9
ABS_TOL = 1e-9
# A decimal `avg` is rounded to its result type's scale (6 digits) in DataFusion, not in DuckDB.
DECIMAL_ABS_TOL = 1e-6
SORT_DIGITS = 9
MAX_SHOWN_ROWS = 5
NUMERIC_TYPES = ("float", "decimal")


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def summary(self) -> str:
        line = f"duckdb_diff: {self.passed} passed, {self.failed} failed"
        return line + (f", {self.skipped} skipped" if self.skipped else "")


# ---------------------------------------------------------------- arguments


def default_mphf() -> Path:
    target = Path(__file__).resolve().parent.parent / "target"
    release = target / "release" / "mphf"
    return release if release.exists() else target / "debug" / "mphf"


def seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="duckdb_diff.py",
        description="Compare the query results of `mphf difftest` against DuckDB "
        "on the same Parquet files.",
    )
    parser.add_argument("--mphf", type=Path, default=default_mphf(), metavar="PATH",
                        help="the mphf binary (default: target/release/mphf if it "
                        "exists, else target/debug/mphf)")
    parser.add_argument("--seeds", type=seed_list, default=[1, 2], metavar="LIST",
                        help="comma-separated difftest seeds (default: 1,2)")
    parser.add_argument("--queries", type=int, default=1500, metavar="N",
                        help="queries per seed (default: 1500)")
    parser.add_argument("--tpch-sf", type=float, default=1, metavar="F",
                        help="TPC-H scale factor; 0 skips TPC-H (default: 1)")
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="working folder, left in place (default: a fresh "
                        "temporary folder, removed at the end unless --keep)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary working folder")
    # Hidden: compare an existing difftest folder without running mphf; repeatable.
    parser.add_argument("--check-dir", type=Path, action="append", default=[], metavar="DIR",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.check_dir and not args.mphf.is_file():
        parser.error(f"mphf binary not found: {args.mphf} (build it or pass --mphf)")
    return args


# ---------------------------------------------------------- running mphf


def run_difftest(mphf: Path, options: list[str], out_dir: Path, label: str) -> bool:
    """Run `mphf difftest OPTIONS --dir OUT_DIR`; False (after saying so) if it fails."""
    command = [str(mphf), "difftest", *options, "--dir", str(out_dir)]
    sys.stdout.flush()
    code = subprocess.run(command).returncode
    if code != 0:
        print(f"duckdb_diff: mphf difftest {label} failed (exit {code})", flush=True)
    return code == 0


def difftest_runs(args: argparse.Namespace) -> list[tuple[list[str], str, str]]:
    """(difftest options, sub-folder name, label for messages) for each run."""
    runs = [(["--seed", str(s), "--queries", str(args.queries)], f"seed-{s}", f"--seed {s}")
            for s in args.seeds]
    if args.tpch_sf:
        sf = f"{args.tpch_sf:g}"
        runs.append((["--tpch-sf", sf], "tpch", f"--tpch-sf {sf}"))
    return runs


# ------------------------------------------------------ DuckDB's values


def format_temporal(value) -> str:
    """A date or timestamp in queries.jsonl's form; anything else as str()."""
    if isinstance(value, datetime.datetime):
        text = value.replace(tzinfo=None).strftime("%Y-%m-%d %H:%M:%S")
        return text + (f".{value.microsecond:06d}" if value.microsecond else "")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def format_float(value: float):
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def duckdb_cell(kind: str, value):
    """DuckDB's Python value in queries.jsonl's encoding for a column of type KIND.

    A value that does not fit the declared type is passed on as it is, so that it
    shows up (and compares unequal) rather than raising.
    """
    if value is None:
        return None
    if kind == "int":
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return str(value)
        if isinstance(value, (float, Decimal)) and math.isfinite(value) and value == int(value):
            return str(int(value))
        return value
    if kind in NUMERIC_TYPES:
        if isinstance(value, float):
            return format_float(value)
        if isinstance(value, Decimal):
            return format(value, "f")
        return value
    if kind == "bool":
        return value
    if kind in ("date", "timestamp"):
        return format_temporal(value)
    return str(value)


# ------------------------------------------------------------ comparing


def as_number(cell):
    """A numeric cell (number, decimal string, "NaN", "inf", "-inf") as a float; None if not one."""
    if isinstance(cell, bool):
        return None
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def as_int(cell):
    """An int cell (decimal string or number) as an exact number; the cell itself if not one."""
    if isinstance(cell, str):
        try:
            return int(cell)
        except ValueError:
            return cell
    return cell


def cells_equal(kind: str, ours, theirs) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if kind == "int":
        a, b = as_int(ours), as_int(theirs)
        return not isinstance(a, (str, bool)) and not isinstance(b, (str, bool)) and a == b
    if kind in NUMERIC_TYPES:
        a, b = as_number(ours), as_number(theirs)
        if a is None or b is None:
            return False
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        abs_tol = DECIMAL_ABS_TOL if kind == "decimal" else ABS_TOL
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=abs_tol)
    if kind == "bool":
        return isinstance(ours, bool) and isinstance(theirs, bool) and ours == theirs
    return isinstance(ours, str) and isinstance(theirs, str) and ours == theirs


def rows_equal(types: list[str], ours: list, theirs: list) -> bool:
    return len(ours) == len(theirs) and all(
        cells_equal(kind, a, b) for kind, a, b in zip(types, ours, theirs))


def sort_key_cell(kind: str, cell) -> tuple:
    """NULLs first, then numbers (rounded, so float noise does not reorder), NaN, the rest."""
    if cell is None:
        return (0, 0, "")
    number = as_int(cell) if kind == "int" else as_number(cell) if kind in NUMERIC_TYPES else None
    if isinstance(number, float):
        if math.isnan(number):
            return (2, 0, "")
        if math.isfinite(number):
            number = float(f"{number:.{SORT_DIGITS}g}")
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        return (1, number, "")
    return (3, 0, json.dumps(cell, default=str))


def sorted_rows(types: list[str], rows: list) -> list:
    return sorted(rows, key=lambda row: [sort_key_cell(k, c) for k, c in zip(types, row)])


def differing_rows(types: list[str], ours: list, theirs: list) -> tuple[list, list]:
    """The first MAX_SHOWN_ROWS positions where the row lists differ, as (ours, theirs)."""
    shown_ours, shown_theirs = [], []
    for i in range(max(len(ours), len(theirs))):
        a = ours[i] if i < len(ours) else None
        b = theirs[i] if i < len(theirs) else None
        if a is None or b is None or not rows_equal(types, a, b):
            if a is not None:
                shown_ours.append(a)
            if b is not None:
                shown_theirs.append(b)
            if max(len(shown_ours), len(shown_theirs)) == MAX_SHOWN_ROWS:
                break
    return shown_ours, shown_theirs


def describe(rows: list, shown: list, counts_differ: bool) -> str:
    text = json.dumps(shown, default=str)
    return f"({len(rows)} rows) {text}" if counts_differ else text


def compare(query: dict, columns: int, theirs: list) -> list[str] | None:
    """None if DuckDB's rows match ours, else the two detail lines to print."""
    types, ours = query["types"], query["rows"]
    if columns != len(types):
        return [f"{len(types)} column(s)", f"{columns} column(s)"]
    theirs = [[duckdb_cell(k, v) for k, v in zip(types, row)] for row in theirs]
    if not query["ordered"]:
        ours, theirs = sorted_rows(types, ours), sorted_rows(types, theirs)
    if len(ours) == len(theirs) and all(rows_equal(types, a, b) for a, b in zip(ours, theirs)):
        return None
    shown_ours, shown_theirs = differing_rows(types, ours, theirs)
    counts_differ = len(ours) != len(theirs)
    return [describe(ours, shown_ours, counts_differ),
            describe(theirs, shown_theirs, counts_differ)]


# --------------------------------------------------------------- DuckDB


def open_duckdb(duckdb, folder: Path):
    """An in-memory connection with a view per Parquet file in FOLDER."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    for parquet in sorted(folder.glob("*.parquet")):
        name = parquet.stem.replace('"', '""')
        path = str(parquet.resolve()).replace("'", "''")
        con.execute(f"CREATE VIEW \"{name}\" AS SELECT * FROM read_parquet('{path}')")
    return con


def run_duckdb(con, sql: str) -> tuple[int, list]:
    cursor = con.execute(sql)
    columns = len(cursor.description) if cursor.description else 0
    return columns, cursor.fetchall()


def indent_message(message) -> str:
    lines = [line.rstrip() for line in str(message).strip().splitlines()]
    return "\n          ".join(line for line in lines if line)


def check_query(duckdb, con, query: dict, tally: Tally) -> None:
    if not query["duckdb"]:
        tally.skipped += 1
        return
    head = f"seed={query['seed']} id={query['id']}: {query['sql']}"
    try:
        columns, rows = run_duckdb(con, query["sql"])
        details = compare(query, columns, rows)
    except duckdb.Error as error:
        tally.failed += 1
        print(f"ERROR {head}\n  duckdb: {indent_message(error)}")
        return
    if details is None:
        tally.passed += 1
        return
    tally.failed += 1
    print(f"MISMATCH {head}\n  mphf:   {details[0]}\n  duckdb: {details[1]}")


def check_dir(duckdb, folder: Path, tally: Tally) -> None:
    """Compare every query in FOLDER/queries.jsonl against DuckDB."""
    queries = folder / "queries.jsonl"
    if not queries.is_file():
        tally.failed += 1
        print(f"duckdb_diff: {queries} not found")
        return
    con = open_duckdb(duckdb, folder)
    try:
        with queries.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    query = json.loads(line)
                except json.JSONDecodeError as error:
                    tally.failed += 1
                    print(f"duckdb_diff: {queries}:{number}: bad JSON: {error}")
                    continue
                check_query(duckdb, con, query, tally)
    finally:
        con.close()
    sys.stdout.flush()


# ----------------------------------------------------------------- main


def run_all(duckdb, args: argparse.Namespace, work: Path, tally: Tally) -> None:
    for options, name, label in difftest_runs(args):
        folder = work / name
        if run_difftest(args.mphf.resolve(), options, folder, label):
            check_dir(duckdb, folder, tally)
        else:
            tally.failed += 1


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        duckdb = importlib.import_module("duckdb")
    except ImportError:
        print("duckdb_diff: DuckDB's Python package is not installed (pip install duckdb): skipped")
        return 0
    tally = Tally()
    if args.check_dir:
        for folder in args.check_dir:
            check_dir(duckdb, folder, tally)
    else:
        temporary = args.work is None
        work = Path(tempfile.mkdtemp(prefix="duckdb_diff-")) if temporary else args.work
        work.mkdir(parents=True, exist_ok=True)
        try:
            run_all(duckdb, args, work, tally)
        finally:
            if temporary and not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            elif temporary:
                print(f"duckdb_diff: working folder kept: {work}")
    print(tally.summary())
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
