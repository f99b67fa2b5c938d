"""The control plane end to end, with real processes on loopback: ballastd
(SQLite store), ballast-worker with CPU slots, ballast-train ranks, and the
`ballast` CLI. Each test builds its own cluster in a temporary folder."""
import json
import os
import socket
import threading
import time

import pytest

from cluster import Cluster, base_spec, make_dataset, make_model, train_ranks, wait_for

TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    make_model("qwen3", str(root / "model"), seed=1)
    make_dataset(str(root / "data.jsonl"), n=64, vocab=320, seed=2)
    return str(root / "model"), str(root / "data.jsonl")


def spec(inputs, **overrides):
    return base_spec(*inputs, **{"data": {"seq_len": 64, "micro_batch_size": 2,
                                          "grad_accum_steps": 1, "shuffle": True},
                                 **overrides})


def long_spec(inputs, steps=100000, every=2):
    """A job that runs until stopped, with frequent checkpoints, each good to
    resume from as soon as it is written (guard.good_after_steps 0): these
    tests kill and restart ranks, not the guard's health gate."""
    return spec(inputs, max_steps=steps, checkpoint_every=every,
                schedule={"kind": "constant", "warmup_steps": 0},
                guard={"good_after_steps": 0})


def test_submit_runs_to_success_and_watch_shows_every_step(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2)
    job_id = cluster.submit(spec(inputs, max_steps=6, checkpoint_every=3))

    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step 6/6" in r.stdout
    assert "SUCCEEDED" in r.stdout

    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    out = job["output_dir"]
    assert os.path.exists(os.path.join(out, "adapter", "adapter_model.safetensors"))
    with open(os.path.join(out, "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5, 6]
    assert int(job.get("checkpoint_step", 0)) == 6 or int(job.get("checkpoint_step", 0)) == 3

    listed = json.loads(cluster.cli("list", "-o", "json").stdout)
    jobs = listed["jobs"] if isinstance(listed, dict) else listed
    assert job_id in [j["id"] for j in jobs]


def test_cancel_mid_run_stops_ranks_within_10s(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1")
    job_id = cluster.submit(long_spec(inputs))
    job = wait_for(lambda: (lambda j: j if int(j.get("step", 0)) >= 2 else None)(
        cluster.job(job_id)), 120, "two steps")
    assert train_ranks(job["output_dir"]), "the rank should be running"

    t0 = time.monotonic()
    r = cluster.cli("cancel", job_id)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: not train_ranks(job["output_dir"]), 10, "the ranks to exit")
    assert time.monotonic() - t0 < 10
    assert cluster.wait_state(job_id, TERMINAL, 15)["state"] == "JOB_STATE_CANCELLED"
    assert cluster.cli("watch", job_id).returncode == 1
    # The rank was asked over its socket and finished its step (stop-grace is
    # 3 s, far more than a step): exit 143, not a kill.
    out = job["output_dir"]
    with open(os.path.join(out, "rank-0.log"), errors="replace") as f:
        assert "cancelled after step" in f.read()
    assert "exited with code 143" in cluster.workers[0].output()
    # What a cancelled job keeps (docs/control-plane.md): each finished step's
    # line, in order, and its checkpoints; no export, no attempt folder.
    with open(os.path.join(out, "metrics.jsonl")) as f:
        steps = [json.loads(line)["step"] for line in f]
    assert len(steps) >= 2 and steps == list(range(1, len(steps) + 1))
    assert os.listdir(os.path.join(out, "checkpoints"))
    assert not os.path.exists(os.path.join(out, "adapter"))
    assert not os.listdir(os.path.join(out, "attempts"))


def test_coordinator_kill9_and_restart_keeps_the_job(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1")
    job_id = cluster.submit(long_spec(inputs, steps=60, every=5))
    wait_for(lambda: int(cluster.job(job_id).get("step", 0)) >= 3, 120, "three steps")

    cluster.restart_coordinator_after_kill9()
    job = cluster.job(job_id)  # the store kept it
    assert job["state"] not in TERMINAL

    r = cluster.cli("watch", job_id, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    job = cluster.job(job_id)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    # The worker re-registered and its rank was re-adopted, not restarted.
    assert int(job.get("restarts", 0)) == 0
    with open(os.path.join(job["output_dir"], "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, 61))


def test_worker_kill9_requeues_to_second_worker_from_checkpoint(cluster, inputs):
    cluster.start_coordinator()
    first = cluster.start_worker("w1")
    # Long enough that starting w2 and the kill come well before the end: the
    # tiny model runs tens of steps a second (40 steps once finished first).
    job_id = cluster.submit(long_spec(inputs, steps=1000, every=4))
    wait_for(lambda: int(cluster.job(job_id).get("checkpoint_step", 0)) >= 4, 120,
             "the first checkpoint")
    cluster.start_worker("w2")
    first.kill9(with_children=True)  # the whole node dies: agent and rank

    job = cluster.wait_state(job_id, TERMINAL, 300)
    assert job["state"] == "JOB_STATE_SUCCEEDED", cluster.logs()
    assert int(job["restarts"]) == 1
    # The second attempt resumed from a checkpoint rather than from step 0.
    with open(os.path.join(job["output_dir"], "rank-0.log"), errors="replace") as f:
        log = f.read()
    assert "resum" in log.lower(), log[-2000:]
    with open(os.path.join(job["output_dir"], "metrics.jsonl")) as f:
        assert [json.loads(line)["step"] for line in f] == list(range(1, 1001))


def test_bad_specs_get_usage_errors_and_the_coordinator_survives(cluster, inputs, tmp_path):
    cluster.start_coordinator()
    good = tmp_path / "good.yaml"
    from cluster import write_spec
    write_spec(str(good), **spec(inputs))
    cases = [
        (["--set", "lora.rank=4"], "unknown key 'lora.rank'"),
        (["--set", "optimizer.lr=-0.1"], "optimizer.lr = -0.1 is out of range"),
        (["--set", "lora.r=0"], "lora.r = 0 is out of range"),
        (["--set", "data.seq_len=100000"], "data.seq_len"),
        (["--set", f"model.path={tmp_path}/nowhere"], "nowhere"),
    ]
    for extra, message in cases:
        r = cluster.cli("submit", str(good), *extra)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert message in r.stderr, (extra, r.stderr)
    r = cluster.cli("get", "job-000000000000")
    assert r.returncode == 1 and "not found" in r.stderr.lower()
    assert cluster.coordinator.alive()


def test_unreachable_coordinator_exits_3(tmp_path):
    c = Cluster(str(tmp_path / "nothing"))
    c.grpc = "127.0.0.1:1"
    r = c.cli("list", timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr


def test_health_command_probes_the_coordinator(cluster):
    """`ballast health`, the images' HEALTHCHECK: SERVING and exit 0 from a
    live coordinator, exit 3 naming the address from a dead one."""
    cluster.start_coordinator()
    r = cluster.cli("health")
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr
    r = cluster.cli("health", "-o", "json")
    assert json.loads(r.stdout) == {"status": "SERVING"}
    address = cluster.grpc
    cluster.coordinator.stop()
    r = cluster.cli("--timeout", "1", "health")
    assert r.returncode == 3 and f"cannot reach the coordinator at {address}" in r.stderr, r.stderr


def test_a_slow_link_to_the_coordinator_still_connects(cluster, tmp_path):
    """A coordinator that takes 0.5 s to answer a new connection (a loaded
    machine, a far network) is slow, not gone: the CLI and the worker wait
    for the handshake instead of failing with "tcp handshaker shutdown"."""
    cluster.start_coordinator()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    host, port = cluster.grpc.rsplit(":", 1)

    def pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def relay(client):
        time.sleep(0.5)
        upstream = socket.create_connection((host, int(port)))
        threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
        pump(upstream, client)

    def serve():
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=relay, args=(client,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        direct = cluster.grpc
        cluster.grpc = f"127.0.0.1:{listener.getsockname()[1]}"
        r = cluster.cli("list")
        assert r.returncode == 0, r.stderr
        cluster.start_worker("w1", cpu_slots=1)  # waits for its registration
        cluster.grpc = direct
    finally:
        listener.close()
