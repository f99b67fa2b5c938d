"""Two ballastd on one PostgreSQL (issue 36): one leads, the other stands
by naming it. A kill -9 of the leader in the middle of 200 submits and of a
running 2-rank job: the standby takes over once the lease ends, every
acknowledged submit is there exactly once, the job trains on in the same
attempt until cancelled, a watcher
(`ballast watch` given both addresses) sees every seq once, and the new
leader's /metrics has the job. A leader frozen past its lease (SIGSTOP) is
deposed: once thawed it serves nothing, and no second copy of its job ever
runs. A leader whose jobs take longer than a lease to load keeps the lease
meanwhile, and the standby stays a standby. Real processes, real gRPC over
loopback, a throwaway PostgreSQL."""
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from cluster import BALLASTD, CLI, Process, train_ranks, wait_for
from test_control_plane import inputs, long_spec  # noqa: F401
from test_gang import ONE_THREAD
from test_postgres_store import postgres_url  # noqa: F401
from test_python_client import stubs  # noqa: F401

# The leader renews every fifth of this; a standby takes over once it ends.
LEADER_LEASE_MS = 5000
SUBMITS = 200
LEADER = "ballast-leader"


@pytest.fixture
def ballastds(postgres_url, make_cluster):
    """start(cluster, name): a ballastd on the test's PostgreSQL, stopped
    after the test (before the cluster's workers and the database)."""
    started = []

    def start(cluster, name, lease_ms=LEADER_LEASE_MS):
        started.append(start_ballastd(cluster, name, postgres_url, lease_ms))
        return started[-1]

    yield start
    for process, _, _ in started:
        process.stop()


def start_ballastd(cluster, name, postgres_url, lease_ms=LEADER_LEASE_MS):
    """A ballastd on `postgres_url`, sharing the cluster's output root; its
    Process and its addresses, once serving (as leader or standby)."""
    ready = os.path.join(cluster.root, f"{name}.ready.json")
    argv = [BALLASTD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
            "--state-dir", os.path.join(cluster.root, f"state-{name}"),
            "--output-root", os.path.join(cluster.root, "jobs"), "--ready-file", ready,
            "--store", postgres_url, "--leader-lease-ms", str(lease_ms),
            "--lease-ms", str(cluster.lease_ms), "--stop-grace-ms", str(cluster.stop_grace_ms)]
    process = Process(argv, os.path.join(cluster.root, f"{name}.log"))

    def ready_info():
        if not process.alive():
            raise AssertionError(f"{name} exited:\n" + process.output())
        try:
            with open(ready) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    info = wait_for(ready_info, 30, f"{name}'s ready file")
    return process, info["grpc"], info["http"]


class Coordinators:
    """A JobService client given every coordinator: a call refused by a
    standby goes to the leader it names, one that finds no coordinator
    tries the next, until `give_up` seconds have passed."""

    def __init__(self, stubs, addresses):
        self.pb, self.grpc_pb = stubs[1], stubs[2]
        self.addresses = addresses
        self.current = addresses[0]
        self.lock = threading.Lock()
        self.channels = {a: grpc.insecure_channel(a) for a in addresses}

    def call(self, method, request, give_up=90):
        deadline = time.monotonic() + give_up
        while True:
            with self.lock:
                address = self.current
            stub = self.grpc_pb.JobServiceStub(self.channels[address])
            try:
                return getattr(stub, method)(request, timeout=10), address
            except grpc.RpcError as e:
                # Refused by a standby or a deposed leader, or cut by the
                # kill (UNAVAILABLE or CANCELLED): retried with its request id.
                deposed = (e.code() == grpc.StatusCode.ABORTED
                           and e.details().startswith(("deposed:", "standby:")))
                cut = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
                if not cut and not deposed:
                    raise
                if time.monotonic() > deadline:
                    raise
                leader = dict(e.trailing_metadata() or ()).get(LEADER)
                with self.lock:
                    if self.current == address:
                        self.current = leader if leader in self.channels else self.addresses[
                            (self.addresses.index(address) + 1) % len(self.addresses)]
                time.sleep(0.05)

    def close(self):
        for channel in self.channels.values():
            channel.close()


def refusal(stubs, address):
    """The UNAVAILABLE a standby answers ListJobs with: (details, leader)."""
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            stubs[2].JobServiceStub(channel).ListJobs(stubs[1].ListJobsRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
    return refused.value.details(), dict(refused.value.trailing_metadata() or ()).get(LEADER)


def serves(stubs, address):
    try:
        with grpc.insecure_channel(address) as channel:
            stubs[2].JobServiceStub(channel).ListJobs(stubs[1].ListJobsRequest(), timeout=2)
        return True
    except grpc.RpcError:
        return False


def two_rank_spec(inputs, steps):
    job = long_spec(inputs, steps=steps, every=2)
    job["devices"] = 2
    job["data"]["grad_accum_steps"] = 2
    return job


def test_kill9_of_the_leader_mid_burst_and_mid_job_loses_nothing(postgres_url, make_cluster,
                                                                  ballastds, inputs, stubs):
    # A worker lease far above the failover: the ranks keep training through it.
    cluster = make_cluster(lease_ms=30000)
    first, first_grpc, _ = ballastds(cluster, "first")
    second, second_grpc, second_http = ballastds(cluster, "second")
    both = f"{first_grpc},{second_grpc}"
    details, leader = refusal(stubs, second_grpc)
    assert leader == first_grpc and f"the leader is {first_grpc}" in details, details
    cluster.grpc = both  # the worker and every CLI call get both addresses
    cluster.coordinator = first
    cluster.start_worker("w1", cpu_slots=2, env=ONE_THREAD)
    # Runs until cancelled: it must still be training when the new leader
    # takes over, however fast the machine.
    job_id = cluster.submit(two_rank_spec(inputs, steps=100000))
    watcher = subprocess.Popen([CLI, "--coordinator", both, "-v", "watch", job_id, "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = Coordinators(stubs, [first_grpc, second_grpc])
    try:
        wait_for(lambda: int(cluster.job(job_id).get("step", 0)) >= 4, 120, "step 4")
        _, pb, _, spec_pb = stubs
        burst_spec = spec_pb.JobSpec()
        burst_spec.CopyFrom(client.call("GetJob", pb.GetJobRequest(job_id=job_id))[0].spec)
        burst_spec.devices = 1

        # The first half is sent at once, and the kill comes among their
        # answers; the second half only after the kill, during the failover.
        killed = threading.Event()

        def submit(i):
            if i >= SUBMITS // 2:
                killed.wait()
            request = pb.SubmitJobRequest(spec=burst_spec, request_id=f"burst-{i}")
            job, address = client.call("SubmitJob", request)
            return i, job.id, address, time.monotonic()

        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            futures = [pool.submit(submit, i) for i in range(SUBMITS)]
            wait_for(lambda: sum(f.done() for f in futures) >= 20, 60, "the first acks")
            first.kill9()
            killed_at = time.monotonic()
            killed.set()
            wait_for(lambda: serves(stubs, second_grpc), 30, "the standby to take over")
            took_over = time.monotonic() - killed_at
            step_at_takeover = int(cluster.job(job_id).get("step", 0))
            results = [f.result() for f in futures]
        print(f"failover: the standby served {took_over:.2f} s after the kill -9 "
              f"(leader lease {LEADER_LEASE_MS} ms)")

        acked = {i: job for i, job, _, _ in results}
        assert len(acked) == SUBMITS
        assert any(t < killed_at for *_, t in results), "nothing acknowledged before the kill"
        assert any(a == second_grpc for _, _, a, _ in results), "nothing acked by the new leader"
        r = cluster.cli("list", "-o", "json", "--limit", "1000")
        assert r.returncode == 0, r.stderr
        by_request = {}
        for job in json.loads(r.stdout)["jobs"]:
            by_request.setdefault(job.get("request_id"), []).append(job["id"])
        for i, job in acked.items():
            assert by_request.get(f"burst-{i}") == [job], f"burst-{i}: {by_request.get(f'burst-{i}')}"

        # The job trains on under the new leader, in the same attempt: its
        # ranks ran through the failover (the worker registered again with
        # both running, below).
        wait_for(lambda: int(cluster.job(job_id).get("step", 0)) > step_at_takeover + 10, 120,
                 "steps reported to the new leader")
        job = cluster.job(job_id)
        assert job["state"] == "JOB_STATE_RUNNING" and int(job.get("restarts", 0)) == 0, job
        r = cluster.cli("cancel", job_id)
        assert r.returncode == 0, r.stdout + r.stderr
        done = cluster.wait_state(job_id, ["JOB_STATE_CANCELLED"], 120)
        out, err = watcher.communicate(timeout=120)
    finally:
        client.close()
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 1, err  # 1: the job was cancelled
    seqs = [int(json.loads(line)["seq"]) for line in out.splitlines() if line.startswith("{")]
    assert seqs == list(range(1, seqs[-1] + 1)), "a gap or a repeat in the watched events"
    assert json.loads(out.splitlines()[-1])["state_change"]["to"] == done["state"]
    assert f"coordinator {second_grpc} answered" in err, err
    # The worker followed the new leader; the job's series are on its /metrics.
    # It registered again there with the job's two ranks still running.
    with open(os.path.join(cluster.root, "w1.log")) as f:
        worker_log = f.read()
    assert re.search(rf"registered as \S+ with {second_grpc} \(.*; 2 running ranks", worker_log), \
        worker_log
    metrics = urllib.request.urlopen(f"http://{second_http}/metrics", timeout=10).read().decode()
    assert f'ballast_job_step{{job_id="{job_id}"' in metrics or \
        any(line.startswith("ballast_job_step{") and job_id in line
            for line in metrics.splitlines()), "no ballast_job_step series of the job"
    assert "leading at epoch 2" in second.output()
    # `ballast health` given both: the dead one does not answer, the new
    # leader is SERVING.
    r = cluster.cli("health")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_leader_frozen_past_its_lease_is_deposed_and_never_runs_a_second_copy(
        postgres_url, make_cluster, ballastds, inputs, stubs):
    cluster = make_cluster(lease_ms=3000)
    first, first_grpc, first_http = ballastds(cluster, "first")
    second, second_grpc, _ = ballastds(cluster, "second")
    cluster.grpc = f"{first_grpc},{second_grpc}"
    cluster.coordinator = first
    cluster.start_worker("w1", cpu_slots=2, env=ONE_THREAD)
    job_id = cluster.submit(two_rank_spec(inputs, steps=30))
    output_dir = wait_for(lambda: cluster.job(job_id).get("output_dir"), 30, "the output dir")
    wait_for(lambda: int(cluster.job(job_id).get("step", 0)) >= 2, 120, "step 2")

    # Sampled all along: never more ranks of the job than its gang.
    most = [0]
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            most[0] = max(most[0], len(train_ranks(output_dir)))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        os.kill(first.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: serves(stubs, second_grpc), 30, "the standby to take over")
            # Frozen for a worker lease beyond the takeover: thawed, it finds
            # every lease of its own long expired, and would requeue and
            # reschedule its jobs were it not fenced.
            time.sleep(cluster.lease_ms / 1000 + 1)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        # Thawed, it serves nothing: it refuses at once (its lease lapsed),
        # then names the new leader once it has found itself deposed.
        details, _ = wait_for(lambda: (lambda r: r if r[1] == second_grpc else None)(
            refusal(stubs, first_grpc)), 30, "the deposed leader to name the new one")
        assert f"the leader is {second_grpc}" in details
        assert "stepping down to standby: deposed" in first.output(), first.output()
        with pytest.raises(urllib.error.HTTPError) as probe:
            urllib.request.urlopen(f"http://{first_http}/healthz", timeout=10)
        assert probe.value.code == 503
        done = cluster.wait_state(job_id, ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"], 240)
    finally:
        sampling.set()
        sampler.join()
    assert done["state"] == "JOB_STATE_SUCCEEDED", done
    assert 0 < most[0] <= 2, f"{most[0]} ranks of a 2-rank job ran at once"
    assert "leading at epoch 2" in second.output()
    assert "stepping down" not in second.output()
    # What the thawed leader tried to write (its lease thread runs on until
    # it steps down) the database refused: by the epoch, naming the new
    # leader, or, for a transaction the freeze caught open, by having ended
    # it (idle_in_transaction_session_timeout) and closed its connection.
    for line in first.output().splitlines():
        if "store write failed" in line:
            assert f"ABORTED: deposed: this coordinator led at epoch 1; the leader is now " \
                   f"{second_grpc} at epoch 2" in line or \
                   "server closed the connection unexpectedly" in line, line


def test_a_leader_loading_for_longer_than_its_lease_keeps_it(postgres_url, make_cluster,
                                                             ballastds, stubs):
    """Loading the jobs outlasts a 1 s lease here because another session
    holds the workers table (read first when a leader loads) locked for 4 s. The leader renews the lease while
    it loads: the standby started beside it never takes it, and the leader
    never steps down (before, the lease lapsed under a loading leader, the
    standby took it, and each deposed the other in turn)."""
    cluster = make_cluster()
    first, _, _ = ballastds(cluster, "first", lease_ms=1000)  # makes the schema
    first.stop()
    locked = subprocess.Popen(
        ["psql", postgres_url, "-v", "ON_ERROR_STOP=1", "-c",
         "BEGIN; LOCK TABLE workers IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(4); COMMIT;"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # the lock taken before either starts
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        leader = pool.submit(ballastds, cluster, "leader", 1000)
        time.sleep(0.3)
        standby, _, _ = ballastds(cluster, "standby", lease_ms=1000)
        leader_process, leader_grpc, _ = leader.result(timeout=60)
    assert locked.wait(timeout=30) == 0, locked.stderr.read()
    time.sleep(2)  # rounds of the lease after the load
    log = leader_process.output()
    loaded = re.findall(r"leading at epoch \d+ as \S+ \(jobs loaded in ([\d.]+)(m?s)\)", log)
    assert len(loaded) == 1, log
    seconds = float(loaded[0][0]) / (1000 if loaded[0][1] == "ms" else 1)
    assert seconds > 1.0, log  # the load outlasted the lease
    assert "stepping down" not in log, log
    assert "leading at epoch" not in standby.output(), standby.output()
    assert serves(stubs, leader_grpc)
