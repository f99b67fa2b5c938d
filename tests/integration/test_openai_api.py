"""The OpenAI-compatible fine-tuning API (issue 34, docs/openai-api.md) with
the official `openai` Python client against a real ballastd and worker on
loopback: upload a chat JSONL, create a job, list, retrieve, follow its
events until it succeeds, list its checkpoints, cancel a second job. Tenants
are Ballast's: another tenant's file and job are 404, a worker token 403.
The HTTP rules hold for the POST routes: no bearer token, a foreign Origin
and a body over --openai-max-file-bytes are refused before any route."""
import hashlib
import json
import os
import random
import time
import urllib.error
import urllib.request

import openai
import pytest

from cluster import make_model, wait_for

from test_chat_template import QWEN3  # noqa: E402
from trained_tokenizers import write_chat_tokenizer  # noqa: E402

ADMIN = "admin-bootstrap-token"
MAX_FILE_BYTES = 200_000


def chats(n, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(json.dumps({"messages": [
            {"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}))
    return "\n".join(lines) + "\n"


@pytest.fixture
def api(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("BALLAST_TOKEN", ADMIN)
    model = str(tmp_path / "model")
    make_model("qwen3", model, seed=random.randrange(1 << 30))
    write_chat_tokenizer(model, QWEN3)
    cluster.start_coordinator(extra_args=["--openai-model", f"tiny={model}",
                                          "--openai-max-file-bytes", str(MAX_FILE_BYTES)])
    tokens = {}
    for name, args in {"alice": ["--role", "user", "--tenant", "team-a"],
                       "bob": ["--role", "user", "--tenant", "team-b"],
                       "node": ["--role", "worker", "--worker-id", "node-a"]}.items():
        r = cluster.cli("token", "create", *args, token=ADMIN)
        assert r.returncode == 0, r.stderr
        tokens[name] = r.stdout.strip()
    cluster.start_worker("w1", cpu_slots=2, env={**os.environ, "BALLAST_TOKEN": tokens["node"]})
    base = f"http://{cluster.http}/v1"
    # No retries: every answer is the server's first.
    clients = {name: openai.OpenAI(api_key=token, base_url=base, max_retries=0)
               for name, token in tokens.items()}
    return cluster, clients, tmp_path


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def test_upload_train_follow_checkpoints_cancel_and_tenants(api):
    cluster, clients, tmp = api
    alice, bob = clients["alice"], clients["bob"]

    text = chats(16, seed=random.randrange(1 << 30))
    with open(write(tmp / "train.jsonl", text), "rb") as f:
        uploaded = alice.files.create(file=f, purpose="fine-tune")
    assert uploaded.object == "file" and uploaded.purpose == "fine-tune"
    assert uploaded.id.startswith("file-") and uploaded.bytes == len(text.encode())
    assert uploaded.filename == "train.jsonl"
    assert uploaded.model_extra["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert alice.files.retrieve(uploaded.id).id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(uploaded.id)

    # A bad line is refused at upload, naming it, in OpenAI's error object.
    bad = text.splitlines()
    bad[2] = json.dumps({"messages": [{"role": "user", "content": "no answer"}]})
    with open(write(tmp / "bad.jsonl", "\n".join(bad)), "rb") as f:
        with pytest.raises(openai.BadRequestError) as refused:
            alice.files.create(file=f, purpose="fine-tune")
    assert refused.value.param == "file" and "line 3" in refused.value.message
    assert "no assistant message" in refused.value.message
    with open(tmp / "train.jsonl", "rb") as f:
        with pytest.raises(openai.BadRequestError) as refused:
            alice.files.create(file=f, purpose="assistants")
    assert refused.value.param == "purpose"
    with open(write(tmp / "big.jsonl", text * (MAX_FILE_BYTES // len(text) + 1)), "rb") as f:
        with pytest.raises(openai.APIStatusError) as refused:
            alice.files.create(file=f, purpose="fine-tune")
    assert refused.value.status_code == 413 and refused.value.code == "request_too_large"

    # 16 chats, batches of 4, 2 epochs: 8 steps, a checkpoint per epoch.
    job = alice.fine_tuning.jobs.create(
        model="tiny", training_file=uploaded.id, suffix="sums", seed=7,
        hyperparameters={"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 2})
    assert job.object == "fine_tuning.job" and job.status in ("queued", "validating_files")
    assert job.model == "tiny" and job.training_file == uploaded.id and job.seed == 7
    assert job.organization_id == "team-a" and job.fine_tuned_model is None
    assert (job.hyperparameters.n_epochs, job.hyperparameters.batch_size,
            job.hyperparameters.learning_rate_multiplier) == (2, 4, 2)
    assert job.model_extra["ballast"]["max_steps"] == 8

    # Follow the events, as a user would, until the job ends.
    seen = {}
    deadline = time.time() + 120
    while time.time() < deadline:
        for event in alice.fine_tuning.jobs.list_events(job.id, limit=100):
            seen[event.id] = event
        current = alice.fine_tuning.jobs.retrieve(job.id)
        if current.status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.5)
    assert current.status == "succeeded", (current, cluster.logs())
    assert current.fine_tuned_model == f"ft:tiny:team-a:sums:{job.id}"
    assert current.finished_at >= current.created_at and current.error is None

    # Newest first, paged with after/limit (iterating a page follows the
    # next ones), and the pages are the whole list.
    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=100))
    seqs = [int(e.id.rsplit("-", 1)[1]) for e in events]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) == len(set(seqs))
    paged = [e.id for e in alice.fine_tuning.jobs.list_events(job.id, limit=3)]
    assert paged == [e.id for e in events]
    first = alice.fine_tuning.jobs.list_events(job.id, limit=3)
    assert first.has_more and len(first.data) == 3
    assert sorted({int(e.data["step"]) for e in events if e.type == "metrics"}) == \
        list(range(1, 9))
    assert any(e.message.startswith("Job succeeded") for e in events)

    checkpoints = list(alice.fine_tuning.jobs.checkpoints.list(job.id))
    assert [c.step_number for c in checkpoints] == [8, 4]
    for c in checkpoints:
        assert c.object == "fine_tuning.job.checkpoint" and c.fine_tuning_job_id == job.id
        assert c.fine_tuned_model_checkpoint == f"{current.fine_tuned_model}:ckpt-step-{c.step_number}"
        assert c.metrics.step == c.step_number and c.metrics.train_loss > 0
    losses = {int(e.data["step"]): e.data["train_loss"] for e in events if e.type == "metrics"}
    assert [c.metrics.train_loss for c in checkpoints] == [losses[8], losses[4]]

    # A second job, long enough to still run, then cancelled.
    second = alice.fine_tuning.jobs.create(model="tiny", training_file=uploaded.id,
                                           hyperparameters={"n_epochs": 50, "batch_size": 1})
    wait_for(lambda: alice.fine_tuning.jobs.retrieve(second.id).status == "running", 60,
             "the second job to run")
    assert alice.fine_tuning.jobs.cancel(second.id).status == "cancelled"
    wait_for(lambda: alice.fine_tuning.jobs.retrieve(second.id).model_extra["ballast"]["state"]
             == "cancelled", 60, "the second job's ranks to stop")

    listed = alice.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in listed.data] == [second.id] and listed.has_more
    assert [j.id for j in alice.fine_tuning.jobs.list(limit=1)] == [second.id, job.id]

    # Another tenant: not found, as a job that does not exist, for every verb.
    for call in (lambda: bob.fine_tuning.jobs.retrieve(job.id),
                 lambda: bob.fine_tuning.jobs.cancel(job.id),
                 lambda: bob.fine_tuning.jobs.list_events(job.id),
                 lambda: bob.fine_tuning.jobs.checkpoints.list(job.id),
                 lambda: bob.fine_tuning.jobs.create(model="tiny", training_file=uploaded.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(bob.fine_tuning.jobs.list()) == []

    # Tokens: a wrong one is 401, a worker's 403, as on the gRPC API.
    wrong = openai.OpenAI(api_key="tok-wrong.secret", base_url=f"http://{cluster.http}/v1",
                          max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.fine_tuning.jobs.list()
    with pytest.raises(openai.PermissionDeniedError):
        clients["node"].fine_tuning.jobs.retrieve(job.id)


def post(cluster, path, body=b"{}", headers=None):
    request = urllib.request.Request(f"http://{cluster.http}{path}", data=body, method="POST",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_post_routes_keep_the_http_rules(api):
    cluster, clients, _ = api
    # No bearer token, or a foreign Origin: refused before any route, and
    # under /v1/ in OpenAI's error object too.
    for headers in ({}, {"Authorization": "Bearer x", "Origin": "http://evil.example"}):
        status, body = post(cluster, "/v1/fine_tuning/jobs", headers=headers)
        assert status == 403
        error = json.loads(body)["error"]
        assert error["code"] == "permission_denied" and error["type"] == "invalid_request_error"
        assert error["message"] and error["param"] is None
    # A POST no route takes: 405, OpenAI's object under /v1/, ballastd's elsewhere.
    status, body = post(cluster, "/v1/models", headers={"Authorization": "Bearer x"})
    assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
    status, body = post(cluster, "/api/v1/jobs", headers={"Authorization": "Bearer x"})
    assert status == 405 and isinstance(json.loads(body)["error"], str)
    # Errors are OpenAI's error object.
    status, body = post(cluster, "/v1/fine_tuning/jobs", b"not json",
                        headers={"Authorization": f"Bearer {ADMIN}"})
    error = json.loads(body)["error"]
    assert status == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    status, body = post(cluster, "/v1/fine_tuning/jobs",
                        json.dumps({"model": "gpt-4o-mini", "training_file": "file-x"}).encode(),
                        headers={"Authorization": f"Bearer {ADMIN}"})
    assert status == 404 and json.loads(body)["error"]["param"] == "training_file"
