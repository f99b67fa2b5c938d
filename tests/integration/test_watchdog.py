"""The progress watchdog (docs/reliability.md, "Watchdog"), on CPU, in a
two-rank ZeRO-3 job under ballastd, with the faults of
worker/train/trainer/delay_injection.h:

- a rank that sleeps inside a step (BALLAST_INJECT_HANG) while every process
  stays alive: the watchdog declares the job stalled within its bound, the
  stall names both ranks' phases, and the job restarts from its checkpoint
  (restarts 1) and trains every step once. The sleep is far longer than the
  test, so neither the collective timeout (the sleeping rank's heartbeat
  thread beats on) nor the lease (its worker is well) can be what ends it;
- a rank slowed in every step (BALLAST_INJECT_SLOW): it becomes a straggler
  within its window, seen in the job and in ballast_rank_straggler;
- both on one rank, on a worker with a device to spare: the restart after
  the stall places the straggler's rank elsewhere than its slow device, says
  so in the SCHEDULED event, and the job still trains every step once;
- the slow device is stored with the job: a ballastd restarted (kill -9)
  before the next attempt still avoids it.

Each prints its measured times (docs/reliability.md quotes them)."""
import json
import os
import re
import time
import urllib.request

from cluster import train_ranks, wait_for
from test_control_plane import TERMINAL, inputs  # noqa: F401
from test_gang import gang_spec, rank_of
from test_rank_stop import steps_in

STEPS = 10
HANG_STEP = 6
# The stall's bound: the floor, above 3 x the tiny model's median step.
FLOOR_S = 4
# On top of the bound, for the loaded 2-core CI machine: the coordinator
# looks once per lease_ms / 4 (0.75 s), a rank's phase goes up once it has
# held 0.5 s, and a report waits for the store.
MARGIN_S = 10
WINDOW = 3


# The slowed rank's sleep in the third test: 50 times the tiny model's own
# step (10 ms), and short, as every step of both attempts has it.
SLOW_S = 0.5


def job_spec(inputs, **watchdog):
    return gang_spec(inputs, 2, max_steps=STEPS, checkpoint_every=2,
                     schedule={"kind": "constant", "warmup_steps": 0},
                     guard={"good_after_steps": 0}, watchdog=watchdog)


def test_a_rank_hung_inside_a_step_is_stalled_named_and_restarted_from_its_checkpoint(
        inputs, make_cluster):
    cluster = make_cluster()
    cluster.start_coordinator()
    # Both ranks on one worker, whose environment they inherit; rank 1 sleeps
    # for ten minutes in step 6 of the first attempt.
    cluster.start_worker("w", cpu_slots=2,
                         env={**os.environ, "BALLAST_INJECT_HANG": f"1:{HANG_STEP}:600"})
    job_id = cluster.submit(job_spec(inputs, stall_factor=3, stall_floor_s=FLOOR_S))
    wait_for(lambda: int(cluster.job(job_id).get("step", 0)) >= HANG_STEP - 1, 300,
             f"step {HANG_STEP - 1}")
    hung_from = time.monotonic()  # step 5 is in: step 6 hangs from about now
    job = wait_for(lambda: (lambda j: j if int(j.get("stalls", 0)) >= 1 else None)(
        cluster.job(job_id)), 120, "the stall")
    detected_s = time.monotonic() - hung_from
    stall = job["last_stall"]
    assert int(stall["step"]) == HANG_STEP, stall
    # The bound is the floor unless the loaded machine made 3 x the median
    # step longer; detected within a poll and the margin past it.
    assert stall["bound_s"] >= FLOOR_S, stall
    assert stall["bound_s"] < stall["waited_s"] <= stall["bound_s"] + MARGIN_S, stall
    phases = {r.get("rank", 0): r for r in stall["ranks"]}
    assert sorted(phases) == [0, 1], stall
    # Rank 1 sleeps in its data phase; rank 0 waits for it in the step's
    # first collective, the all-reduce of the token counts.
    assert phases[1]["phase"] == "data" and int(phases[1]["step"]) == HANG_STEP, stall
    assert phases[0]["phase"] == "collective", stall
    assert phases[0]["collective"] == "all_reduce" and int(phases[0]["collective_seq"]) > 0

    done = cluster.wait_state(job_id, TERMINAL, 600)
    assert done["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(done["restarts"]) == 1 and int(done["stalls"]) == 1
    out = done["output_dir"]
    assert steps_in(os.path.join(out, "metrics.jsonl")) == list(range(1, STEPS + 1)), \
        "the restart resumed from the checkpoint and trained every step once"
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    print(f"\nhang of rank 1 in step {HANG_STEP}: stalled after {stall['waited_s']:.1f} s "
          f"without a step (bound {stall['bound_s']:.0f} s), seen {detected_s:.1f} s after "
          f"step {HANG_STEP - 1} was reported")


def straggler_series(cluster, job_id):
    with urllib.request.urlopen(f"http://{cluster.http}/metrics", timeout=10) as page:
        text = page.read().decode()
    return {int(rank): float(value) for rank, value in re.findall(
        rf'ballast_rank_straggler{{job_id="{job_id}",rank="(\d+)"}} (\S+)', text)}


def job_events(cluster, job_id):
    with urllib.request.urlopen(
            f"http://{cluster.http}/api/v1/jobs/{job_id}/events?after=0&limit=1000",
            timeout=10) as page:
        return json.loads(page.read())["events"]


def test_a_rank_slowed_in_every_step_becomes_a_straggler_within_its_window(
        inputs, make_cluster):
    cluster = make_cluster()
    cluster.start_coordinator()
    cluster.start_worker("w", cpu_slots=2, env={**os.environ, "BALLAST_INJECT_SLOW": "1:1.0"})
    job_id = cluster.submit(job_spec(inputs, straggler_factor=2, straggler_window=WINDOW))
    job = wait_for(lambda: (lambda j: j if j.get("straggler_ranks") else None)(
        cluster.job(job_id)), 300, "a straggler")
    assert job["straggler_ranks"] == [1], job
    assert straggler_series(cluster, job_id) == {0: 0.0, 1: 1.0}
    done = cluster.wait_state(job_id, TERMINAL, 600)
    assert done["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(done.get("stalls", 0)) == 0 and int(done.get("restarts", 0)) == 0
    reports = [e["training"]["straggler"] for e in job_events(cluster, job_id)
               if "straggler" in e.get("training", {})]
    assert len(reports) == 1, reports
    report = reports[0]
    assert report.get("rank") == 1 and report["straggling"], report
    # Flagged at the end of its first window of slow steps (every step is
    # slow; the first, with its warm-up, may not count).
    assert WINDOW <= int(report["step"]) <= WINDOW + 1, report
    assert report["step_time_s"] > 2 * report["others_step_time_s"], report
    print(f"\nrank 1 slowed by 1.0 s a step: a straggler at step {report['step']} (window "
          f"{WINDOW}), its own step {report['step_time_s']:.2f} s against the other's "
          f"{report['others_step_time_s']:.2f} s")


def devices(job):
    """(worker, device) of each rank of the job's placement, by rank."""
    return {p.get("rank", 0): (p["worker_id"], p.get("device", 0)) for p in job["placement"]}


def test_the_restart_after_a_stall_avoids_the_device_of_a_straggler(inputs, make_cluster):
    cluster = make_cluster()
    cluster.start_coordinator()
    # Three device slots for two ranks: one to spare. Rank 1 is slow in every
    # step of every attempt, and sleeps for ten minutes in step 6 of the first.
    cluster.start_worker("w", cpu_slots=3, env={
        **os.environ, "BALLAST_INJECT_SLOW": f"1:{SLOW_S}",
        "BALLAST_INJECT_HANG": f"1:{HANG_STEP}:600"})
    started = time.monotonic()
    job_id = cluster.submit(job_spec(inputs, stall_factor=3, stall_floor_s=FLOOR_S,
                                     straggler_factor=2, straggler_window=WINDOW))
    first = wait_for(lambda: (lambda j: j if j.get("straggler_ranks") else None)(
        cluster.job(job_id)), 300, "a straggler")
    assert first["straggler_ranks"] == [1] and int(first.get("restarts", 0)) == 0, first
    worker, slow_device = devices(first)[1]
    assert devices(first) == {0: (worker, 0), 1: (worker, 1)}, first
    # The stall restarts it: attempt 2 takes the spare device instead.
    second = wait_for(lambda: (lambda j: j if int(j.get("restarts", 0)) == 1 and j.get(
        "placement") else None)(cluster.job(job_id)), 120, "the restart's placement")
    assert int(second["stalls"]) == 1, second
    assert devices(second) == {0: (worker, 0), 1: (worker, 2)}, second

    done = cluster.wait_state(job_id, TERMINAL, 600)
    assert done["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(done["restarts"]) == 1 and int(done["stalls"]) == 1
    assert steps_in(os.path.join(done["output_dir"], "metrics.jsonl")) == \
        list(range(1, STEPS + 1)), "the restart trained every step once"
    events = job_events(cluster, job_id)
    scheduled = [e["state_change"]["reason"] for e in events
                 if e.get("state_change", {}).get("to") == "JOB_STATE_SCHEDULED"]
    assert len(scheduled) == 2, scheduled
    assert scheduled[1] == (
        f"attempt 2 on 2 device(s), rank 0 on {worker}; avoids worker {worker} device "
        f"{slow_device}: rank 1 was a straggler there in attempt 1"), scheduled
    flagged = [int(e["training"]["straggler"]["step"]) for e in events
               if e.get("attempt") == 1 and "straggler" in e.get("training", {})]
    print(f"\nrank 1 slowed by {SLOW_S} s a step: a straggler on device {slow_device} at "
          f"step {flagged} of attempt 1, stalled in step {done['last_stall']['step']} after "
          f"{done['last_stall']['waited_s']:.1f} s; attempt 2 ran it on device 2 and "
          f"\"{scheduled[1]}\"; the job took {time.monotonic() - started:.1f} s")


def test_a_restarted_coordinator_still_avoids_the_device_of_a_straggler(inputs, make_cluster):
    """The straggler's device is stored with the job (Job.straggler_devices):
    after a kill -9 and restart of ballastd, the attempt that follows a
    rank's death still takes the spare device instead."""
    cluster = make_cluster()
    cluster.start_coordinator()
    cluster.start_worker("w", cpu_slots=3, env={**os.environ,
                                                "BALLAST_INJECT_SLOW": f"1:{SLOW_S}"})
    job_id = cluster.submit(gang_spec(inputs, 2, max_steps=60, checkpoint_every=2,
                                      schedule={"kind": "constant", "warmup_steps": 0},
                                      guard={"good_after_steps": 0},
                                      watchdog={"straggler_factor": 2,
                                                "straggler_window": WINDOW}))
    first = wait_for(lambda: (lambda j: j if j.get("straggler_ranks") else None)(
        cluster.job(job_id)), 300, "a straggler")
    worker, slow_device = devices(first)[1]
    assert first["straggler_devices"] == [
        {"worker_id": worker, "device": slow_device, "rank": 1, "attempt": 1}], first

    cluster.restart_coordinator_after_kill9()
    assert cluster.job(job_id)["straggler_devices"] == first["straggler_devices"]
    # Rank 1 dies: the next attempt is placed by the restarted coordinator.
    ranks = [p for p in train_ranks(first["output_dir"]) if rank_of(p) == 1]
    assert len(ranks) == 1, train_ranks(first["output_dir"])
    ranks[0].kill()
    second = wait_for(lambda: (lambda j: j if int(j.get("restarts", 0)) == 1 and j.get(
        "placement") else None)(cluster.job(job_id)), 180, "the next attempt's placement")
    assert devices(second)[1] != (worker, slow_device), second
    scheduled = [e["state_change"]["reason"] for e in job_events(cluster, job_id)
                 if e.get("state_change", {}).get("to") == "JOB_STATE_SCHEDULED"]
    assert scheduled[-1].endswith(
        f"; avoids worker {worker} device {slow_device}: rank 1 was a straggler there in "
        "attempt 1"), scheduled
    cluster.cli("cancel", job_id)
