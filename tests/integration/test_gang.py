"""Multi-rank jobs end to end with real processes: a gang placed over two
workers, a rank killed mid-run, a gang whose Gloo traffic crosses a veth pair
between two network namespaces, and `ballast-train` starting a spec's ranks
without a coordinator. Each rank trains on one thread (OMP_NUM_THREADS=1), as CPU
slots and `--nproc` give them on this 2-core machine."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid

import psutil
import pytest

from cluster import train_ranks, wait_for, write_spec
from reference import TRAIN
from test_control_plane import inputs, spec  # noqa: F401
from test_rank_stop import read, steps_in

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def gang_spec(inputs, ranks, **overrides):
    """The control-plane tests' job for `ranks` ranks: each step's
    micro-batches split evenly over them (one each). `devices` is the gang
    under a coordinator, and ballast-train starts that many ranks standalone."""
    job = spec(inputs, **{"devices": ranks, **overrides})
    job["data"]["grad_accum_steps"] = ranks
    return job


def alive(process):
    """Running and not a zombie; a process that exits between the two
    questions is gone (psutil raises then)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def where_they_are(ranks, out):
    """The stacks of the ranks still running (gdb, where installed) and every
    rank's log: what a hang needs to be understood from a CI log alone."""
    report = []
    for p in ranks:
        if not alive(p):
            continue
        report.append(f"==== rank {rank_of(p)} (pid {p.pid}) is still running")
        if shutil.which("gdb"):
            r = subprocess.run(["gdb", "-batch", "-p", str(p.pid), "-ex", "thread apply all bt"],
                               capture_output=True, text=True, timeout=120)
            report.append(r.stdout[-20000:])
    for name in sorted(os.listdir(out)):
        if name.startswith("rank-") and name.endswith(".log"):
            report.append(f"==== {name}\n{read(os.path.join(out, name))[-4000:]}")
    return "\n".join(report)


def rank_of(process):
    cmd = process.cmdline()
    return int(cmd[cmd.index("--rank") + 1])


def test_a_four_rank_job_on_two_workers_succeeds_and_its_events_carry_every_rank(
        inputs, cluster):
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2)
    cluster.start_worker("w2", cpu_slots=2)
    job_id = cluster.submit(gang_spec(inputs, 4, max_steps=4, checkpoint_every=2))

    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step 4/4" in r.stdout
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    assert int(job.get("restarts", 0)) == 0

    # Every rank's log lines reach `ballast logs`, each saying whose it is.
    logs = cluster.cli("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert {int(m) for m in re.findall(r"^\[rank (\d+)\]", logs.stdout, re.M)} == {0, 1, 2, 3}
    # The gang spanned both workers, two ranks each, and every rank exited 0.
    for w in cluster.workers:
        lines = w.output().splitlines()
        assert sum("started rank" in line and job_id in line for line in lines) == 2
        assert sum(f"of {job_id} attempt 1 exited with code 0" in line for line in lines) == 2
    # Each rank's own series: four steps timed, bytes sent, memory measured.
    with urllib.request.urlopen(f"http://{cluster.http}/metrics", timeout=10) as page:
        metrics = page.read().decode()
    for rank in range(4):
        labels = f'{{job_id="{job_id}",rank="{rank}"}}'
        assert f"ballast_rank_step_seconds_count{labels} 4\n" in metrics, metrics
        sent = re.search(rf"ballast_rank_communicated_bytes_total{re.escape(labels)} (\S+)", metrics)
        memory = re.search(rf"ballast_rank_peak_memory_bytes{re.escape(labels)} (\S+)", metrics)
        assert sent and float(sent.group(1)) > 0 and memory and float(memory.group(1)) > 0
        # Four ranks wait on each other in every step's gathers and sums.
        waited = re.search(rf"ballast_rank_collective_wait_seconds_total{re.escape(labels)} (\S+)",
                           metrics)
        assert waited and float(waited.group(1)) > 0, metrics
    # Rank 0 alone wrote the job's outputs.
    out = job["output_dir"]
    assert steps_in(os.path.join(out, "metrics.jsonl")) == [1, 2, 3, 4]
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    assert sorted(f for f in os.listdir(out) if f.startswith("rank-")) == [
        f"rank-{r}.log" for r in range(4)]


def test_b_a_rank_killed_mid_run_ends_its_peers_and_the_job_resumes_and_finishes(
        inputs, make_cluster):
    # A long stop grace: the peers must end by themselves, on the lost rank,
    # not because their workers' SIGKILL came first.
    cluster = make_cluster(stop_grace_ms=60000)
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2)
    cluster.start_worker("w2", cpu_slots=2)
    # 40 steps: the kill comes after step 3 is seen, and under a loaded
    # machine's polling a 12-step job once finished before it.
    job_id = cluster.submit(gang_spec(inputs, 4, max_steps=40, checkpoint_every=2,
                                      schedule={"kind": "constant", "warmup_steps": 0}))
    job = wait_for(lambda: (lambda j: j if int(j.get("step", 0)) >= 3 else None)(
        cluster.job(job_id)), 180, "three steps")
    out = job["output_dir"]
    ranks = {rank_of(p): p for p in train_ranks(out)}
    assert sorted(ranks) == [0, 1, 2, 3]

    ranks[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    peers = [ranks[r] for r in (0, 2, 3)]
    try:
        wait_for(lambda: not any(alive(p) for p in peers), 30,
                 "the peers of the killed rank to exit")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{where_they_are(peers, out)}") from None
    assert time.monotonic() - killed_at < 30
    # Every peer names the killed rank: rank 0 keeps its store up until the
    # others have named it too.
    logs = {r: read(os.path.join(out, f"rank-{r}.log")) for r in (0, 2, 3)}
    for r, log in logs.items():
        assert re.search(r"lost rank 1\b", log), f"rank-{r}.log does not name rank 1:\n{log}"

    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    assert int(job["restarts"]) == 1
    assert "rank " in job.get("failure_reason", "") or "restart 1 of" in r.stdout
    steps = steps_in(os.path.join(out, "metrics.jsonl"))
    assert steps == list(range(1, 41)), "the second attempt resumed and redid nothing twice"


# -- two hosts -----------------------------------------------------------------

def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair, 10.77.x.1 and 10.77.x.2,
    each with its own loopback. Removed on every path."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    names = [f"ballast-{tag}-a", f"ballast-{tag}-b"]
    subnet = f"10.77.{int(tag[:2], 16)}"
    made = []
    try:
        for ns in names:
            r = ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        veth = [f"bv{tag}a", f"bv{tag}b"]
        r = ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        if r.returncode != 0:
            pytest.skip(f"cannot make a veth pair here: {r.stderr.strip()}")
        addrs = [f"{subnet}.1", f"{subnet}.2"]
        for ns, dev, addr in zip(names, veth, addrs):
            for cmd in (["link", "set", dev, "netns", ns],
                        ["-n", ns, "addr", "add", f"{addr}/24", "dev", dev],
                        ["-n", ns, "link", "set", dev, "up"],
                        ["-n", ns, "link", "set", "lo", "up"]):
                r = ip(*cmd)
                assert r.returncode == 0, f"ip {' '.join(cmd)}: {r.stderr}"
        yield [(ns, addr, dev) for ns, addr, dev in zip(names, addrs, veth)]
    finally:
        for ns in made:
            # Deleting a namespace kills nothing: end what still runs in it.
            pids = ip("netns", "pids", ns).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns)  # takes its end of the veth pair with it


def start_on_two_hosts(cluster, two_hosts, monkeypatch, cpu_slots):
    """The coordinator and a worker wa on host A, a worker wb on host B, each
    worker with `cpu_slots` slots."""
    (ns_a, addr_a, _), (ns_b, addr_b, _) = two_hosts
    # The coordinator and the CLI live on host A; host B reaches them over the veth.
    cluster.prefix = ["ip", "netns", "exec", ns_a]
    # Off loopback, ballastd wants a token; every process here inherits it.
    monkeypatch.setenv("BALLAST_TOKEN", "gang-test-token")
    env = {**ONE_THREAD, "BALLAST_TOKEN": "gang-test-token"}
    cluster.start_coordinator(host=addr_a)
    cluster.start_worker("wa", cpu_slots=cpu_slots, host=addr_a, env=env)
    cluster.start_worker("wb", cpu_slots=cpu_slots, host=addr_b,
                         prefix=["ip", "netns", "exec", ns_b], env=env)


def test_c_a_two_rank_job_over_two_hosts_trains_across_the_veth(inputs, two_hosts, monkeypatch,
                                                                cluster):
    (ns_a, addr_a, dev_a), (ns_b, addr_b, dev_b) = two_hosts
    start_on_two_hosts(cluster, two_hosts, monkeypatch, cpu_slots=1)

    def veth_bytes():
        counters = []
        for ns, dev in ((ns_a, dev_a), (ns_b, dev_b)):
            r = ip("-n", ns, "-s", "-j", "link", "show", dev)
            stats = json.loads(r.stdout)[0]["stats64"]
            counters.append(stats["tx"]["bytes"])
        return counters

    before = veth_bytes()
    job_id = cluster.submit(gang_spec(inputs, 2, max_steps=3, checkpoint_every=3))
    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert cluster.job(job_id)["state"] == "JOB_STATE_SUCCEEDED"
    workers = {w["host"]: w for w in cluster.list_workers()}
    assert set(workers) == {addr_a, addr_b}
    # Both sides sent far more than heartbeats: the ranks' collectives crossed.
    sent = [after - b for after, b in zip(veth_bytes(), before)]
    assert min(sent) > 100_000, f"bytes sent over the veth per side: {sent}"


def test_c_a_hybrid_job_over_two_hosts_keeps_each_shard_group_on_one(inputs, two_hosts,
                                                                    monkeypatch, cluster):
    """sharding hybrid with shard groups of 2 on two hosts of 2 slots: each
    shard group is placed on one host, its gathers stay there, and what
    crosses the veth is the replicas' allreduce (and the world's few sums)."""
    (ns_a, _, dev_a), _ = two_hosts
    start_on_two_hosts(cluster, two_hosts, monkeypatch, cpu_slots=2)

    def veth_sent():
        r = ip("-n", ns_a, "-s", "-j", "link", "show", dev_a)
        return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]

    before = veth_sent()
    job_id = cluster.submit(gang_spec(inputs, 4, max_steps=3,
                                      sharding={"strategy": "hybrid", "shard_group": 2}))
    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    sent = veth_sent() - before
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    # Each worker (host) ran one whole shard group: ranks 0 and 1, or 2 and 3.
    started = [sorted(int(r) for r in re.findall(rf"started rank (\d+) of {job_id}", w.output()))
               for w in cluster.workers]
    assert sorted(started) == [[0, 1], [2, 3]], started
    steps = [json.loads(line) for line in open(os.path.join(job["output_dir"], "metrics.jsonl"))]
    steps = [m for m in steps if "eval" not in m]
    replica = sum(m["replica_communicated_bytes"] for m in steps)
    in_group = sum(m["communicated_bytes"] for m in steps) - replica
    assert replica > 0
    # Host A's two ranks each allreduce their shards with their replica on B
    # (each counted `replica` bytes, a ring's share); their gathers and
    # reduce-scatters, several times more, stay on A. Measured: 281 kB sent
    # for 2 x 112 kB of allreduce, against 1.57 MB in rank 0's shard group.
    assert 2 * replica <= sent < in_group, (sent, replica, in_group)


# -- ballast-train --nproc ------------------------------------------------------

def run_nproc(tmp_path, job_spec, *extra, timeout=300):
    write_spec(str(tmp_path / "job.yaml"), **job_spec)
    return subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                           str(tmp_path / "out"), *extra], capture_output=True, text=True,
                          timeout=timeout)


def test_d_nproc_2_trains_standalone_into_one_metrics_file_and_one_export(tmp_path, inputs):
    r = run_nproc(tmp_path, gang_spec(inputs, 2, max_steps=4), "--nproc", "2")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert steps_in(out / "metrics.jsonl") == [1, 2, 3, 4]
    assert os.path.exists(out / "adapter" / "adapter_model.safetensors")
    assert "[rank 0] " in r.stderr and "[rank 1] " in r.stderr


def test_nproc_ends_with_the_first_failing_ranks_code_and_names_it(tmp_path, inputs):
    # Every rank refuses the data file (exit 2); the launcher says which failed
    # first.
    r = run_nproc(tmp_path, gang_spec(inputs, 2, max_steps=4), "--nproc", "2",
                  "--set", "data.path=/nonexistent/data.jsonl")
    assert r.returncode == 2, r.stderr
    assert re.search(r"^\[rank [01]\] ballast-train: data.path: /nonexistent/data.jsonl does not "
                     r"exist", r.stderr, re.M)
    assert re.search(r"^ballast-train: rank [01] of 2 exited with code 2", r.stderr, re.M)


def test_nproc_is_refused_with_flags_of_a_rank_under_a_worker(tmp_path, inputs):
    for flags in (["--rank", "0"], ["--world-size", "2"], ["--agent-socket", "/tmp/x.sock"]):
        r = run_nproc(tmp_path, spec(inputs, max_steps=4), "--nproc", "2", *flags)
        assert r.returncode == 2, r.stderr
        assert f"cannot be combined with {flags[0]}" in r.stderr


def test_sigterm_to_the_launcher_reaches_its_ranks_and_ends_it_with_143(tmp_path, inputs):
    # No --nproc: a spec of 2 devices started alone launches its 2 ranks.
    write_spec(str(tmp_path / "job.yaml"),
               **gang_spec(inputs, 2, max_steps=100000,
                           schedule={"kind": "constant", "warmup_steps": 0}))
    out = tmp_path / "out"
    with open(tmp_path / "train.log", "wb") as log:
        p = subprocess.Popen([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", str(out)],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(train_ranks(str(out))) == 3, 60, "the launcher and its 2 ranks")
        ranks = [q for q in train_ranks(str(out)) if q.pid != p.pid]
        wait_for(lambda: os.path.exists(out / "metrics.jsonl"), 120, "the first step")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
        assert not any(q.is_running() and q.status() != "zombie" for q in ranks)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    log = read(tmp_path / "train.log")
    assert "[rank 0] ballast-train: cancelled after step" in log, log
    assert "[rank 1] " in log
