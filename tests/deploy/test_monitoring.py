"""The monitoring files (issues 18-19): deploy/prometheus's config and alerts
pass promtool, each alert fires on its fixture series (promtool test rules),
and every PromQL expression in the alerts and in deploy/grafana/ballast.json
parses and names only metrics that ballastd exports."""
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

ROOT = os.environ.get("BALLAST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin"))
PROMETHEUS_DIR = os.path.join(ROOT, "deploy", "prometheus")
GRAFANA = os.path.join(ROOT, "deploy", "grafana", "ballast.json")
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(not PROMTOOL, reason="promtool not installed (make setup)")


def promtool(*args, cwd=PROMETHEUS_DIR):
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The metric names that a fresh ballastd and a ballast-worker show on
    their /metrics, with the series names of their histograms. prometheus-cpp
    leaves out a labelled family until it has a series, so ballastd answers one
    JobService call first (the requests' families then have theirs)."""
    root = tmp_path_factory.mktemp("ballastd")
    ready = root / "ready.json"
    ballastd = subprocess.Popen([os.path.join(BIN, "ballastd"), "--listen", "127.0.0.1:0", "--http",
                                 "127.0.0.1:0", "--state-dir", str(root / "state"),
                                 "--ready-file", str(ready)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.time() + 30
        while not (ready.exists() and ready.stat().st_size > 0):
            assert time.time() < deadline and ballastd.poll() is None, "ballastd did not start"
            time.sleep(0.1)
        addresses = json.loads(ready.read_text())
        listed = subprocess.run([os.path.join(BIN, "ballast"), "list", "--coordinator",
                                 addresses["grpc"]], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        text = scrape(addresses["http"])
        worker = subprocess.Popen([os.path.join(BIN, "ballast-worker"), "--coordinator",
                                   addresses["grpc"], "--cpu-slots", "1", "--work-dir",
                                   str(root / "worker"), "--http", "127.0.0.1:0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = worker.stdout.readline()
        match = re.search(r"metrics on http://(\S+)/metrics", line)
        assert match, line
        worker_text = scrape(match.group(1))
        # The worker's exposition passes the linter, as ballastd's does in
        # integration.prometheus.
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=worker_text,
                              capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        text += worker_text
    finally:
        for process in (worker, ballastd):
            if process:
                process.terminate()
                process.wait(timeout=30)
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.add(name)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names


def metric_names(expr):
    return set(re.findall(r"\bballast_[a-z0-9_]+", expr))


def grafana_expressions():
    dashboard = json.load(open(GRAFANA))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]
    # Grafana's variables, as Grafana substitutes them.
    return [e.replace("$job_id", ".*").replace("$__rate_interval", "5m") for e in exprs]


def test_the_prometheus_config_and_alerts_pass_promtool(tmp_path):
    # promtool opens the token file the config names: point it at one here.
    token = tmp_path / "ballast-token"
    token.write_text("s3cret\n")
    config = open(os.path.join(PROMETHEUS_DIR, "prometheus.yml")).read()
    assert config.count("credentials_file: /etc/prometheus/ballast-token") == 2
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/ballast-token", str(token)))
    shutil.copy(os.path.join(PROMETHEUS_DIR, "ballast-alerts.yml"), tmp_path)
    promtool("check", "config", "prometheus.yml", cwd=str(tmp_path))
    promtool("check", "rules", "ballast-alerts.yml")


def test_each_alert_fires_on_its_fixture_series():
    out = promtool("test", "rules", "ballast-alerts.test.yml")
    assert "SUCCESS" in out
    alerts = {r["alert"] for g in yaml.safe_load(open(os.path.join(PROMETHEUS_DIR,
                                                                   "ballast-alerts.yml")))["groups"]
              for r in g["rules"]}
    assert alerts == {"BallastJobNonFiniteSteps", "BallastJobRolledBack", "BallastJobStalled",
                      "BallastWorkerLost"}
    tests = open(os.path.join(PROMETHEUS_DIR, "ballast-alerts.test.yml")).read()
    for alert in alerts:
        # Each has a case where it fires (a non-empty exp_alerts).
        assert re.search(rf"alertname: {alert}\n\s+exp_alerts:\n\s+- exp_labels", tests), alert


def test_alerts_name_only_exported_metrics(exported):
    rules = yaml.safe_load(open(os.path.join(PROMETHEUS_DIR, "ballast-alerts.yml")))
    for group in rules["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names and names <= exported, (rule["alert"], names - exported)


def test_the_grafana_dashboard_parses_and_names_only_exported_metrics(exported, tmp_path):
    dashboard = json.load(open(GRAFANA))
    assert dashboard["uid"] == "ballast" and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exprs = grafana_expressions()
    assert len(exprs) >= 15
    # promtool parses every expression, as recording rules.
    rules = {"groups": [{"name": "grafana", "rules": [
        {"record": f"ballast:grafana_expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "grafana-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    promtool("check", "rules", str(path), cwd=str(tmp_path))
    for expr in exprs:
        names = metric_names(expr)
        assert names and names <= exported, (expr, names - exported)
    variable = dashboard["templating"]["list"][1]["definition"]
    assert metric_names(variable) <= exported, variable
