"""The guard through the coordinator, with real processes: a NaN injected on
rank 1 of a 2-rank gang is skipped, then rolled back, and the job finishes;
the rollback reaches `ballast watch`, `ballast get` and the Prometheus
counters while the job runs. Also `ballast rollback --to-step 0`, and specs
whose injection cannot happen are refused at submission."""
import json
import os
import re
import urllib.request
from xml.etree import ElementTree

import numpy as np
import pytest
from safetensors.numpy import load_file

from cluster import wait_for, write_spec
from test_control_plane import inputs, long_spec, spec  # noqa: F401
from test_tensorboard import assert_tensorboard_equals_metrics, guard_texts
from untrainable_inputs import SHORT_RUN, untrainable_cases

ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def metric(cluster, name, job_id, extra=""):
    with urllib.request.urlopen(f"http://{cluster.http}/metrics", timeout=10) as page:
        text = page.read().decode()
    m = re.search(rf'^{name}{{job_id="{job_id}"{extra}}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_nan_on_rank_1_is_skipped_rolled_back_and_the_job_finishes(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2, env=ONE_THREAD)
    job = spec(inputs, devices=2, max_steps=40, checkpoint_every=10,
               schedule={"kind": "constant", "warmup_steps": 0},
               guard={"snapshot_every": 2, "good_after_steps": 2,
                      "inject": {"nan_grad_at_step": [5, 6, 7], "on_rank": 1}})
    job["data"]["grad_accum_steps"] = 2
    job["report_to"] = ["tensorboard"]
    job_id = cluster.submit(job)

    # The counters move while the job runs, before it ends.
    seen = wait_for(lambda: (metric(cluster, "ballast_job_rollbacks_total", job_id) or 0) >= 1
                    and cluster.job(job_id), 300, "the rollback in the metrics")
    assert seen["state"] in ("JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED")
    # Steps 5 and 6 skipped, and step 7, which rolled back.
    assert metric(cluster, "ballast_job_skipped_steps_total", job_id) == 3
    assert metric(cluster, "ballast_job_anomalies_total", job_id,
                  ',kind="non_finite"') >= 3
    assert metric(cluster, "ballast_job_anomalies_total", job_id, ',kind="spike"') == 0

    r = cluster.cli("watch", job_id, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # The tensor whose gradient went non-finite (in rank 1's shard of it).
    skip = re.search(r"guard skip at step 5 \[non_finite, deterministic, model\.layers\.\d+\."
                     r"\S+\.weight on rank 1, 4 documents skipped from position 16\]", out)
    assert skip, out
    rollback = re.search(r"guard rollback at step 7 to step (\d+) \[non_finite, deterministic, "
                         r"\S+ on rank 1, (\d+) steps lost, (\d+) documents skipped", out)
    assert rollback, out
    to_step, lost = int(rollback.group(1)), int(rollback.group(2))
    assert to_step == 2 and lost == 5
    assert "SUCCEEDED" in out

    got = cluster.job(job_id)
    assert int(got["guard_rollbacks"]) == 1
    assert int(got["anomalies"]["non_finite"]) == 3
    detail = cluster.cli("get", job_id).stdout
    assert "1 rollbacks, 3 skipped steps; anomalies: non_finite 3" in detail, detail

    # After the rollback every step is applied with a finite grad_norm, and
    # the exported adapter holds no NaN.
    with open(os.path.join(got["output_dir"], "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert [line["step"] for line in lines] == list(range(1, 41))
    assert all(not line["skipped"] and line["grad_norm"] is not None for line in lines)
    adapter = load_file(os.path.join(got["output_dir"], "adapter", "adapter_model.safetensors"))
    assert adapter and all(np.isfinite(t).all() for t in adapter.values())

    # Rank 0's TensorBoard files, committed to the job's folder with each
    # step as metrics.jsonl is, say the same; the skips went with the steps
    # the rollback undid.
    texts = guard_texts(assert_tensorboard_equals_metrics(got["output_dir"]))
    assert [step for step, _ in texts["guard/rollback"]] == [7]
    assert "guard/skip" not in texts

    # `ballast plot`: the curves for a report, the rollback marked on them.
    svg_path = os.path.join(cluster.root, "loss.svg")
    r = cluster.cli("plot", job_id, "-o", svg_path)
    assert r.returncode == 0, r.stderr
    # 40 steps, plus the 5 the rollback lost, which were reported too.
    assert r.stdout == f"wrote {svg_path}: 45 steps, 1 rollbacks\n", r.stdout
    svg = ElementTree.parse(svg_path).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    loss_lines = svg.findall("s:polyline[@class='loss']", ns)
    assert sum(len(line.get("points").split()) for line in loss_lines) == 45 - 3
    (rollback,) = svg.findall("s:g[@class='rollback']", ns)
    assert rollback.find("s:text", ns).text == "rollback to 2"
    assert len(svg.findall("s:circle[@class='skipped']", ns)) == 2 * 3
    r = cluster.cli("plot", job_id, "-o", os.path.join(cluster.root, "loss.png"))
    assert r.returncode == 2 and "plot writes SVG" in r.stderr


def test_rollback_to_step_zero_starts_over_from_the_initial_weights(cluster, inputs):
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=1)
    job_id = cluster.submit(long_spec(inputs))
    wait_for(lambda: int(cluster.job(job_id).get("checkpoint_step", 0)) >= 4, 300,
             "a checkpoint at step 4")
    r = cluster.cli("rollback", job_id, "--to-step", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    # The second attempt starts from the initial weights, where a rollback
    # to a step N > 0 would say "resuming from checkpoint step N".
    wait_for(lambda: cluster.cli("logs", job_id).stdout.count("starting at step 0 of") >= 2, 300,
             "the next attempt to start over")
    assert "resuming from checkpoint" not in cluster.cli("logs", job_id).stdout
    assert cluster.cli("cancel", job_id).returncode == 0


@pytest.mark.parametrize("guard,key", [
    ({"inject": {"nan_grad_at_step": [7]}}, "guard.inject.nan_grad_at_step = 7"),
    ({"inject": {"on_rank": 1}}, "guard.inject.on_rank = 1"),
    ({"loss_spike_zscore": 1}, "guard.loss_spike_zscore = 1"),
])
def test_an_injection_that_cannot_happen_is_refused_at_submission(cluster, inputs, guard, key):
    cluster.start_coordinator()
    path = os.path.join(cluster.root, "bad.yaml")
    write_spec(path, **spec(inputs, max_steps=6, guard=guard))
    r = cluster.cli("submit", path)
    assert r.returncode != 0
    assert key in r.stderr, r.stderr


@pytest.mark.parametrize("case,devices", [
    ("labels_masked", 2), ("nan_base_weight", 2), ("inf_embedding", 1), ("every_record_bad", 1),
    ("bad_and_masked_records", 1)])
def test_a_job_that_can_apply_no_step_fails_without_a_restart(cluster, inputs, case, devices):
    # Two ranks (ZeRO-3 over Gloo) agree: the end-of-run count is the same on
    # both, and each checks its share of the weights for NaN at load.
    model, data, overrides, message = untrainable_cases(os.path.join(cluster.root, "inputs"),
                                                        *inputs)[case]
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2, env=ONE_THREAD)
    job = spec((model, data), devices=devices, **SHORT_RUN)
    job["data"] = {**job["data"], **overrides.get("data", {}), "grad_accum_steps": 2}
    job_id = cluster.submit(job)
    got = cluster.wait_state(job_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 300)
    assert got["state"] == "JOB_STATE_FAILED", got
    assert int(got.get("restarts", 0)) == 0
    reason = got.get("failure_reason", "")
    assert "exited with code 2: ballast-train: " in reason and message in reason, reason
    assert not os.path.exists(os.path.join(got["output_dir"], "adapter"))
