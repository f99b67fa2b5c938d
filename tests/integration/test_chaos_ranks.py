"""Chaos for one rank of a gang: kill -9 of a rank during a step, and SIGSTOP
of a rank for twice the collective timeout (ballast-worker
--collective-timeout), in a two-rank ZeRO-3 job on CPU (Gloo) under
ballastd, each rank on its own worker.

Each case checks that the surviving rank leaves its collective within the
timeout and a margin, that the job restarts from its newest checkpoint
(restarts 1, every step once), and, for SIGSTOP, that the stopped rank,
continued after its peers gave up on it, exits fenced (code 3) without
writing anything more. Each prints how long it took (docs/reliability.md)."""
import os
import signal
import time

import pytest

from cluster import train_ranks, wait_for
from test_control_plane import TERMINAL, inputs  # noqa: F401
from test_gang import alive, gang_spec, rank_of, where_they_are
from test_rank_stop import RankWatch, read, steps_in

# Small, so that each case takes about a minute; the default is 60 s.
COLLECTIVE_TIMEOUT_S = 8
# On top of the timeout, for the loaded 2-core CI machine: the lost rank's
# heartbeat is read every 0.5 s, the survivor then spends about 2.5 s naming
# it (process_group.cc), and its process has to end and be seen gone.
MARGIN_S = 12
# Enough steps that the job is still training when the first three are seen:
# events reach the coordinator in batches, and a 12-step job had finished
# before its kill once (CI load).
STEPS = 40


def two_rank_job(inputs):
    return gang_spec(inputs, 2, max_steps=STEPS, checkpoint_every=2,
                     schedule={"kind": "constant", "warmup_steps": 0},
                     guard={"good_after_steps": 0})


def start_mid_step(make_cluster, inputs):
    """A two-rank job on two workers, past its first checkpoint and training.
    The stop grace is long: ranks must end by themselves, not because their
    worker's SIGKILL came first."""
    cluster = make_cluster(stop_grace_ms=60000)
    cluster.start_coordinator()
    workers = [cluster.start_worker(f"w{r}", extra_args=(
        "--collective-timeout", str(COLLECTIVE_TIMEOUT_S))) for r in (0, 1)]
    job_id = cluster.submit(two_rank_job(inputs))
    job = wait_for(lambda: (lambda j: j if int(j.get("step", 0)) >= 3 else None)(
        cluster.job(job_id)), 300, "three steps")
    out = job["output_dir"]
    ranks = {rank_of(p): p for p in train_ranks(out)}
    assert sorted(ranks) == [0, 1]
    return cluster, workers, job_id, out, ranks


def wait_until_gone(processes, out, timeout, what):
    try:
        wait_for(lambda: not any(alive(p) for p in processes), timeout, what, interval=0.02)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{where_they_are(processes, out)}") from None


def finishes_after_one_restart(cluster, job_id, out):
    job = cluster.wait_state(job_id, TERMINAL, 600)
    assert job["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(job["restarts"]) == 1
    assert steps_in(os.path.join(out, "metrics.jsonl")) == list(range(1, STEPS + 1)), \
        "the second attempt resumed from the checkpoint and redid no committed step"
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    assert read(os.path.join(out, "attempt")).strip() == "2"


def first_new_rank(watch, old, since):
    """Seconds from `since` (time.time()) until a rank other than `old` was
    first seen: the first of the next attempt."""
    return wait_for(lambda: min((t for pid, t in watch.seen.items() if pid not in old),
                                default=None), 300, "a rank of the next attempt") - since


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_mid_step_ends_its_peer_within_the_timeout_and_the_job_restarts(
        inputs, make_cluster, victim):
    cluster, _, job_id, out, ranks = start_mid_step(make_cluster, inputs)
    survivor = ranks[1 - victim]
    watch = RankWatch(out)
    try:
        killed_at, killed_wall = time.monotonic(), time.time()
        ranks[victim].send_signal(signal.SIGKILL)
        wait_until_gone([survivor], out, COLLECTIVE_TIMEOUT_S + MARGIN_S, "the survivor to exit")
        peer_exit_s = time.monotonic() - killed_at
        assert f"lost rank {victim}" in read(os.path.join(out, f"rank-{1 - victim}.log"))
        restart_s = first_new_rank(watch, {p.pid for p in ranks.values()}, killed_wall)
    finally:
        watch.stop()
    finishes_after_one_restart(cluster, job_id, out)
    print(f"\nkill -9 of rank {victim}: peer left after {peer_exit_s:.1f} s, attempt 2 "
          f"started after {restart_s:.1f} s (--collective-timeout {COLLECTIVE_TIMEOUT_S})")


def output_files(out):
    """Every file under the job's folder but the rank logs, which the agent
    appends a rank's last words to: {path: (mtime_ns, size)}."""
    files = {}
    for root, _, names in os.walk(out):
        for name in names:
            path = os.path.join(root, name)
            if name.startswith("rank-") and name.endswith(".log"):
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            files[os.path.relpath(path, out)] = (st.st_mtime_ns, st.st_size)
    return files


@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_stopped_for_twice_the_timeout_is_fenced_and_never_writes_after_it_resumes(
        inputs, make_cluster, victim):
    cluster, workers, job_id, out, ranks = start_mid_step(make_cluster, inputs)
    stopped, survivor = ranks[victim], ranks[1 - victim]
    watch = RankWatch(out)
    try:
        stopped_at, stopped_wall = time.monotonic(), time.time()
        stopped.send_signal(signal.SIGSTOP)
        try:
            wait_until_gone([survivor], out, COLLECTIVE_TIMEOUT_S + MARGIN_S,
                            "the survivor to exit")
            peer_exit_s = time.monotonic() - stopped_at
            assert f"lost rank {victim}" in read(os.path.join(out, f"rank-{1 - victim}.log"))
            # Stopped for twice the timeout, as a long GC pause, a frozen VM
            # or a debugger would: by now its peer has given up on it.
            time.sleep(max(0.0, stopped_at + 2 * COLLECTIVE_TIMEOUT_S - time.monotonic()))
            assert alive(stopped), "the stopped rank must still be there to be resumed"
            before = output_files(out)
        finally:
            stopped.send_signal(signal.SIGCONT)
        resumed_at, resumed_wall = time.monotonic(), time.time()
        wait_until_gone([stopped], out, 10, "the resumed rank to exit")
        fenced_s = time.monotonic() - resumed_at
        # Taken before attempt 2 writes: the coordinator starts it only once
        # every rank of attempt 1 has exited and been reported, and a new
        # rank loads its model first. Its rank may already be seen here (it
        # can start within this poll's 20 ms), but never while the stopped
        # rank was frozen.
        after = output_files(out)
        assert all(t > resumed_wall for pid, t in watch.seen.items()
                   if pid not in (stopped.pid, survivor.pid)), "attempt 2 started too soon"
        assert after == before, "the resumed rank wrote after its peer gave up on it"
        log = read(os.path.join(out, f"rank-{victim}.log"))
        assert "stopping without writing more" in log, log[-3000:]
        wait_for(lambda: any(f"rank {victim} of {job_id} attempt 1 exited with code 3"
                             in w.output() for w in workers), 30,
                 "its worker to report the fenced exit")
        restart_s = first_new_rank(watch, {stopped.pid, survivor.pid}, stopped_wall)
    finally:
        watch.stop()
    finishes_after_one_restart(cluster, job_id, out)
    print(f"\nSIGSTOP of rank {victim}: peer left after {peer_exit_s:.1f} s, the resumed rank "
          f"was fenced {fenced_s:.1f} s after SIGCONT, attempt 2 started after {restart_s:.1f} s "
          f"(--collective-timeout {COLLECTIVE_TIMEOUT_S})")
