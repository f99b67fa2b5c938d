"""ballastd's /metrics read by the real tools: promtool lints the exposition,
and a Prometheus server scrapes it and answers queries about a finished job."""
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request

import pytest

from cluster import Cluster, Process, base_spec, make_dataset, make_model, wait_for

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path / "cluster"))
    yield c
    c.stop()


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

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n"
        f"  - job_name: ballastd\n    static_configs:\n      - targets: ['{cluster.http}']\n")
    server = Process([PROMETHEUS, f"--config.file={config}",
                      f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                      f"--web.listen-address=127.0.0.1:{port}"],
                     str(tmp_path / "prometheus.log"))
    try:
        def query(expr):
            try:
                _, doc = get(f"http://127.0.0.1:{port}/api/v1/query?"
                             + urllib.parse.urlencode({"query": expr}))
            except OSError:
                return None
            result = json.loads(doc)["data"]["result"]
            return result or None

        up = wait_for(lambda: query('up{job="ballastd"} == 1'), 60, "Prometheus to scrape")
        assert up[0]["value"][1] == "1"
        done = wait_for(lambda: query('ballast_jobs{state="succeeded"}'), 30, "ballast_jobs")
        assert done[0]["value"][1] == "1"
        steps = wait_for(lambda: query(f'ballast_job_step{{job_id="{job_id}"}}'), 30,
                         "the job's step series")
        assert steps[0]["value"][1] == "4"
    finally:
        server.stop()
