"""ballastd's dashboard and JSON API (issue 19): a real headless Chromium
loads the dashboard while a job runs and draws its curves with the rollback
marked (the screenshot is kept as a test artefact); the API answers 4xx with
a message for an unknown job, a bad parameter or path, and 401 without the
token when ballastd has one; the event stream is server-sent events."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from cluster import BALLASTD, Process, base_spec, wait_for
from test_control_plane import inputs  # noqa: F401

CHROMIUM = shutil.which("chromium")
ARTIFACTS = os.environ.get("BALLAST_ARTIFACT_DIR", os.path.join(os.getcwd(), "test-artifacts"))


def get(url, token=None, timeout=10):
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


@pytest.fixture
def running_job(cluster, inputs):
    """A 2-rank job that keeps running, with a rollback early on."""
    cluster.start_coordinator()
    cluster.start_worker("w1", cpu_slots=2)
    spec = base_spec(*inputs, max_steps=100000)
    spec.update(devices=2, checkpoint_every=0,
                guard={"snapshot_every": 2, "good_after_steps": 2,
                       "inject": {"nan_grad_at_step": [20, 21, 22]}})
    spec["data"]["grad_accum_steps"] = 2
    job_id = cluster.submit(spec)
    wait_for(lambda: int(cluster.job(job_id).get("guard_rollbacks", 0)) >= 1
             and int(cluster.job(job_id).get("step", 0)) >= 40, 180, "the rollback and step 40")
    yield cluster, job_id
    cluster.cli("cancel", job_id)


def chromium(*args, timeout=120):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--no-first-run",
                           "--window-size=1400,1600", *args],
                          capture_output=True, text=True, timeout=timeout)


def loss_points(dom):
    loss = re.search(r'<svg class="chart" id="chart-loss"[^>]*data-points="(\d+)"', dom)
    return int(loss.group(1)) if loss else 0


def dump_when_drawn(url, drawn):
    """The DOM once drawn(dom) holds, trying longer virtual-time budgets.

    Virtual time runs ahead of the wall clock while the page waits on the
    network, so on a busy machine one budget can end before the event stream's
    first chunk has arrived (it failed so in CI once: the facts and the log
    were there, the charts not yet). Each try loads the page afresh."""
    for budget in (6000, 12000, 24000):
        r = chromium(f"--virtual-time-budget={budget}", "--dump-dom", url)
        assert r.returncode == 0, r.stderr[-2000:]
        if drawn(r.stdout):
            break
    return r.stdout


@pytest.mark.skipif(not CHROMIUM, reason="chromium not installed (make setup)")
def test_chromium_draws_the_running_job_with_its_rollback(running_job):
    cluster, job_id = running_job
    url = f"http://{cluster.http}/#/jobs/{job_id}"
    dom = dump_when_drawn(url, lambda dom: loss_points(dom) >= 40)
    assert 'id="state">RUNNING<' in dom, dom[:3000]
    # The page's whole text past the header: the log shows how far the stream got.
    assert loss_points(dom) >= 40, dom[dom.find('<main'):][:12000]
    chart = dom[dom.index('id="chart-loss"'):dom.index('id="chart-grad-norm"')]
    assert re.search(r'<polyline points="[\d.]+,[\d.]+ [\d.]+,[\d.]+', chart)
    assert chart.count('class="rollback"') == 1
    assert chart.count('class="skipped"') == 3  # steps 20, 21 and 22, which rolled back
    # Both ranks' step times, and the guard's rollback in the event log.
    assert 'data-rank="0"' in dom and 'data-rank="1"' in dom
    assert "rolled back to step" in dom

    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "dashboard-job.png")
    r = chromium("--virtual-time-budget=6000", f"--screenshot={shot}", url)
    assert r.returncode == 0 and os.path.getsize(shot) > 10000, r.stderr[-2000:]

    r = chromium("--virtual-time-budget=3000", "--dump-dom", f"http://{cluster.http}/")
    assert f'data-job="{job_id}"' in r.stdout and ">RUNNING<" in r.stdout, r.stdout[:3000]


def test_the_api_answers_json_and_4xx_with_messages(running_job):
    cluster, job_id = running_job
    base = f"http://{cluster.http}/api/v1"
    status, kind, body = get(f"{base}/jobs")
    assert status == 200 and kind.startswith("application/json")
    assert job_id in [j["id"] for j in json.loads(body)["jobs"]]
    status, _, body = get(f"{base}/jobs?state=running&limit=5")
    assert status == 200 and [j["id"] for j in json.loads(body)["jobs"]] == [job_id]
    status, _, body = get(f"{base}/jobs/{job_id}")
    assert status == 200 and json.loads(body)["spec"]["devices"] == 2
    status, _, body = get(f"{base}/jobs/{job_id}/ranks")
    ranks = json.loads(body)["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["steps"] > 0 for r in ranks)
    status, _, body = get(f"{base}/jobs/{job_id}/events?after=0&limit=2")
    events = json.loads(body)["events"]
    assert [e["seq"] for e in events] == ["1", "2"]

    for path, code, message in [
        ("/jobs/job-000000000000", 404, "job job-000000000000 not found"),
        ("/jobs/job-000000000000/events", 404, "not found"),
        ("/jobs?limit=abc", 400, "limit=abc is not an integer in 0..1000"),
        ("/jobs?state=sleeping", 400, "state=sleeping is not a job state"),
        (f"/jobs/{job_id}/events?after=-3", 400, "after=-3 is not an integer"),
        ("/nothing", 404, "no such API path: /api/v1/nothing"),
    ]:
        status, kind, body = get(base + path)
        assert status == code and kind.startswith("application/json"), (path, status, body)
        assert message in json.loads(body)["error"], (path, body)

    # The stream: server-sent events, each with its seq as the id.
    with urllib.request.urlopen(f"{base}/jobs/{job_id}/stream?after=0", timeout=10) as r:
        assert r.headers.get("Content-Type").startswith("text/event-stream")
        first = r.readline().decode() + r.readline().decode()
    assert first.startswith("id: 1\ndata: {"), first


def test_with_a_token_the_api_wants_it_and_the_page_asks(tmp_path):
    ready = tmp_path / "ready.json"
    server = Process([BALLASTD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                      "--state-dir", str(tmp_path / "state"), "--ready-file", str(ready)],
                     str(tmp_path / "ballastd.log"), env={**os.environ, "BALLAST_TOKEN": "s3cret"})
    try:
        http = wait_for(lambda: ready.exists() and ready.stat().st_size and
                        json.loads(ready.read_text())["http"], 30, "ballastd")
        status, _, body = get(f"http://{http}/api/v1/jobs")
        assert status == 401 and "no token" in json.loads(body)["error"]
        assert get(f"http://{http}/api/v1/jobs", token="wrong")[0] == 401
        assert get(f"http://{http}/api/v1/jobs", token="s3cret")[0] == 200
        # The page itself is static and loads; it asks for the token.
        assert get(f"http://{http}/")[0] == 200
        if CHROMIUM:
            r = chromium("--virtual-time-budget=3000", "--dump-dom", f"http://{http}/")
            assert 'id="token"' in r.stdout and "no token" in r.stdout, r.stdout
    finally:
        server.stop()
