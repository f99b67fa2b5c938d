"""How ranks stop, with real processes: SIGTERM on a standalone run, and
fencing, where a worker frozen past its lease must not leave a rank running
beside the one that replaces it. (Cancel: test_control_plane.py.)"""
import json
import os
import signal
import subprocess
import threading
import time

import psutil

from cluster import train_ranks, wait_for, write_spec
from reference import TRAIN
# The fixtures (a cluster with a 3 s lease, the tiny model and data) and the
# specs of the control-plane tests.
from test_control_plane import TERMINAL, inputs, long_spec  # noqa: F401


def steps_in(path):
    with open(path) as f:
        return [json.loads(line)["step"] for line in f]


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def test_sigterm_stops_a_standalone_run_at_a_step_boundary_with_exit_143(tmp_path, inputs):
    write_spec(str(tmp_path / "job.yaml"), **long_spec(inputs, every=0))
    out = tmp_path / "out"
    with open(tmp_path / "train.log", "wb") as log:
        p = subprocess.Popen([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", str(out)],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: os.path.exists(out / "metrics.jsonl") and
                 read(out / "metrics.jsonl").count("\n") >= 2, 120, "two steps")
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 143
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "cancelled after step" in read(tmp_path / "train.log")
    steps = steps_in(out / "metrics.jsonl")
    assert steps == list(range(1, len(steps) + 1))
    assert not os.path.exists(out / "adapter")
    # A standalone run writes straight into --out (README's layout).
    assert not os.path.exists(out / "attempts")


class RankWatch:
    """Samples the ballast-train processes of one output folder every 10 ms:
    when each was created, when it was first seen (time.time(); create_time
    comes from the boot time, which is whole seconds, so only `seen` is on
    time.time()'s clock to better than a second), and when it was first seen
    gone (an upper bound on its exit; a zombie left by a frozen parent counts
    as gone)."""

    def __init__(self, output_dir):
        self.output_dir = output_dir
        self.created = {}  # pid -> create_time
        self.seen = {}  # pid -> time first seen
        self.gone = {}  # pid -> time first seen gone
        self.most_at_once = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            running = set()
            for p in train_ranks(self.output_dir):
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        self.created.setdefault(p.pid, p.create_time())
                        self.seen.setdefault(p.pid, time.time())
                        running.add(p.pid)
                except psutil.NoSuchProcess:
                    pass
            now = time.time()
            for pid in self.created:
                if pid not in running:
                    self.gone.setdefault(pid, now)
            self.most_at_once = max(self.most_at_once, len(running))
            time.sleep(0.01)

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=10)


def test_worker_frozen_past_its_lease_fences_its_rank_before_the_job_runs_elsewhere(
        cluster, inputs):
    # The cluster's short lease (3 s) keeps the test quick: the rank fences
    # itself 1.5 s after its worker's last keepalive, and the job moves 1.5 s
    # + 1 s after the lease runs out.
    cluster.start_coordinator()
    first = cluster.start_worker("w1")
    # Enough steps that the frozen worker's rank is still training when its
    # fence falls: at 150 it once finished them all first (CI, a quiet moment).
    steps = 600
    job_id = cluster.submit(long_spec(inputs, steps=steps, every=2))
    job = wait_for(lambda: (lambda j: j if int(j.get("checkpoint_step", 0)) >= 2 else None)(
        cluster.job(job_id)), 120, "the first checkpoint")
    out = job["output_dir"]
    cluster.start_worker("w2")
    watch = RankWatch(out)
    try:
        [old] = train_ranks(out)
        # Only the agent freezes; its rank, in its own process group, runs on.
        os.kill(first.pid, signal.SIGSTOP)
        try:
            wait_for(lambda: old.pid in watch.created, 10, "the watcher to see the first rank")
            new_pid = wait_for(
                lambda: next((pid for pid in watch.created if pid != old.pid), None), 120,
                "the job to start on the second worker")
            old_gone = wait_for(lambda: watch.gone.get(old.pid), 30, "the first rank to exit")
            # Gone before its replacement was created: the two never ran at
            # once (create_time is exact to 10 ms, the sampling to about as
            # much; the gap should be the margin and more, a second or two).
            assert old_gone < watch.created[new_pid], (old_gone, watch.created[new_pid])
            assert watch.most_at_once == 1
            assert "no keepalive from the worker" in read(os.path.join(out, "rank-0.log"))
        finally:
            os.kill(first.pid, signal.SIGCONT)
        job = cluster.wait_state(job_id, TERMINAL, 300)
    finally:
        watch.stop()
    assert job["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(job["restarts"]) == 1
    # The thawed worker reported its rank's fenced exit (code 3) for an
    # attempt the coordinator had moved past.
    wait_for(lambda: "exited with code 3" in first.output(), 30, "w1 to report its rank's exit")
    assert int(cluster.job(job_id)["restarts"]) == 1
    # No stale or duplicate line: each step once, in order.
    assert steps_in(os.path.join(out, "metrics.jsonl")) == list(range(1, steps + 1))
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    assert read(os.path.join(out, "attempt")).strip() == "2"
