#!/usr/bin/env python3
"""Benchmark: the control plane on PostgreSQL against SQLite (issue 36),
side by side: control_plane_bench's SubmitJob (100 concurrent clients) and
WatchJobBatched (100 watchers x 1,000 events/s) rows, with ballastd's store
a SQLite file (the default) or a PostgreSQL 15 server on this machine, in
alternating rounds; each figure the median of --rounds runs.

The PostgreSQL server is a throwaway one (tests/unit/server/postgres_server.sh:
a unix socket, no TCP), with fsync on (BALLAST_PG_FSYNC=on: the tests' server
runs without it), checked before the first run. Their durability differs:
ballastd's SQLite (WAL, synchronous=NORMAL) survives a crash of ballastd, and
a power loss may take back its last commits; PostgreSQL with synchronous_commit
on (the default) fsyncs every commit; with --synchronous-commit off it waits
for none, nearer SQLite's trade. Each benchmark gets a database of its own, made anew each round.
Prints one row per benchmark.
"""
import argparse
import os
import statistics
import subprocess
import tempfile

from control_plane import FIGURES, TITLES, figures, run

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "tests", "unit", "server", "postgres_server.sh")
NAMES = ("submit", "watch")


def psql(folder, database, sql):
    return subprocess.run(["psql", "-h", folder, "-p", "5432", "-U", "ballast", "-d", database,
                           "-v", "ON_ERROR_STOP=1", "-q", "-t", "-A", "-c", sql], check=True,
                          capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="on",
                        help="off: PostgreSQL's commits wait for no fsync, nearer SQLite's "
                             "synchronous=NORMAL")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    folder = tempfile.mkdtemp(prefix="ballast-pg-bench-")
    subprocess.run(["sh", SERVER, "start", folder], check=True,
                   env={**os.environ, "BALLAST_PG_FSYNC": "on"})
    try:
        durable = psql(folder, "postgres", "SELECT current_setting('fsync') || ' ' || "
                                           "current_setting('synchronous_commit')")
        assert durable == "on on", f"the server is not durable: fsync, synchronous_commit {durable}"
        url = (f"postgresql:///{{name}}?host={folder}&port=5432&user=ballast"
               f"&options=-csynchronous_commit%3D{args.synchronous_commit}")
        sqlite, postgres = {n: [] for n in NAMES}, {n: [] for n in NAMES}
        for _ in range(args.rounds):
            for name in NAMES:
                psql(folder, "postgres", f"DROP DATABASE IF EXISTS {name}")
                psql(folder, "postgres", f"CREATE DATABASE {name}")
            os.environ["BALLAST_BENCH_STORE"] = url
            for name, line in run(args.bin, NAMES).items():
                postgres[name].append(figures(line, name))
            del os.environ["BALLAST_BENCH_STORE"]
            for name, line in run(args.bin, NAMES).items():
                sqlite[name].append(figures(line, name))
    finally:
        subprocess.run(["sh", SERVER, "stop", folder], check=False)
    for name in NAMES:
        parts = []
        for label, _ in FIGURES[name]:
            ours = statistics.median(f[label] for f in postgres[name])
            base = statistics.median(f[label] for f in sqlite[name])
            parts.append(f"{label} {ours:g} vs {base:g}: {ours / base:.2f}x" if base else
                         f"{label} {ours:g} vs {base:g}")
        print(f"control_plane_store/{name} ({TITLES[name]}) on PostgreSQL 15 (fsync on, "
              f"synchronous_commit {args.synchronous_commit}) vs SQLite (WAL, synchronous=NORMAL): "
              f"{'; '.join(parts)} (median of {args.rounds} alternating runs)")


if __name__ == "__main__":
    main()
