"""The set of series on /metrics, held still: after the same scripted activity
(a job that succeeds while evaluating a held-out set, one whose rank fails, one the guard rolls back, a worker
that joins and leaves), the series that ballastd and a `ballast-worker --http`
serve must be exactly those listed in metrics_series.txt. A change of the
metrics library or encoder (issue 38) must not add, drop or rename a series,
a label or a histogram bucket; dashboards and alerts select on all three.

Only what is stable is compared: each series' process, type, name and label
set (labels sorted by name, so their printed order does not matter). Values
are not compared, but for ballast_job_eval_loss's against GetJob. Job ids become the job's role, and ballast_build_info's
version and commit placeholders. `le` stays as printed: Prometheus 2 stores
it as text, so le="1" and le="1.0" would be two different series."""
import os
import re

import pytest

from cluster import wait_for
from test_control_plane import inputs, spec  # noqa: F401
from test_prometheus import free_port, get

SERIES_FILE = os.path.join(os.path.dirname(__file__), "metrics_series.txt")
REGENERATE = "BALLAST_REGENERATE_METRICS_SERIES"
HEADER = f"""\
# The series on /metrics of ballastd and ballast-worker after the activity of
# test_metrics_series.py, one a line: process, type, name{{labels sorted by name}}.
# Job ids are replaced by the job's role, ballast_build_info's version and
# commit by placeholders; every other label value is as served.
#
# Regenerate only for a deliberate change of the metrics (a series, label or
# bucket added, renamed or removed), and review the diff; a library or
# encoder change must leave this file as it is:
#   {REGENERATE}=1 BALLAST_BIN_DIR=build/bin \\
#     python3 -m pytest tests/integration/test_metrics_series.py
"""
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')
PLACEHOLDERS = {("ballast_build_info", "version"): "<version>",
                ("ballast_build_info", "commit"): "<commit>"}


def series(process, text, roles):
    """The normalised series lines of one exposition. A histogram's _bucket,
    _sum and _count samples carry the family's type."""
    types, lines = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels = m.group(1), dict(LABEL.findall(m.group(2) or ""))
        family = next((name[:-len(suffix)] for suffix in ("_bucket", "_sum", "_count")
                       if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram"),
                      name)
        assert family in types, f"{name} has no # TYPE line"
        for key in labels:
            if key == "job_id":
                labels[key] = roles.get(labels[key], labels[key])
            elif (family, key) in PLACEHOLDERS:
                labels[key] = PLACEHOLDERS[family, key]
        printed = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        lines.add(f"{process} {types[family]} {name}{{{printed}}}")
    return lines


def run_activity(cluster, inputs, tmp_path):
    """The scripted activity; returns {job id: role} and the worker's HTTP address."""
    cluster.start_coordinator()
    worker_http = f"127.0.0.1:{free_port()}"
    cluster.start_worker("w1", cpu_slots=2, env=ONE_THREAD, extra_args=["--http", worker_http])
    roles = {}

    # It evaluates a held-out quarter of its data: ballast_job_eval_loss.
    succeeded = cluster.submit(spec(inputs, max_steps=4, eval={"fraction": 0.25, "every": 2}))
    roles[succeeded] = "<succeeded>"
    assert cluster.cli("watch", succeeded, timeout=300).returncode == 0

    # Its rank reads a token outside the vocabulary (exit 2, not restartable).
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [1, 99999]}\n')
    failing = spec(inputs, max_steps=4)
    failing["data"]["path"] = str(bad)
    failed = cluster.submit(failing, "failing.yaml")
    roles[failed] = "<failed>"
    cluster.wait_state(failed, {"JOB_STATE_FAILED"}, 300)

    # NaNs on rank 1 of 2 at steps 5-7: two skips, then a rollback to step 2.
    rolling = spec(inputs, devices=2, max_steps=10, checkpoint_every=0,
                   schedule={"kind": "constant", "warmup_steps": 0},
                   guard={"snapshot_every": 2, "good_after_steps": 2,
                          "inject": {"nan_grad_at_step": [5, 6, 7], "on_rank": 1}})
    rolling["data"]["grad_accum_steps"] = 2
    rolled_back = cluster.submit(rolling, "rolling.yaml")
    roles[rolled_back] = "<rolled_back>"
    assert cluster.cli("watch", rolled_back, timeout=300).returncode == 0
    assert int(cluster.job(rolled_back)["guard_rollbacks"]) == 1

    # A second worker joins, then leaves; its lease runs out.
    w2 = cluster.start_worker("w2", cpu_slots=1)
    w2.stop()
    wait_for(lambda: len([w for w in cluster.list_workers() if not w.get("alive")]) == 1, 60,
             "worker w2 to be marked dead")
    return roles, worker_http


def test_metrics_series_are_those_listed(cluster, inputs, tmp_path):  # noqa: F811
    roles, worker_http = run_activity(cluster, inputs, tmp_path)
    _, coordinator_text = get(f"http://{cluster.http}/metrics")
    _, worker_text = get(f"http://{worker_http}/metrics")
    got = series("ballastd", coordinator_text, roles) | series("worker", worker_text, roles)

    if os.environ.get(REGENERATE) == "1":
        with open(SERIES_FILE, "w") as f:
            f.write(HEADER + "".join(f"{line}\n" for line in sorted(got)))
        pytest.skip(f"wrote {len(got)} series to {SERIES_FILE}; review its diff")
    with open(SERIES_FILE) as f:
        want = {line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")}
    missing, extra = sorted(want - got), sorted(got - want)
    # The gauge holds the last evaluation's loss, as GetJob has it.
    succeeded = next(job for job, role in roles.items() if role == "<succeeded>")
    eval_loss = cluster.job(succeeded)["last_eval"]["loss"]
    served = re.search(rf'^ballast_job_eval_loss{{job_id="{succeeded}"}} (\S+)$', coordinator_text,
                       re.M)
    assert served and float(served.group(1)) == pytest.approx(eval_loss, rel=1e-6), served
    assert not missing and not extra, (
        f"/metrics differs from {os.path.basename(SERIES_FILE)}:\n"
        + "".join(f"- {line}\n" for line in missing) + "".join(f"+ {line}\n" for line in extra))
