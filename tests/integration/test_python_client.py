"""A client written outside our C++ code: Python stubs generated from
proto/ballast/v1 with grpcio-tools at test time submit and watch a job, and
the standard health and reflection services answer."""
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import proto_stubs
from cluster import base_spec, make_dataset, make_model


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    proto_stubs.generate(tmp_path_factory.mktemp("stubs"))
    from ballast.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc, job_spec_pb2
    return job_pb2, job_service_pb2, job_service_pb2_grpc, job_spec_pb2


def make_spec(job_spec_pb2, model, data, steps):
    s = job_spec_pb2.JobSpec()
    s.name = "python-client"
    s.model.path = model
    s.method = "lora"
    s.lora.r = 4
    s.lora.lora_alpha = 8
    s.lora.target_modules.append("all-linear")
    s.data.path = data
    s.data.seq_len = 64
    s.optimizer.lr = 1e-3
    s.max_steps = steps
    s.checkpoint_every = 2
    return s


def test_python_client_submits_and_watches(cluster, stubs, tmp_path):
    job_pb2, svc_pb2, svc_grpc, spec_pb2 = stubs
    make_model("llama", str(tmp_path / "model"), seed=3)
    make_dataset(str(tmp_path / "data.jsonl"), n=16, vocab=320, seed=4)
    cluster.start_coordinator()
    cluster.start_worker("w1")

    channel = grpc.insecure_channel(cluster.grpc)
    jobs = svc_grpc.JobServiceStub(channel)
    request = svc_pb2.SubmitJobRequest(
        spec=make_spec(spec_pb2, str(tmp_path / "model"), str(tmp_path / "data.jsonl"), 5),
        request_id=str(uuid.uuid4()))
    job = jobs.SubmitJob(request, timeout=10)
    assert job.id.startswith("job-")
    # The same request id returns the same job: submission is idempotent.
    assert jobs.SubmitJob(request, timeout=10).id == job.id

    seqs, steps, final = [], [], None
    for event in jobs.WatchJob(svc_pb2.WatchJobRequest(job_id=job.id), timeout=300):
        seqs.append(event.seq)
        if event.training.HasField("step_metrics"):
            steps.append(event.training.step_metrics.step)
            assert event.attempt == 1
            assert event.training.step_metrics.HasField("loss"), "every step has labels"
        if event.HasField("state_change"):
            final = event.state_change.to
    assert final == job_pb2.JOB_STATE_SUCCEEDED
    assert steps == [1, 2, 3, 4, 5]
    assert seqs == list(range(1, len(seqs) + 1)), "sequence numbers have no gaps"

    # ListJobs alone carries each job's last step.
    listed = jobs.ListJobs(svc_pb2.ListJobsRequest(), timeout=10).jobs
    assert [j.last_step.step for j in listed if j.id == job.id] == [5]

    # A watcher that reconnects after seq k gets exactly the rest.
    k = len(seqs) // 2
    replay = [e.seq for e in jobs.WatchJob(
        svc_pb2.WatchJobRequest(job_id=job.id, after_seq=k), timeout=30)]
    assert replay == seqs[k:]

    with pytest.raises(grpc.RpcError) as missing:
        jobs.GetJob(svc_pb2.GetJobRequest(job_id="job-ffffffffffff"), timeout=10)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_invalid_specs_and_oversized_messages_are_rejected(cluster, stubs, tmp_path):
    job_pb2, svc_pb2, svc_grpc, spec_pb2 = stubs
    make_model("qwen2", str(tmp_path / "model"), seed=5)
    make_dataset(str(tmp_path / "data.jsonl"), n=4, vocab=320, seed=6)
    cluster.start_coordinator()
    jobs = svc_grpc.JobServiceStub(grpc.insecure_channel(cluster.grpc))

    def submit(mutate):
        s = make_spec(spec_pb2, str(tmp_path / "model"), str(tmp_path / "data.jsonl"), 5)
        mutate(s)
        with pytest.raises(grpc.RpcError) as err:
            jobs.SubmitJob(svc_pb2.SubmitJobRequest(spec=s), timeout=10)
        return err.value

    cases = [
        (lambda s: setattr(s.optimizer, "lr", -1.0), "optimizer.lr"),
        (lambda s: setattr(s.lora, "r", 0), "lora.r"),
        (lambda s: setattr(s.data, "seq_len", 100000), "data.seq_len"),
        (lambda s: setattr(s.model, "path", str(tmp_path / "absent")), "model.path"),
    ]
    for mutate, field in cases:
        err = submit(mutate)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, err.details())
        assert field in err.details() or "absent" in err.details(), err.details()

    err = submit(lambda s: setattr(s, "name", "x" * (5 << 20)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(cluster.grpc))
    status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING

    reflection = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(cluster.grpc))
    answers = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert {"ballast.v1.JobService", "ballast.v1.WorkerService"} <= names
    assert cluster.coordinator.alive()
