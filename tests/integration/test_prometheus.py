"""ballastd's /metrics read by the real tools: promtool lints the exposition,
and a Prometheus server scrapes it and answers queries about a finished job."""
import contextlib
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request

import pytest

from cluster import Process, base_spec, make_dataset, make_model, wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


@contextlib.contextmanager
def prometheus(tmp_path, targets, rule_files=()):
    """A Prometheus server scraping `targets` ({job name: HOST:PORT}) every
    second (and evaluating `rule_files` as often); yields query(expr): the
    result list, or None while it is empty or the server is not up yet."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    rules = "".join(f"  - {path}\n" for path in rule_files)
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files:\n{rules}" if rules else "")
        + "scrape_configs:\n"
        + "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{address}']\n"
                  for job, address in targets.items()))
    server = Process([PROMETHEUS, f"--config.file={config}",
                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{port}"],
                     str(tmp_path / "prometheus.log"))

    def query(expr):
        try:
            _, doc = get(f"http://127.0.0.1:{port}/api/v1/query?"
                         + urllib.parse.urlencode({"query": expr}))
        except OSError:
            return None
        return json.loads(doc)["data"]["result"] or None

    try:
        yield query
    finally:
        server.stop()


@pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason="prometheus not installed (make setup)")
def test_prometheus_scrapes_job_metrics(cluster, tmp_path):
    make_model("qwen3", str(tmp_path / "model"), seed=7)
    make_dataset(str(tmp_path / "data.jsonl"), n=16, vocab=320, seed=8)
    cluster.start_coordinator()
    cluster.start_worker("w1")
    job_id = cluster.submit(base_spec(str(tmp_path / "model"), str(tmp_path / "data.jsonl"),
                                      max_steps=4))
    assert cluster.cli("watch", job_id, timeout=300).returncode == 0

    status, body = get(f"http://{cluster.http}/healthz")
    assert status == 200
    status, text = get(f"http://{cluster.http}/metrics")
    assert status == 200
    lint = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                          text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert 'ballast_jobs{state="succeeded"} 1' in text, text[:3000]

    with prometheus(tmp_path, {"ballastd": cluster.http}) as query:
        up = wait_for(lambda: query('up{job="ballastd"} == 1'), 60, "Prometheus to scrape")
        assert up[0]["value"][1] == "1"
        done = wait_for(lambda: query('ballast_jobs{state="succeeded"}'), 30, "ballast_jobs")
        assert done[0]["value"][1] == "1"
        steps = wait_for(lambda: query(f'ballast_job_step{{job_id="{job_id}"}}'), 30,
                         "the job's step series")
        assert steps[0]["value"][1] == "4"


@pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason="prometheus not installed (make setup)")
def test_prometheus_follows_a_running_job_and_fires_the_shipped_alerts(cluster, tmp_path):
    """While a job runs with an injected fault, a Prometheus loaded with
    deploy/prometheus/ballast-alerts.yml scrapes the coordinator and the
    worker, answers the job's grad_norm, a per-rank step-time quantile, the
    rollback counter and the worker's running ranks, and fires the
    non-finite and rollback alerts for that job (issue 19)."""
    make_model("qwen3", str(tmp_path / "model"), seed=7)
    make_dataset(str(tmp_path / "data.jsonl"), n=64, vocab=320, seed=8)
    cluster.start_coordinator()
    worker_http = f"127.0.0.1:{free_port()}"
    cluster.start_worker("w1", cpu_slots=2, extra_args=["--http", worker_http])
    rules = os.path.join(os.environ.get("BALLAST_SOURCE_DIR", "."), "deploy", "prometheus",
                         "ballast-alerts.yml")
    with prometheus(tmp_path, {"ballastd": cluster.http, "worker": worker_http},
                    [rules]) as query:
        # Scraping first, as in production: increase() needs the counters'
        # 0 before the fault, and a series first seen at 1 has no increase.
        wait_for(lambda: query('up{job="ballastd"} == 1'), 60, "Prometheus to scrape")
        # The tiny model takes about 75 steps a second: the fault at step
        # 400 comes seconds after the first scrape of the job's series.
        spec = base_spec(str(tmp_path / "model"), str(tmp_path / "data.jsonl"), max_steps=20000)
        spec.update(devices=2, checkpoint_every=0,
                    guard={"snapshot_every": 2, "good_after_steps": 2,
                           "inject": {"nan_grad_at_step": [400, 401, 402]}})
        spec["data"]["grad_accum_steps"] = 2
        job_id = cluster.submit(spec)
        wait_for(lambda: query(f'ballast_job_rollbacks_total{{job_id="{job_id}"}} == 0'), 60,
                 "the rollback counter at 0")
        selector = f'job_id="{job_id}"'
        grad_norm = wait_for(lambda: query(f"ballast_job_grad_norm{{{selector}}}"), 120,
                             "the job's grad_norm")
        assert float(grad_norm[0]["value"][1]) >= 0
        quantile = wait_for(lambda: query(
            "histogram_quantile(0.5, sum by (le, rank) "
            f"(rate(ballast_rank_step_seconds_bucket{{{selector}}}[20s]))) > 0"), 120,
            "a per-rank step-time quantile")
        assert {q["metric"]["rank"] for q in quantile} == {"0", "1"}, quantile
        rollbacks = wait_for(lambda: query(f"ballast_job_rollbacks_total{{{selector}}} >= 1"),
                             300, "the rollback counter")
        assert rollbacks[0]["value"][1] == "1"
        for alert in ("BallastJobRolledBack", "BallastJobNonFiniteSteps"):
            firing = wait_for(lambda: query(
                f'ALERTS{{alertname="{alert}",alertstate="firing",{selector}}}'), 60,
                f"{alert} to fire")
            assert firing[0]["metric"]["severity"] == "warning"
        running = query(f"ballast_job_running{{{selector}}}")
        assert running and running[0]["value"][1] == "1"
        # The worker's own endpoint: its two ranks, both devices busy.
        ranks = wait_for(lambda: query('ballast_node_ranks_running{job="worker"} == 2'), 30,
                         "the worker's running ranks")
        assert ranks[0]["value"][1] == "2"
        busy = query('ballast_node_devices{job="worker",state="busy"}')
        assert busy and busy[0]["value"][1] == "2" and busy[0]["metric"]["kind"] == "cpu"
        status, body = get(f"http://{worker_http}/healthz")
        assert (status, body) == (200, "ok\n")
        cluster.cli("cancel", job_id)
