#!/usr/bin/env python3
"""The control-plane rows of make bench: control_plane_bench, and with
--baseline-bin the same benchmark built from another commit, run in
alternation in one session (the machine is shared and noisy, so only a
side-by-side ratio means anything). Each figure is the median of --rounds
runs. The goals (issue 20) are beside the rows: SubmitJob p99 under 20 ms at
100 clients, WatchJob p99 lag under 100 ms, over 50k decisions/s. A figure
the baseline's bench does not print has no ratio."""
import argparse
import os
import re
import statistics
import subprocess
import sys

FIGURES = {
    "submit": [("p99", r"p99=([\d.]+)ms"), ("p50", r"p50=([\d.]+)ms"),
               ("calls/s", r"([\d.]+) calls/s")],
    "watch": [("p99 lag", r"p99 lag ([\d.]+)ms"), ("p50 lag", r"p50 lag ([\d.]+)ms")],
    "scheduler": [("decisions/s", r"([\d.]+) decisions/s"),
                  ("p99 decision", r"p99 decision ([\d.]+)ms")],
    "report": [("p99", r"p99=([\d.]+)ms"), ("p50", r"p50=([\d.]+)ms"),
               ("calls/s", r"([\d.]+) calls/s")],
    "scrape": [("p50 HTTP", r"p50 ([\d.]+)ms p99"), ("CPU", r"([\d.]+)ms coordinator CPU"),
               ("allocations", r"([\d.]+) allocations"),
               ("MB allocated", r"allocations \(([\d.]+) MB\)"),
               ("lock held", r"lock held ([\d.]+)ms"), ("MB /metrics", r"/metrics ([\d.]+) MB")],
}
TITLES = {
    "submit": "SubmitJob, 100 concurrent clients",
    "watch": "WatchJobBatched (WatchJob before it existed), 100 watchers x 1,000 events/s reported",
    "scheduler": "scheduling, 10,000 queued jobs on 1,000 workers",
    "report": "ReportEvents, 100 workers at once, 5 steps a report",
    "scrape": "GET /metrics, 1,000 running jobs x 4 ranks",
}
GOALS = {"submit": "goal p99 < 20 ms", "watch": "goal p99 lag < 100 ms",
         "scheduler": "goal > 50k decisions/s", "report": "no goal set", "scrape": "no goal set"}


def run(bin_dir, names):
    out = subprocess.run([os.path.join(bin_dir, "control_plane_bench"), *names], check=True,
                         capture_output=True, text=True).stdout
    lines = {}
    for line in out.splitlines():
        m = re.match(r"control_plane/(\w+): (.*)", line)
        if m:
            lines[m.group(1)] = m.group(2)
    return lines


def figures(line, name):
    """The figures the line has: a baseline's older bench may print fewer."""
    found = {label: re.search(pattern, line) for label, pattern in FIGURES[name]}
    return {label: float(m.group(1)) for label, m in found.items() if m}


def comparison_parser(doc):
    """The flags of a bench that compares this build with another's."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--bin", default="build/bin")
    parser.add_argument("--baseline-bin", help="bin folder of the baseline's build")
    parser.add_argument("--baseline", default="baseline", help="its name in the rows")
    parser.add_argument("--rounds", type=int, default=3)
    return parser


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--only", action="append", choices=list(FIGURES),
                        help="run only this benchmark (repeatable); all by default")
    args = parser.parse_args()

    if not args.baseline_bin:
        # Absolute figures, as before there was anything to compare with.
        for name, line in run(args.bin, []).items():
            print(f"control_plane/{name}: {line}")
        return 0
    names = args.only or list(FIGURES)
    ours, base = {n: [] for n in names}, {n: [] for n in names}
    for _ in range(args.rounds):
        for into, bin_dir in ((base, args.baseline_bin), (ours, args.bin)):
            # A baseline older than the names runs every benchmark it has;
            # one it lacks has no ratio.
            lines = run(bin_dir, names)
            for n in names:
                if n in lines:
                    into[n].append(figures(lines[n], n))
    for n in names:
        if not base[n]:
            med = {label: statistics.median(r[label] for r in ours[n]) for label, _ in FIGURES[n]
                   if all(label in r for r in ours[n])}
            print(f"control_plane/{n} ({TITLES[n]}): " +
                  "; ".join(f"{label} {v:g}" for label, v in med.items()) +
                  f" ({args.baseline} has no such benchmark; median of {args.rounds} runs)")
            continue
        both = [label for label, _ in FIGURES[n] if all(label in r for r in ours[n] + base[n])]
        med = {label: (statistics.median(r[label] for r in ours[n]),
                       statistics.median(r[label] for r in base[n])) for label in both}
        parts = [f"{label} {a:g} vs {b:g}: {a / b:.2f}x" for label, (a, b) in med.items()]
        print(f"control_plane/{n} ({TITLES[n]}) vs {args.baseline}: " + "; ".join(parts) +
              f" ({GOALS[n]}; median of {args.rounds} alternating runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
