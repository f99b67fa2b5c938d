"""Chaos with real processes (issue 20): what a kill -9, a SIGTERM, a full
disk, a truncated checkpoint shard, a corrupted store page and a network
cut (of one worker, or of every worker at once) do to Ballast.
Nothing acknowledged is lost, no watcher misses an event, a damaged
checkpoint or store is detected and named, never loaded."""
import concurrent.futures
import json
import os
import signal
import subprocess
import time

import pytest

from cluster import CLI, wait_for, write_spec
from test_control_plane import inputs, long_spec, spec  # noqa: F401
from test_gang import ONE_THREAD, ip, two_hosts  # noqa: F401


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
