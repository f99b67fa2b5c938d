"""Tenants, tokens and TLS with real processes (issue 20): an admin makes
tokens with `ballast token`, a worker registers with its own worker token and
trains a user's job, another tenant cannot see or touch that job, a revoked
token stops working at once, /metrics wants an admin; gRPC and HTTP over TLS,
and a worker token that needs a client certificate naming its worker."""
import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest

from cluster import WORKER, Process, wait_for, write_spec
from test_control_plane import inputs, spec  # noqa: F401

ADMIN = "admin-bootstrap-token"


@pytest.fixture
def secured(cluster, monkeypatch):
    # ballastd and everything the test starts inherit the bootstrap token.
    monkeypatch.setenv("BALLAST_TOKEN", ADMIN)
    cluster.start_coordinator()
    return cluster


def make_token(cluster, *args):
    r = cluster.cli("token", "create", *args, token=ADMIN)
    assert r.returncode == 0, r.stderr
    assert "shown only now" in r.stderr
    secret = r.stdout.strip()
    assert secret.startswith("tok-") and "\n" not in secret
    return secret


def test_tenants_are_isolated_and_a_worker_token_trains_as_itself(secured, inputs):
    cluster = secured
    alice = make_token(cluster, "--role", "user", "--tenant", "team-a", "--description", "alice")
    bob = make_token(cluster, "--role", "user", "--tenant", "team-b")
    node = make_token(cluster, "--role", "worker", "--worker-id", "node-a")
    cluster.start_worker("w1", cpu_slots=1, env={**os.environ, "BALLAST_TOKEN": node})
    workers = json.loads(cluster.cli("workers", "-o", "json", token=ADMIN).stdout)["workers"]
    assert [w["id"] for w in workers] == ["node-a"]

    path = os.path.join(cluster.root, "job.yaml")
    write_spec(path, **spec(inputs, max_steps=4))
    r = cluster.cli("submit", path, "-o", "json", token=alice)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["tenant"] == "team-a"
    wait_for(lambda: json.loads(cluster.cli("get", job["id"], "-o", "json", token=alice).stdout)
             ["state"] == "JOB_STATE_SUCCEEDED", 120, "alice's job to succeed")
    with open(os.path.join(cluster.root, "w1.log")) as f:
        log = f.read()
    assert "registered as node-a" in log and f"rank 0 of {job['id']} attempt 1 exited with code 0" in log

    # Bob: not found, exactly as a job that does not exist, for every verb.
    for verb in (["get"], ["cancel"], ["watch"], ["rollback", "--to-step", "1"]):
        r = cluster.cli(*verb[:1], job["id"], *verb[1:], token=bob)
        assert r.returncode == 1 and f"job {job['id']} not found" in r.stderr, (verb, r.stderr)
    r = cluster.cli("list", "-o", "json", token=bob)
    assert r.returncode == 0 and job["id"] not in r.stdout
    assert job["id"] in cluster.cli("list", token=alice).stdout
    # A user cannot manage tokens, and a worker's token reads no jobs.
    r = cluster.cli("token", "list", token=alice)
    assert r.returncode == 2 and "only an admin" in r.stderr
    r = cluster.cli("list", token=node)
    assert r.returncode == 2 and "worker token cannot call the job API" in r.stderr

    # The admin sees tokens, never their secrets, and revokes alice's.
    r = cluster.cli("token", "list", "-o", "json", token=ADMIN)
    tokens = json.loads(r.stdout)["tokens"]
    assert [t["role"] for t in tokens] == ["ROLE_USER", "ROLE_USER", "ROLE_WORKER"]
    assert alice.split(".")[1] not in r.stdout
    table = cluster.cli("token", "list", token=ADMIN).stdout
    assert "team-a" in table and "node-a" in table and "alice" in table
    alice_id = alice.split(".")[0]
    assert cluster.cli("token", "revoke", alice_id, token=ADMIN).returncode == 0
    r = cluster.cli("list", token=alice)
    assert r.returncode == 2 and "was revoked" in r.stderr

    # /metrics names every tenant's jobs: an admin's token only. Bob's token
    # is valid, so he gets 403 (no right), not 401 (no or a bad token).
    def scrape(token):
        request = urllib.request.Request(f"http://{cluster.http}/metrics",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as page:
                return page.status, page.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    status, text = scrape(bob)
    assert status == 403 and "admin token" in text and job["id"] not in text
    assert scrape("tok-0123456789abcdef.00")[0] == 401
    status, text = scrape(ADMIN)
    assert status == 200 and job["id"] in text


def test_a_spec_reads_only_its_own_tenants_job_folders(secured, inputs):
    """Issue 33: ballastd's output root holds every tenant's results. Bob
    naming Alice's job folder as his model (to train on her export) is
    refused in the same words as a job folder that does not exist; Alice
    may start from her own job's export."""
    cluster = secured
    alice = make_token(cluster, "--role", "user", "--tenant", "team-a")
    bob = make_token(cluster, "--role", "user", "--tenant", "team-b")
    path = os.path.join(cluster.root, "job.yaml")
    write_spec(path, **spec(inputs, max_steps=4))
    r = cluster.cli("submit", path, "-o", "json", token=alice)
    assert r.returncode == 0, r.stderr
    output_dir = json.loads(r.stdout)["output_dir"]
    # As her job's export would be (no worker runs it here).
    shutil.copytree(inputs[0], os.path.join(output_dir, "export"))
    missing = os.path.join(os.path.dirname(output_dir), "job-000000000000")
    os.makedirs(missing)
    for who, model in [(bob, os.path.join(output_dir, "export")),
                       (bob, os.path.join(output_dir, "export", "..", "export")),
                       (alice, missing), (bob, missing)]:
        r = cluster.cli("submit", path, "--set", f"model.path={model}", token=who)
        assert r.returncode == 2, (model, r.stdout)
        assert f"model.path: {model} lies in ballastd's output folder " in \
            r.stderr and "outside any job of yours" in r.stderr, r.stderr
    r = cluster.cli("submit", path, "--set", f"model.path={output_dir}/export", token=alice)
    assert r.returncode == 0, r.stderr


def test_without_a_bootstrap_token_no_token_can_be_made(cluster, monkeypatch):
    monkeypatch.delenv("BALLAST_TOKEN", raising=False)
    cluster.start_coordinator()
    r = cluster.cli("token", "create", "--role", "user", "--tenant", "team-a")
    assert r.returncode == 1 and "BALLAST_TOKEN" in r.stderr, r.stderr


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, ballastd's certificate for 127.0.0.1, and client certificates
    for workers node-a and node-b, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ballast-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("node-a", "extendedKeyUsage=clientAuth"),
                      ("node-b", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
                cwd=d)
    return d


def test_tls_and_worker_mtls(cluster, inputs, pki, monkeypatch):
    """gRPC and HTTP over TLS; a worker token's calls need a client
    certificate whose CN is its worker id."""
    monkeypatch.setenv("BALLAST_TOKEN", ADMIN)
    cluster.start_coordinator(extra_args=["--tls-cert", str(pki / "server.pem"),
                                          "--tls-key", str(pki / "server.key"),
                                          "--tls-client-ca", str(pki / "ca.pem")])
    # Plain gRPC to a TLS port never completes a handshake.
    r = cluster.cli("--timeout", "2", "list")
    assert r.returncode == 3, r.stderr
    cluster.cli_args = ["--tls-ca", str(pki / "ca.pem")]
    assert cluster.cli("list").returncode == 0
    node_a = make_token(cluster, "--role", "worker", "--worker-id", "node-a")

    # node-a's token with node-b's certificate: refused, and the worker says why.
    impostor = Process([WORKER, "--coordinator", cluster.grpc, "--cpu-slots", "1",
                        "--work-dir", os.path.join(cluster.root, "impostor"),
                        "--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "node-b.pem"),
                        "--tls-key", str(pki / "node-b.key")],
                       os.path.join(cluster.root, "impostor.log"),
                       env={**os.environ, "BALLAST_TOKEN": node_a})
    try:
        wait_for(lambda: "must present a client certificate" in impostor.output(), 30,
                 "the impostor's refusal")
        assert cluster.list_workers() == []
    finally:
        impostor.stop()

    cluster.start_worker("w1", cpu_slots=1, env={**os.environ, "BALLAST_TOKEN": node_a},
                         extra_args=["--tls-ca", str(pki / "ca.pem"),
                                     "--tls-cert", str(pki / "node-a.pem"),
                                     "--tls-key", str(pki / "node-a.key")])
    path = os.path.join(cluster.root, "job.yaml")
    write_spec(path, **spec(inputs, max_steps=3))
    r = cluster.cli("submit", path, "--wait")
    assert r.returncode == 0, r.stdout + r.stderr

    # HTTPS, verified against the CA.
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    with urllib.request.urlopen(f"https://{cluster.http}/healthz", context=context,
                                timeout=10) as page:
        assert page.read() == b"ok\n"
