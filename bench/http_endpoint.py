#!/usr/bin/env python3
"""The HTTP rows of make bench (issue 40): requests/s, p50 and p99 of GET
/metrics and GET /api/v1/jobs (50 queued jobs, the default page of up to
100) under 100 concurrent keep-alive clients, each with one request in
flight, for --seconds after a second of warm-up. ballastd runs as a process
on loopback, open (no token). With --baseline-bin the same is measured on
another build's ballastd (e.g. cpp-httplib's, before issue 40), alternating,
and each figure is the median of --rounds runs; the clients are one asyncio
process that shares the machine's cores with ballastd, in both builds."""
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from control_plane import comparison_parser  # noqa: E402
from reference import base_spec, make_dataset, make_model, write_spec  # noqa: E402

CLIENTS = 100
JOBS = 50
PATHS = {"metrics": "/metrics", "jobs": "/api/v1/jobs"}


class Ballastd:
    """ballastd from `bin_dir` on loopback ports, with JOBS queued jobs."""

    def __init__(self, bin_dir, root, spec_path):
        self.root = tempfile.mkdtemp(dir=root)
        ready = os.path.join(self.root, "ready.json")
        self.log = open(os.path.join(self.root, "ballastd.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "ballastd"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--state-dir", os.path.join(self.root, "state"), "--ready-file", ready],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready) or not os.path.getsize(ready):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"http_endpoint: ballastd of {bin_dir} did not start")
            time.sleep(0.05)
        time.sleep(0.05)
        with open(ready) as f:
            info = json.load(f)
        self.port = int(info["http"].rsplit(":", 1)[1])
        for i in range(JOBS):
            subprocess.run([os.path.join(bin_dir, "ballast"), "--coordinator", info["grpc"],
                            "submit", spec_path, "--request-id", f"bench-{i}"],
                           check=True, capture_output=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


async def client(port, path, until, warm_until, latencies, errors):
    # An open ballastd answers only a loopback Host (docs/security.md).
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    reader = writer = None
    while time.monotonic() < until:
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.monotonic()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            fields = {k.strip().lower(): v.strip().lower() for k, v in fields.items()}
            await reader.readexactly(int(fields[b"content-length"]))
            if start >= warm_until:
                latencies.append(time.monotonic() - start)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head.split(b"\r\n")[0])
            if fields.get(b"connection") == b"close":
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError):
            errors.append(b"connection lost")
            if writer is not None:
                writer.close()
            writer = None
    if writer is not None:
        writer.close()


def measure(port, path, seconds):
    """(requests/s, p50 ms, p99 ms, errors) of CLIENTS clients for `seconds`."""
    latencies, errors = [], []

    async def run():
        warm_until = time.monotonic() + 1
        until = warm_until + seconds
        await asyncio.gather(*(client(port, path, until, warm_until, latencies, errors)
                               for _ in range(CLIENTS)))

    asyncio.run(run())
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return len(latencies) / seconds, cuts[49] * 1000, cuts[98] * 1000, len(errors)


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="ballast-http-bench-")
    try:
        make_model("qwen3", os.path.join(root, "model"), seed=1)
        make_dataset(os.path.join(root, "data.jsonl"), n=8, vocab=320, seed=2)
        spec_path = os.path.join(root, "job.yaml")
        write_spec(spec_path, **base_spec(os.path.join(root, "model"),
                                          os.path.join(root, "data.jsonl")))
        builds = [("ours", args.bin)]
        if args.baseline_bin:
            builds.insert(0, (args.baseline, args.baseline_bin))
        servers = {name: Ballastd(bin_dir, root, spec_path) for name, bin_dir in builds}
        runs = {(name, key): [] for name, _ in builds for key in PATHS}
        try:
            for _ in range(args.rounds):
                for key, path in PATHS.items():
                    for name, _ in builds:
                        runs[name, key].append(measure(servers[name].port, path, args.seconds))
        finally:
            for server in servers.values():
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    labels = ("requests/s", "p50 ms", "p99 ms", "errors")
    for key, path in PATHS.items():
        med = {name: [statistics.median(r[i] for r in runs[name, key]) for i in range(4)]
               for name, _ in builds}
        title = f"http/{key} (GET {path}, {CLIENTS} concurrent keep-alive clients)"
        if not args.baseline_bin:
            print(f"{title}: " + "; ".join(f"{label} {v:.4g}" for label, v in
                                           zip(labels, med["ours"])) +
                  f" (median of {args.rounds} runs of {args.seconds:g} s)")
            continue
        parts = [f"{label} {a:.4g} vs {b:.4g}" + (f": {a / b:.2f}x" if b else "")
                 for label, a, b in zip(labels, med["ours"], med[args.baseline])]
        print(f"{title} vs {args.baseline}: " + "; ".join(parts) +
              f" (median of {args.rounds} alternating runs of {args.seconds:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
