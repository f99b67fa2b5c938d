"""ballastd on PostgreSQL (--store postgresql://...): what it acknowledged is
there after a kill -9 and a restart, and its password never shows; a SQLite
store that a ballastd filled, moved to PostgreSQL with `ballast migrate-store`,
serves the same jobs there. The server is a throwaway one, made by
tests/unit/server/postgres_server.sh (run as the postgres user when this is
root)."""
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile

import pytest

from cluster import CLI, base_spec, make_dataset, make_model, wait_for

ADMIN = "admin-bootstrap-token"

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


def migrate(*args):
    return subprocess.run([CLI, "migrate-store", *args], capture_output=True, text=True,
                          timeout=120)


def checksums(report):
    """{table: (source rows, target rows, checksum)} of migrate-store's table."""
    rows = re.findall(r"^(jobs|events|workers|tokens)\s+(\d+)\s+(\d+)\s+([0-9a-f]{64})\s+ok$",
                      report, re.M)
    return {table: (int(source), int(target), checksum) for table, source, target, checksum in rows}


def served(cluster, ids, finished, token=ADMIN):
    """What ballast shows of the jobs: the list, each job, and the events of the
    finished ones (watch replays them and ends)."""
    view = {"list": json.loads(cluster.cli("list", "-o", "json", token=token).stdout)}
    for job_id in ids:
        r = cluster.cli("get", job_id, "-o", "json", token=token)
        assert r.returncode == 0, r.stderr
        view[job_id] = json.loads(r.stdout)
    for job_id in finished:
        r = cluster.cli("watch", job_id, "-o", "json", token=token)
        assert r.returncode == 1, r.stderr  # cancelled
        view[f"{job_id} events"] = [json.loads(line) for line in r.stdout.splitlines()]
        assert view[f"{job_id} events"], job_id
    return view


def test_a_sqlite_store_migrated_to_postgresql_serves_the_same_jobs(cluster, postgres_url,
                                                                    tmp_path, monkeypatch):
    monkeypatch.setenv("BALLAST_TOKEN", ADMIN)
    make_model("qwen3", str(tmp_path / "model"), seed=1)
    make_dataset(str(tmp_path / "data.jsonl"), n=8, vocab=320, seed=2)
    # Finished jobs leave memory at once, so the copy has evicted jobs too.
    flags = ["--metrics-retention-ms", "1"]
    cluster.start_coordinator(extra_args=flags)
    ids = [cluster.submit(base_spec(str(tmp_path / "model"), str(tmp_path / "data.jsonl")),
                          f"job-{i}.yaml") for i in range(3)]
    for job_id in ids[1:]:
        assert cluster.cli("cancel", job_id).returncode == 0
    r = cluster.cli("token", "create", "--role", "user", "--tenant", "default")
    assert r.returncode == 0, r.stderr
    user = r.stdout.strip()
    db = os.path.join(cluster.root, "state", "ballastd.db")

    def evicted():
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT COUNT(*) FROM jobs WHERE evicted = 1").fetchone()[0] == 2
    wait_for(evicted, 30, "the cancelled jobs to leave memory")
    before = served(cluster, ids, ids[1:])

    # A running ballastd has the file open: refused, and nothing is written.
    r = migrate(f"sqlite:{db}", postgres_url)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "source store sqlite:" in r.stderr and "a running ballastd?" in r.stderr, r.stderr
    cluster.coordinator.stop()

    r = migrate(f"sqlite:{db}", postgres_url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "postgresql://ballast:***@/postgres" in r.stdout and "hunter2" not in r.stdout
    there = checksums(r.stdout)
    assert set(there) == {"jobs", "events", "workers", "tokens"}, r.stdout
    assert there["jobs"][:2] == (3, 3) and there["tokens"][:2] == (1, 1), r.stdout
    assert there["events"][0] == there["events"][1] > 0, r.stdout
    # Once there, the target is not empty.
    r = migrate(f"sqlite:{db}", postgres_url)
    assert r.returncode == 1 and "is not empty: it holds 3 jobs, 1 token" in r.stderr, r.stderr

    cluster.start_coordinator(extra_args=["--store", postgres_url, *flags])
    assert served(cluster, ids, ids[1:]) == before
    # The user's token was copied too: it still signs in.
    assert served(cluster, ids, ids[1:], token=user) == before
    cluster.coordinator.stop()

    # And back to a new SQLite file: the same rows and checksums.
    r = migrate(postgres_url, f"sqlite:{tmp_path / 'back.db'}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert checksums(r.stdout) == there, r.stdout


def test_migrate_store_refuses_bad_urls_by_name(tmp_path):
    r = migrate(f"sqlite:{tmp_path / 'none.db'}", "postgresql://ballast:hunter2@/db?host=/none")
    assert r.returncode == 1 and "no such file" in r.stderr, r.stderr
    assert not (tmp_path / "none.db").exists()
    r = migrate(f"sqlite:{tmp_path / 'a.db'}", "mysql://ballast:hunter2@db/ballast")
    assert r.returncode == 2, r.stderr
    assert "target store: 'mysql://ballast:***@db/ballast' is not supported" in r.stderr, r.stderr
    assert "hunter2" not in r.stderr
    r = migrate(f"sqlite:{tmp_path / 'a.db'}")
    assert r.returncode != 0 and "to is required" in r.stderr, r.stderr
