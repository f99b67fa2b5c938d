"""ballastd on PostgreSQL (--store postgresql://...): what it acknowledged is
there after a kill -9 and a restart, and its password never shows. The server
is a throwaway one, made by tests/unit/server/postgres_server.sh (run as the
postgres user when this is root)."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from cluster import base_spec, make_dataset, make_model

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "unit", "server", "postgres_server.sh")


@pytest.fixture
def postgres_url():
    """A URL, with a password (the server trusts every local user), of the
    postgres database of a new server; skips without PostgreSQL's binaries."""
    # Not under pytest's tmp_path: its folders are root's alone (0700), and
    # the server runs as another user.
    scratch = tempfile.mkdtemp(prefix="ballast-pg-")
    os.chmod(scratch, 0o711)
    folder = os.path.join(scratch, "server")
    r = subprocess.run([SCRIPT, "start", folder], capture_output=True, text=True, timeout=120)
    if r.returncode == 3:
        shutil.rmtree(scratch)
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    try:
        yield f"postgresql://ballast:hunter2@/postgres?host={folder}&port=5432"
    finally:
        subprocess.run([SCRIPT, "stop", folder], timeout=60)
        shutil.rmtree(scratch)


def test_jobs_on_postgresql_survive_a_kill9_and_restart(cluster, postgres_url, tmp_path):
    make_model("qwen3", str(tmp_path / "model"), seed=1)
    make_dataset(str(tmp_path / "data.jsonl"), n=8, vocab=320, seed=2)
    cluster.start_coordinator(extra_args=["--store", postgres_url])
    # No worker: the jobs stay queued, and one is cancelled.
    ids = [cluster.submit(base_spec(str(tmp_path / "model"), str(tmp_path / "data.jsonl")),
                          f"job-{i}.yaml") for i in range(3)]
    r = cluster.cli("cancel", ids[1])
    assert r.returncode == 0, r.stdout + r.stderr

    cluster.restart_coordinator_after_kill9()
    listed = json.loads(cluster.cli("list", "-o", "json").stdout)["jobs"]
    states = {j["id"]: j["state"] for j in listed}
    assert states == {ids[0]: "JOB_STATE_QUEUED", ids[1]: "JOB_STATE_CANCELLED",
                      ids[2]: "JOB_STATE_QUEUED"}
    log = cluster.logs()
    assert "store postgresql://ballast:***@/postgres?host=" in log
    assert "hunter2" not in log
