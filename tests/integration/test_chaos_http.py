"""ballastd's HTTP port under a crowd (issue 40): 1,000 idle connections,
100 slowloris connections (one byte of a request head every 4 s) and 500
idle event streams of 8 tenants, held open (reopened whenever ballastd closes one) while
/healthz, /metrics, SubmitJob and the gRPC health check are timed against a
quiet baseline taken in the same run: a second ballastd beside it, each call
to one followed by the same call to the other, so that the rest of the
machine's load weighs on both alike. Then the caps: an address past its
connection cap is refused at once, and a tenant past its stream cap gets 503
while another tenant still gets a stream.

Loopback only. The crowd comes from 127.0.0.2 and up, at most 200 per
address, so that the per-address cap admits it; the probes come from
127.0.0.1 as a kubelet's would from its own address. Bounded: about 5,000
file descriptors and two minutes.

The figures are printed whichever way the run ends, so that a run against an
older ballastd records the "before" row. With BALLAST_RECORD_FIGURES=1 they
also go into docs/reliability.md, between the markers of this test; never by
default, since a test that edits a tracked file marks the tree dirty, and the
next build (the demo's, in the same ctest run) relinks every binary under the
tests that are running them."""
import collections
import datetime
import http.client
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cluster import BALLASTD, Cluster, write_spec
from test_control_plane import inputs, spec  # noqa: F401
from test_python_client import make_spec, stubs  # noqa: F401
from test_tenants import ADMIN, make_token, secured  # noqa: F401

# Issue 40 asks for 200 streams; issue 33 for 500 beside SubmitJob.
IDLE, SLOW, STREAMS = 1000, 100, 500
TENANTS = 8  # the streams' tenants, STREAMS / TENANTS each (under the cap of 64)
PER_ADDRESS = 200  # crowd connections per source address
CAP_PER_ADDRESS = 256  # HttpLimits::max_connections_per_address
CAP_STREAMS_PER_TENANT = 64  # kMaxEventStreamsPerTenant
HEALTHZ_P99_MS = 100.0  # issue 40's bound
PROBES = ("healthz", "metrics", "submit", "grpc_health")
# Timing lasts this long, past the idle timeout (10 s: the 1,000 idle
# connections are cut and reopened at once, twice) and a stream's life (25
# s: the 500 reconnect), with a round of every probe every PACE_S. A starved
# server's calls take TIMEOUT_S each, so it gets only a few rounds.
TIMING_S, PACE_S = 30, 0.05
TIMEOUT_S = 5.0  # a request not answered by then counts as this long, and fails
SOURCE = os.environ.get("BALLAST_SOURCE_DIR",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
CROWD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "http_crowd.py")
MARK_BEGIN = "<!-- figures of integration.chaos_http (tests/integration/test_chaos_http.py) -->"
MARK_END = "<!-- end of integration.chaos_http figures -->"


class Crowd:
    """tests/integration/http_crowd.py in a process of its own, so that its
    event loop never holds this process's GIL while a probe is timed."""

    def __init__(self, port, streams):
        self.proc = subprocess.Popen(
            [sys.executable, CROWD, "--port", str(port), "--idle", str(IDLE), "--slow", str(SLOW),
             "--per-address", str(PER_ADDRESS), *(f"{token}:{job}" for token, job in streams)],
            stdout=subprocess.PIPE, text=True)
        self.counts = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.counts = json.loads(line)

    def held(self):
        return dict(self.counts.get("open", {}))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # Stopped anyway, so that a failing run leaves no process behind.
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)


def p99(samples):
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def http_get(port, path, token=None):
    """Seconds for one GET on a new connection (as a kubelet probes), or
    TIMEOUT_S when it fails or takes longer."""
    start = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        c.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            return TIMEOUT_S
    except OSError:
        return TIMEOUT_S
    return min(time.monotonic() - start, TIMEOUT_S)


def probes(cluster, stubs, inputs):
    """The timed calls on one ballastd, each returning its seconds."""
    job_pb2, svc_pb2, svc_grpc, spec_pb2 = stubs
    channel = grpc.insecure_channel(cluster.grpc)
    jobs = svc_grpc.JobServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    port = int(cluster.http.rsplit(":", 1)[1])
    metadata = [("authorization", f"Bearer {ADMIN}")]

    def timed(call):
        start = time.monotonic()
        try:
            call()
        except grpc.RpcError:
            return TIMEOUT_S
        return time.monotonic() - start

    def submit():
        request = svc_pb2.SubmitJobRequest(spec=make_spec(spec_pb2, *inputs, 4),
                                           request_id=str(uuid.uuid4()))
        return jobs.SubmitJob(request, timeout=TIMEOUT_S, metadata=metadata)

    return {
        "healthz": lambda: http_get(port, "/healthz"),
        "metrics": lambda: http_get(port, "/metrics", ADMIN),
        "submit": lambda: timed(submit),
        "grpc_health": lambda: timed(lambda: health.Check(health_pb2.HealthCheckRequest(),
                                                          timeout=TIMEOUT_S)),
    }


def measure(quiet, crowded):
    """Each probe's (p99 in ms, calls failed, calls made) on the quiet and
    the crowded ballastd. Each call to one is followed by the same call to
    the other, so that whatever else loads the machine weighs on both."""
    samples = {which: {name: [] for name in PROBES} for which in ("quiet", "crowd")}
    start = time.monotonic()
    while time.monotonic() - start < TIMING_S:
        for name in PROBES:
            samples["quiet"][name].append(quiet[name]())
            samples["crowd"][name].append(crowded[name]())
        time.sleep(PACE_S)
    return {which: {name: (p99(taken) * 1000, sum(t >= TIMEOUT_S for t in taken), len(taken))
                    for name, taken in by_probe.items()}
            for which, by_probe in samples.items()}


def connect_from(address, port):
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S,
                                 source_address=(address, 0))
    return s


def refusal_seconds(port):
    """Opens the per-address cap's worth of connections from one address, then
    one more: seconds until that one is answered 503 or closed (TIMEOUT_S if
    it is kept waiting)."""
    held = [connect_from("127.0.0.250", port) for _ in range(CAP_PER_ADDRESS)]
    try:
        start = time.monotonic()
        extra = connect_from("127.0.0.250", port)
        try:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: ballastd\r\n\r\n")
            answer = extra.recv(64)
        except OSError:
            answer = b""  # reset: closed at once
        finally:
            extra.close()
        took = time.monotonic() - start
        assert answer == b"" or answer.startswith(b"HTTP/1.1 503"), answer
        return took
    except socket.timeout:
        return TIMEOUT_S
    finally:
        for s in held:
            s.close()


def open_stream(port, token, job_id):
    """(status, socket): the socket stays open for a 200; status 0 when
    there was no answer within TIMEOUT_S."""
    s = connect_from("127.0.0.240", port)
    s.sendall(f"GET /api/v1/jobs/{job_id}/stream HTTP/1.1\r\nHost: ballastd\r\n"
              f"Authorization: Bearer {token}\r\n\r\n".encode())
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            part = s.recv(4096)
            if not part:
                break
            head += part
    except OSError:
        pass
    m = re.match(rb"HTTP/1\.1 (\d+)", head)
    return (int(m.group(1)) if m else 0), s


def tenant_streams(port, capped, other):
    """A tenant's streams up to its cap (stopping at the first refused),
    its next one, and another tenant's next one: their statuses."""
    held, opened = [], []
    try:
        for _ in range(CAP_STREAMS_PER_TENANT):
            status, s = open_stream(port, *capped)
            held.append(s)
            opened.append(status)
            if status != 200:
                return opened, None, None
        over, s = open_stream(port, *capped)
        held.append(s)
        next_other, s = open_stream(port, *other)
        held.append(s)
        return opened, over, next_other
    finally:
        for s in held:
            s.close()


def record_figures(lines):
    if os.environ.get("BALLAST_RECORD_FIGURES") != "1":
        return
    path = os.path.join(SOURCE, "docs", "reliability.md")
    with open(path) as f:
        text = f.read()
    begin, end = text.index(MARK_BEGIN) + len(MARK_BEGIN), text.index(MARK_END)
    with open(path, "w") as f:
        f.write(text[:begin] + "\n" + "\n".join(lines) + "\n" + text[end:])


def test_probes_and_scrapes_keep_their_time_under_idle_slow_and_streaming_crowds(
        secured, inputs, stubs):
    cluster = secured
    # Client and server each hold every connection; ballastd inherits this limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (IDLE + SLOW + STREAMS + CAP_PER_ADDRESS) + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"ulimit -n allows {hard} files; this test needs {need}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    cluster.coordinator.stop()
    cluster.start_coordinator()
    port = int(cluster.http.rsplit(":", 1)[1])
    # The quiet baseline: a second ballastd beside it, timed in alternation.
    control = Cluster(cluster.root + "-quiet")
    control.start_coordinator()

    # One queued job per tenant (no worker runs it): its stream stays open and quiet.
    path = os.path.join(cluster.root, "job.yaml")
    write_spec(path, **spec(inputs, max_steps=4))
    tenants = []
    for t in range(TENANTS + 2):
        token = make_token(cluster, "--role", "user", "--tenant", f"crowd-{t}")
        r = cluster.cli("submit", path, "-o", "json", token=token)
        assert r.returncode == 0, r.stderr
        tenants.append((token, re.search(r'"id": *"([^"]+)"', r.stdout).group(1)))
    streams = [tenants[i % TENANTS] for i in range(STREAMS)]

    crowd = Crowd(port, streams)
    figures = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                crowd.held().get("idle", 0) >= IDLE * 0.95
                and crowd.held().get("slow", 0) >= SLOW * 0.95
                and crowd.held().get("stream", 0) >= STREAMS * 0.95):
            time.sleep(0.5)
        figures["held"] = crowd.held()
        servers = {"quiet": psutil.Process(control.coordinator.pid),
                   "crowd": psutil.Process(cluster.coordinator.pid)}
        cpu = {k: sum(p.cpu_times()[:2]) for k, p in servers.items()}
        start = time.monotonic()
        timed = measure(probes(control, stubs, inputs), probes(cluster, stubs, inputs))
        figures["cpu"] = {k: (sum(p.cpu_times()[:2]) - cpu[k]) / (time.monotonic() - start)
                          for k, p in servers.items()}
        figures["quiet"], figures["loaded"] = timed["quiet"], timed["crowd"]
        figures["held_after"] = crowd.held()
        figures["refusal"] = refusal_seconds(port)
        # A tenant's streams stop at its cap; another tenant's next one is served.
        figures["opened"], figures["over"], figures["other"] = tenant_streams(
            port, tenants[TENANTS], tenants[0])
    finally:
        try:
            crowd.stop()
        finally:
            control.stop()
        lines = [f"Last run: {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, "
                 f"{os.cpu_count()} cores, ballastd {os.path.normpath(BALLASTD)}.", "",
                 "| probe | quiet ballastd p99 | crowded ballastd p99 | failed of made (quiet / crowded) |",
                 "|---|---|---|---|"]
        for name in PROBES:
            if name in figures.get("loaded", {}):
                (q, qf, qn), (c, cf, cn) = figures["quiet"][name], figures["loaded"][name]
                lines.append(f"| {name} | {q:.1f} ms | {c:.1f} ms | {qf} of {qn} / {cf} of {cn} |")
        if "other" in figures:
            lines += ["", f"Crowd connections open when timing began: {figures['held']}, "
                      f"when it ended: {figures['held_after']}; reconnects "
                      f"{crowd.counts.get('reconnects')}, refused {crowd.counts.get('refused')}. "
                      f"Connection {CAP_PER_ADDRESS + 1} from one address answered or closed in "
                      f"{figures['refusal'] * 1000:.0f} ms. One tenant's streams, by status: "
                      f"{dict(collections.Counter(figures['opened']))}, then "
                      f"{figures['over']} for its next; another tenant's next: {figures['other']}. "
                      f"CPU while timing: the quiet ballastd {figures['cpu']['quiet']:.0%} of a "
                      f"core, the crowded one {figures['cpu']['crowd']:.0%}."]
        record_figures(lines)
        print("\n".join(lines))

    # The caps admit this crowd: it was all open when timing began. (When
    # many of its connections close at once, at the idle timeout or a
    # stream's end, some reconnects may meet the per-address cap for a
    # moment, before ballastd has counted the closed ones out; they retry.)
    assert figures["held"].get("stream", 0) >= STREAMS * 0.95, figures["held"]
    assert figures["held"].get("idle", 0) >= IDLE * 0.95, figures["held"]
    assert figures["held"].get("slow", 0) >= SLOW * 0.95, figures["held"]
    for name, (ms, failed, _) in figures["loaded"].items():
        assert failed == 0, f"{name}: {failed} calls failed or took over {TIMEOUT_S} s"
    assert figures["loaded"]["healthz"][0] <= HEALTHZ_P99_MS, figures["loaded"]
    # The 2x, plus 10 ms: on 2 shared cores, beside other tests, one
    # preempted call moves a p99 of 150 calls by that much. The old server
    # missed by seconds (docs/reliability.md).
    for name in ("metrics", "submit", "grpc_health"):
        assert figures["loaded"][name][0] <= 2 * figures["quiet"][name][0] + 10, (name, figures)
    assert figures["refusal"] < 1.0, "a connection past the per-address cap was kept waiting"
    assert figures["opened"] == [200] * CAP_STREAMS_PER_TENANT
    assert figures["over"] == 503
    assert figures["other"] == 200
