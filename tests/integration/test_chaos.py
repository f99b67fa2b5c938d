"""Chaos with real processes (issue 20): what a kill -9, a SIGTERM, a full
disk, a truncated checkpoint shard, a corrupted store page and a network
cut (of one worker, or of every worker at once) do to Ballast, and a kill -9
in the middle of 1,000 concurrent submits and 200 watch streams.
Nothing acknowledged is lost, no watcher misses an event, a damaged
checkpoint or store is detected and named, never loaded."""
import asyncio
import concurrent.futures
import dataclasses
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import time

import grpc
import psutil
import pytest
from google.protobuf import json_format

from cluster import CLI, wait_for, write_spec
from test_control_plane import inputs, long_spec, spec  # noqa: F401
from test_gang import ONE_THREAD, ip, two_hosts  # noqa: F401
from test_python_client import stubs  # noqa: F401


def test_kill9_during_a_burst_of_submits_loses_no_acknowledged_job(cluster, inputs):
    cluster.start_coordinator()
    path = os.path.join(cluster.root, "job.yaml")
    write_spec(path, **spec(inputs, max_steps=20))
    host, port = cluster.grpc.rsplit(":", 1)

    def submit(i):
        r = subprocess.run([CLI, "--coordinator", cluster.grpc, "submit", path, "-o", "json",
                            "--request-id", f"burst-{i}"],
                           capture_output=True, text=True, timeout=120)
        return i, r.returncode, r.stdout, time.monotonic()

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(submit, i) for i in range(64)]
        # Mid-burst: once some are acknowledged and others in flight.
        wait_for(lambda: sum(f.done() for f in futures) >= 8, 60, "the first acknowledgements")
        cluster.coordinator.kill9()
        killed_at = time.monotonic()
        cluster.coordinator.log.close()
        time.sleep(0.5)
        cluster.start_coordinator(port=int(port), host=host)
        results = [f.result() for f in futures]

    acked = {i: json.loads(out)["id"] for i, code, out, _ in results if code == 0}
    before_kill = [i for i, code, _, t in results if code == 0 and t < killed_at]
    assert before_kill, "no submit was acknowledged before the kill"
    # Every acknowledged job survived, and no retry across the crash made a second one.
    listed = json.loads(cluster.cli("list", "-o", "json", "--limit", "1000").stdout)["jobs"]
    by_request = {}
    for job in listed:
        by_request.setdefault(job["request_id"], []).append(job["id"])
    for i, job_id in acked.items():
        assert by_request.get(f"burst-{i}") == [job_id], (i, by_request.get(f"burst-{i}"))
    assert all(len(ids) == 1 for ids in by_request.values())
    # Those that failed failed loudly: unreachable (3), never half-done.
    assert {code for _, code, _, _ in results} <= {0, 3}


def test_sigterm_drains_and_a_watcher_misses_no_event(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1")
    job_id = cluster.submit(long_spec(inputs, steps=300, every=50))
    watcher = subprocess.Popen([CLI, "--coordinator", cluster.grpc, "watch", job_id, "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: int(cluster.job(job_id).get("step", 0)) >= 20, 120, "step 20")
        host, port = cluster.grpc.rsplit(":", 1)
        cluster.coordinator.stop()  # SIGTERM: drains, persists, exits 0
        assert cluster.coordinator.proc.returncode == 0
        assert "stopped" in cluster.coordinator.output()
        cluster.start_coordinator(port=int(port), host=host)
        out, err = watcher.communicate(timeout=300)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, err
    seqs = [int(json.loads(line)["seq"]) for line in out.splitlines() if line.startswith("{")]
    assert seqs == list(range(1, seqs[-1] + 1)), "a gap or a repeat in the watched events"
    assert json.loads(out.splitlines()[-1])["state_change"]["to"] == "JOB_STATE_SUCCEEDED"


# Issue 33's load: every submit in flight at once, and every watcher on a job
# whose rank reports steps straight through the kill.
SUBMITS, WATCHERS = 1000, 200
# 20 connections carry the 1,300 streams, as many clients behind a few
# proxies would: the test's descriptors stay far under ulimit -n.
CHANNELS = 10
# The clients reconnect as soon as ballastd is back: gRPC's default backoff
# (1 s, growing to 2 min) would time gRPC, not ballastd.
QUICK_RECONNECT = [("grpc.initial_reconnect_backoff_ms", 50),
                   ("grpc.min_reconnect_backoff_ms", 50),
                   ("grpc.max_reconnect_backoff_ms", 250)]
# How a call cut by the kill ends: whether ballastd did it is unknown, so a
# submit is retried with its request id and a watch resumes after its last seq.
CUT = grpc.StatusCode.UNAVAILABLE


@dataclasses.dataclass
class Acknowledged:
    """One submit's answer, after however many tries it took."""
    request_id: str
    job: object  # the Job that SubmitJob returned
    attempts: int
    seconds: float  # how long the answered try took
    at: float  # time.monotonic() when it was answered
    sent: float  # time.time() when the answered try was sent


async def submit_until_acknowledged(stub, request, first_timeout=60):
    """SubmitJob, retried with the same request id until answered. A first
    try that gives up after `first_timeout` is a client with a short
    deadline: ballastd may have stored its job meanwhile."""
    attempts, timeout = 0, first_timeout
    while True:
        attempts += 1
        start, sent = time.monotonic(), time.time()
        try:
            job = await stub.SubmitJob(request, timeout=timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() not in (CUT, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            timeout = 60
            await asyncio.sleep(0.05)
            continue
        end = time.monotonic()
        return Acknowledged(request.request_id, job, attempts, end - start, end, sent)


class Watcher:
    """A WatchJobBatched stream that resumes after the last seq it received,
    as `ballast watch` does. It keeps every event exactly as delivered and
    deduplicates nothing, so a gap or a repeat on ballastd's side shows."""

    def __init__(self, stub, request_type, job_id):
        self.stub, self.request_type, self.job_id = stub, request_type, job_id
        self.events = []
        self.cut = False
        # When the first event came on a stream opened after the cut.
        self.resumed_at = None

    async def run(self):
        while True:
            after = self.events[-1].seq if self.events else 0
            request = self.request_type(job_id=self.job_id, after_seq=after)
            try:
                async for batch in self.stub.WatchJobBatched(request):
                    if self.cut and self.resumed_at is None:
                        self.resumed_at = time.monotonic()
                    self.events.extend(batch.events)
                return  # the job's final state change ended the stream
            except grpc.aio.AioRpcError as e:
                if e.code() != CUT:
                    raise
                self.cut = True
                await asyncio.sleep(0.05)


def gaps_and_repeats(seqs):
    """A watcher's seqs should run 1, 2, 3...: a gap is a jump forward, a
    repeat a seq at or below one already delivered."""
    gaps = repeats = last = 0
    for seq in seqs:
        if seq <= last:
            repeats += 1
            continue
        gaps += seq != last + 1
        last = seq
    return gaps, repeats


def last_step(events):
    steps = [e.training.step_metrics.step for e in events
             if e.training.HasField("step_metrics")]
    return steps[-1] if steps else 0


def watching(watchers, tasks, predicate):
    """For wait_for, from another thread: predicate(watchers), but a watcher
    that failed fails the test at once, with its error."""
    def check():
        for task in tasks:
            if task.done() and task.exception():
                raise task.exception()
        return predicate(watchers)
    return check


async def count_descriptors(cluster, peaks):
    """Keeps the most descriptors that the test and ballastd held in `peaks`."""
    while True:
        peaks["test"] = max(peaks["test"], psutil.Process().num_fds())
        try:
            peaks["ballastd"] = max(peaks["ballastd"],
                                    psutil.Process(cluster.coordinator.pid).num_fds())
        except psutil.NoSuchProcess:
            pass
        await asyncio.sleep(0.05)


async def list_every_job(stub, svc_pb2):
    jobs, token = [], ""
    while True:
        page = await stub.ListJobs(svc_pb2.ListJobsRequest(page_size=1000, page_token=token),
                                   timeout=60)
        jobs.extend(page.jobs)
        token = page.next_page_token
        if not token:
            return jobs


async def kill9_under_load(cluster, stubs, burst_spec, watched):
    """clients_through_the_kill on 2 * CHANNELS connections, closed at the end."""
    _, svc_pb2, svc_grpc, _ = stubs
    channels = [grpc.aio.insecure_channel(cluster.grpc, options=QUICK_RECONNECT)
                for _ in range(2 * CHANNELS)]
    try:
        return await clients_through_the_kill(cluster, svc_pb2, burst_spec, watched,
                                              [svc_grpc.JobServiceStub(c) for c in channels])
    finally:
        for c in channels:
            await c.close()


async def clients_through_the_kill(cluster, svc_pb2, burst_spec, watched, stubs_on):
    """Opens WATCHERS streams over the `watched` jobs (on the second half of
    `stubs_on`) and sends SUBMITS submits at once (on the first half), each
    with its request id:
    - every 4th gives up on its first try after 20 ms to 1 s, and retries;
    - every 10th has a twin, the same request sent beside it at once;
    ballastd is killed -9 once 30% of them are answered, and restarted on
    its store; then every request answered before the kill is sent again.
    Each watched job is cancelled once it has reported 5 steps after the
    restart, which ends its streams. Returns what every client saw."""
    watchers = [Watcher(stubs_on[CHANNELS + i % CHANNELS], svc_pb2.WatchJobRequest,
                        watched[i % len(watched)]) for i in range(WATCHERS)]
    watch_tasks = [asyncio.create_task(w.run()) for w in watchers]
    await asyncio.to_thread(wait_for, watching(watchers, watch_tasks,
                                               lambda ws: all(w.events for w in ws)),
                            60, "every watcher's first events", 0.01)

    fds = {"test": 0, "ballastd": 0}
    counting = asyncio.create_task(count_descriptors(cluster, fds))

    def request(i):
        return svc_pb2.SubmitJobRequest(spec=burst_spec, request_id=f"load-{i}")
    calls = [(request(i), random.uniform(0.02, 1.0) if i % 4 == 0 else 60)
             for i in range(SUBMITS)] + [(request(i), 60) for i in range(0, SUBMITS, 10)]
    started = time.monotonic()
    submits = [asyncio.create_task(submit_until_acknowledged(stubs_on[k % CHANNELS], r, t))
               for k, (r, t) in enumerate(calls)]
    answered = lambda: sum(t.done() for t in submits) >= len(calls) * 3 // 10  # noqa: E731
    await asyncio.to_thread(wait_for, answered, 60, "the first answers", 0.001)
    steps_at_kill = {job: max(last_step(w.events) for w in watchers if w.job_id == job)
                     for job in watched}
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.restart_coordinator_after_kill9)
    ready_at, ready_wall = time.monotonic(), time.time()
    acknowledged = await asyncio.gather(*submits)
    replayed = await asyncio.gather(*[
        submit_until_acknowledged(stubs_on[k % CHANNELS], svc_pb2.SubmitJobRequest(
            spec=burst_spec, request_id=a.request_id))
        for k, a in enumerate(acknowledged) if a.at < killed_at])

    def stepped_on(ws):
        return all(last_step(w.events) >= steps_at_kill[w.job_id] + 5 for w in ws)
    await asyncio.to_thread(wait_for, watching(watchers, watch_tasks, stepped_on), 120,
                            "5 steps of each watched job after the restart")
    for job in watched:
        await stubs_on[0].CancelJob(svc_pb2.CancelJobRequest(job_id=job), timeout=30)
    await asyncio.wait_for(asyncio.gather(*watch_tasks), 60)
    counting.cancel()

    # What a watcher from seq 0 gets now: every stored event, once each.
    stored = {job: [e async for batch in stubs_on[0].WatchJobBatched(
        svc_pb2.WatchJobRequest(job_id=job), timeout=60) for e in batch.events]
        for job in watched}
    return {"acknowledged": acknowledged, "replayed": replayed, "watchers": watchers,
            "stored": stored, "listed": await list_every_job(stubs_on[0], svc_pb2),
            "started": started, "killed_at": killed_at, "ready_at": ready_at,
            "ready_wall": ready_wall,
            "steps_at_kill": steps_at_kill, "fds": fds}


def test_kill9_under_1000_submits_and_200_watchers_loses_and_repeats_nothing(cluster, inputs,
                                                                              stubs):
    """1,000 SubmitJob calls in flight at once, with retries, twins and
    replays of their request ids, and 200 WatchJobBatched streams over two
    running jobs; ballastd is killed -9 mid-burst and restarted on the same
    store. Every answered job is there once, no retry, twin or replay made a
    second one, and every watcher, resuming after its last seq, got each
    event exactly once (seqs 1, 2, 3... to the final state change, each step
    once). The figures go to docs/reliability.md."""
    job_pb2, _, _, spec_pb2 = stubs
    cluster.start_coordinator()
    for name in ("w1", "w2"):
        cluster.start_worker(name, env=ONE_THREAD)
    watched = [cluster.submit(long_spec(inputs, every=50), f"long{i}.yaml") for i in range(2)]
    wait_for(lambda: all(int(cluster.job(j).get("step", 0)) >= 1 for j in watched), 120,
             "both watched jobs to train")
    burst_spec = json_format.ParseDict(spec(inputs, max_steps=20), spec_pb2.JobSpec())

    # A bound on a hang, not a speed claim: 170 s ran out beside
    # integration.chaos_ranks on 2 loaded cores.
    run = asyncio.run(asyncio.wait_for(kill9_under_load(cluster, stubs, burst_spec, watched), 480))

    acknowledged, watchers = run["acknowledged"], run["watchers"]
    by_request = {}
    for job in run["listed"]:
        by_request.setdefault(job.request_id, []).append(job.id)
    answers = acknowledged + run["replayed"]
    missing = [a.request_id for a in answers if a.job.id not in by_request.get(a.request_id, [])]
    duplicates = sum(len(ids) - 1 for ids in by_request.values())
    before_kill = sum(a.at < run["killed_at"] for a in acknowledged)
    retried = [a for a in acknowledged if a.attempts > 1]
    # Retries answered with the job that an earlier, unanswered try stored.
    stored_earlier = sum(a.job.created_ms < 1000 * a.sent for a in retried)
    gaps = repeats = 0
    for w in watchers:
        g, r = gaps_and_repeats([e.seq for e in w.events])
        gaps, repeats = gaps + g, repeats + r
    resumed = sorted(w.resumed_at - run["ready_at"] for w in watchers if w.resumed_at)
    # When the restarted ballastd stored each watched job's first event: the
    # workers' reports coming back, before any watcher can have it.
    first_stored = [min(e.time_ms for e in events if e.time_ms > 1000 * run["ready_wall"])
                    / 1000 - run["ready_wall"] for events in run["stored"].values()]
    latency = sorted(a.seconds for a in acknowledged)
    figures = {
        "answered": len(acknowledged), "before the kill": before_kill, "retried": len(retried),
        "retries answered with the stored job": stored_earlier,
        "replayed after the restart": len(run["replayed"]),
        "missing": len(missing), "duplicates": duplicates,
        "watch gaps": gaps, "watch repeats": repeats,
        "submit p50 ms": round(1000 * statistics.median(latency)),
        "submit p99 ms": round(1000 * latency[int(0.99 * (len(latency) - 1))]),
        "burst s": round(max(a.at for a in acknowledged) - run["started"], 2),
        "restart s": round(run["ready_at"] - run["killed_at"], 2),
        "first event stored after the restart s": [round(t, 2) for t in first_stored],
        "resume p50 s": round(statistics.median(resumed), 2) if resumed else None,
        "resume max s": round(resumed[-1], 2) if resumed else None,
        "fds test/ballastd/limit": (run["fds"]["test"], run["fds"]["ballastd"],
                                    resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
    }
    print("figures:", figures)

    assert 0 < before_kill < len(acknowledged), "the kill did not land in the middle of the burst"
    assert not missing, f"answered jobs missing after the restart: {missing[:10]}"
    assert duplicates == 0, {k: v for k, v in by_request.items() if len(v) > 1}
    assert sum(k.startswith("load-") for k in by_request) == SUBMITS
    assert all(w.cut for w in watchers) and len(resumed) == WATCHERS, "a watcher never resumed"
    # 1,300 streams on 20 connections: a descriptor per stream would show here.
    assert max(run["fds"].values()) < 256, run["fds"]
    assert (gaps, repeats) == (0, 0), figures
    for w in watchers:
        assert w.events == run["stored"][w.job_id], f"a watcher of {w.job_id} saw other events"
    for job, events in run["stored"].items():
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].state_change.to == job_pb2.JOB_STATE_CANCELLED
        # The restarted ballastd adopted the running rank: one attempt, each
        # step reported once, the buffered reports of the outage included.
        steps = [(e.attempt, e.training.step_metrics.step) for e in events
                 if e.training.HasField("step_metrics")]
        assert steps == [(1, step) for step in range(1, len(steps) + 1)], \
            f"{job}: a step reported twice or lost, or the job restarted"
        assert steps[-1][1] >= run["steps_at_kill"][job] + 5


TRAIN = os.path.join(os.path.dirname(CLI), "ballast-train")


def train(spec_path, out, *sets, timeout=300):
    return subprocess.run([TRAIN, "--spec", spec_path, "--out", out,
                           *[a for kv in sets for a in ("--set", kv)]],
                          capture_output=True, text=True, timeout=timeout)


def checkpoint_dirs(out):
    root = os.path.join(out, "checkpoints")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_a_truncated_checkpoint_shard_is_detected_and_never_loaded(inputs, tmp_path):
    path = str(tmp_path / "job.yaml")
    write_spec(path, **long_spec(inputs, steps=8, every=4))
    out = str(tmp_path / "out")
    r = train(path, out)
    assert r.returncode == 0, r.stderr[-3000:]
    newest = os.path.join(out, "checkpoints", checkpoint_dirs(out)[-1])
    shards = sorted((os.path.getsize(os.path.join(newest, f)), f) for f in os.listdir(newest)
                    if f.endswith(".safetensors"))
    victim = shards[-1][1]
    with open(os.path.join(newest, victim), "r+b") as f:
        f.truncate(shards[-1][0] // 2)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        before = f.read()

    # Resuming (a longer run in the same folder) finds the damage and stops,
    # naming the file, before a single step runs on it.
    r = train(path, out, "max_steps=12")
    assert r.returncode != 0
    assert victim in r.stderr, r.stderr[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert f.read() == before


@pytest.fixture
def small_disk(tmp_path):
    """A 48 MiB tmpfs, unmounted afterwards; skips where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_while_a_checkpoint_is_written_keeps_the_previous_one(inputs, tmp_path,
                                                                         small_disk):
    path = str(tmp_path / "job.yaml")
    write_spec(path, **long_spec(inputs, steps=100000, every=50))
    out = os.path.join(small_disk, "out")
    rank = subprocess.Popen([TRAIN, "--spec", path, "--out", out], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        published = lambda: [d for d in checkpoint_dirs(out) if not d.startswith(".")]  # noqa: E731
        wait_for(published, 120, "the first checkpoint", interval=0.01)
        # Held while what is left of the disk fills: its next write meets ENOSPC.
        rank.send_signal(signal.SIGSTOP)
        first = published()[0]
        with open(os.path.join(small_disk, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        rank.send_signal(signal.SIGCONT)
        _, err = rank.communicate(timeout=300)
    finally:
        if rank.poll() is None:
            rank.kill()
    assert rank.returncode != 0
    assert "No space left on device" in err, err[-3000:]
    os.remove(os.path.join(small_disk, "filler"))
    # The first checkpoint is intact and the only one: nothing half-written
    # stands beside it, and a new run resumes from it.
    assert checkpoint_dirs(out) == [first], checkpoint_dirs(out)
    step = int(first.rsplit("-", 1)[-1])
    r = train(path, out, f"max_steps={step + 2}")
    assert r.returncode == 0, r.stderr[-3000:]
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps[-2:] == [step + 1, step + 2]


def coordinator_on_host_a(cluster, monkeypatch, ns_a, addr_a):
    """Starts the cluster's coordinator on host A with a token, and runs its
    CLI there; returns the environment for workers (one thread each, the
    same token)."""
    cluster.prefix = ["ip", "netns", "exec", ns_a]
    monkeypatch.setenv("BALLAST_TOKEN", "chaos-token")
    cluster.start_coordinator(host=addr_a)
    return {**ONE_THREAD, "BALLAST_TOKEN": "chaos-token"}


def test_a_worker_cut_off_by_the_network_is_requeued_once_and_never_runs_twice(
        inputs, two_hosts, monkeypatch, cluster):
    """Worker B's veth goes down mid-job. Its lease runs out; its agent stops
    keeping its rank alive, so the rank fences itself; only then does the job
    start again on A, from B's last checkpoint. The link comes back: B's
    stale reports change nothing. One requeue, no step trained twice."""
    (ns_a, addr_a, _), (ns_b, addr_b, dev_b) = two_hosts
    env = coordinator_on_host_a(cluster, monkeypatch, ns_a, addr_a)
    b = cluster.start_worker("wb", cpu_slots=1, host=addr_b, prefix=["ip", "netns", "exec", ns_b],
                             env=env)
    job_id = cluster.submit(long_spec(inputs, steps=600, every=5))
    wait_for(lambda: int(cluster.job(job_id).get("checkpoint_step", 0)) >= 5, 120,
             "a checkpoint on B")
    cluster.start_worker("wa", cpu_slots=1, host=addr_a, env=env)
    ranks_on_b = [p for p in b.descendants() if "ballast-train" in " ".join(p.cmdline())]
    assert ranks_on_b
    r = ip("-n", ns_b, "link", "set", dev_b, "down")
    assert r.returncode == 0, r.stderr

    # B's rank ends by itself before the job's next attempt starts on A.
    job = wait_for(lambda: (lambda j: j if int(j.get("restarts", 0)) >= 1 else None)(
        cluster.job(job_id)), 60, "the requeue")
    assert all(not p.is_running() or p.status() == "zombie" for p in ranks_on_b), \
        "B's rank still ran when the job was requeued"
    assert ip("-n", ns_b, "link", "set", dev_b, "up").returncode == 0

    r = cluster.cli("watch", job_id, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    assert int(job["restarts"]) == 1
    with open(os.path.join(job["output_dir"], "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f]
    assert steps == list(range(1, 601)), "a step was trained twice, or lost"


def test_every_worker_cut_off_at_once_requeues_each_job_once_and_resumes_when_back(
        inputs, two_hosts, monkeypatch, cluster):
    """Both workers live on host B, each running a job; B's link goes down,
    so the coordinator loses every worker at once. Both leases run out, both
    ranks fence themselves, and both jobs wait in the queue with no worker
    to run them. The link comes back: the workers register again, each job
    resumes from its last checkpoint, once, and no step is trained twice."""
    (ns_a, addr_a, _), (ns_b, addr_b, dev_b) = two_hosts
    env = coordinator_on_host_a(cluster, monkeypatch, ns_a, addr_a)
    on_b = ["ip", "netns", "exec", ns_b]
    workers = [cluster.start_worker(name, cpu_slots=1, host=addr_b, prefix=on_b, env=env)
               for name in ("wb1", "wb2")]
    # Enough that neither rank can finish its job between the cut and its
    # fence (a few seconds; about 30 ms a step here).
    steps = 600
    jobs = [cluster.submit(long_spec(inputs, steps=steps, every=5), f"job{i}.yaml")
            for i in range(2)]
    wait_for(lambda: all(int(cluster.job(j).get("checkpoint_step", 0)) >= 5 for j in jobs), 120,
             "a checkpoint of each job")
    ranks = [p for w in workers for p in w.descendants()
             if "ballast-train" in " ".join(p.cmdline())]
    assert len(ranks) == 2, ranks
    assert ip("-n", ns_b, "link", "set", dev_b, "down").returncode == 0

    # Both jobs go back to the queue, with no live worker left to take them,
    # and only after their ranks ended.
    wait_for(lambda: all(int(cluster.job(j).get("restarts", 0)) >= 1 for j in jobs), 60,
             "both requeues")
    assert all(not p.is_running() or p.status() == "zombie" for p in ranks), \
        "a rank still ran when its job was requeued"
    assert not [w for w in cluster.list_workers() if w.get("alive")]
    assert {cluster.job(j)["state"] for j in jobs} == {"JOB_STATE_QUEUED"}
    assert ip("-n", ns_b, "link", "set", dev_b, "up").returncode == 0

    for job_id in jobs:
        job = cluster.wait_state(job_id, ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"), 600)
        assert job["state"] == "JOB_STATE_SUCCEEDED", job.get("failure_reason")
        assert int(job["restarts"]) == 1
        with open(os.path.join(job["output_dir"], "metrics.jsonl")) as f:
            trained = [json.loads(line)["step"] for line in f]
        assert trained == list(range(1, steps + 1)), "a step was trained twice, or lost"
