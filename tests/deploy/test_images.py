"""The container images and the compose cluster (issue 18): `make images`
builds both from the binaries of `make build`; the coordinator container
serves grpc.health.v1 and /healthz and stops at once on SIGTERM; the worker
container resolves every library of ballast-train and runs LibTorch 2.11.0;
deploy/compose trains the demo job, and a 4-rank gang across its two
worker containers."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.environ.get("BALLAST_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin"))
COORDINATOR = "localhost/ballast-coordinator:latest"
WORKER = "localhost/ballast-worker:latest"


def run(*args, timeout=120, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def images(podman):
    env = dict(os.environ, BALLAST_BIN_DIR=BIN)
    r = run("bash", os.path.join(ROOT, "scripts", "images"), timeout=1500, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    return r.stdout


@pytest.fixture
def container():
    """Starts detached containers; removes them (and their volumes) after."""
    names = []

    def start(image, *args, name=None, options=()):
        name = name or f"ballast-test-{os.getpid()}-{len(names)}"
        r = run("podman", "run", "-d", "--name", name, "--network=host", *options, image, *args)
        assert r.returncode == 0, r.stderr
        names.append(name)
        return name

    yield start
    for name in names:
        run("podman", "rm", "-f", "-v", name)


def inspect(name, template):
    return run("podman", "inspect", "--format", template, name).stdout.strip()


def test_the_images_report_their_sizes_and_the_coordinator_stays_small(images):
    sizes = {}
    for image in (COORDINATOR, WORKER):
        sizes[image] = int(run("podman", "image", "inspect", "--format", "{{.Size}}",
                               image).stdout)
    print({k: f"{v / 1e6:.0f} MB" for k, v in sizes.items()})
    assert "ballast-coordinator" in images and " MB" in images
    # No LibTorch in the coordinator: a Debian base and the gRPC stack.
    assert sizes[COORDINATOR] < 300e6, sizes
    image = json.loads(run("podman", "image", "inspect", COORDINATOR).stdout)[0]
    assert image["Config"]["User"] == "10001:10001"
    assert "/var/lib/ballast" in image["Config"]["Volumes"]
    assert image["Healthcheck"]["Test"] == ["CMD", "ballast", "--timeout", "2", "health"]
    r = run("podman", "run", "--rm", "--entrypoint", "sh", COORDINATOR, "-c",
            "ls /usr/local/lib/ballast | grep -c torch || true")
    assert r.stdout.strip() == "0", r.stdout


def test_the_coordinator_image_wants_a_token_for_its_default_addresses(images):
    r = run("podman", "run", "--rm", "--network=host", COORDINATOR)
    assert r.returncode == 2  # a usage error: the --listen value needs a token
    assert "--listen 0.0.0.0:50051 is reachable from other machines, and no BALLAST_TOKEN" \
        in r.stderr, r.stderr


def test_the_coordinator_container_is_healthy_and_stops_within_5_s(images, container):
    grpc_port, http_port = free_port(), free_port()
    name = container(COORDINATOR, "--listen", f"127.0.0.1:{grpc_port}", "--http",
                     f"127.0.0.1:{http_port}", "--state-dir", "/var/lib/ballast",
                     options=["-e", f"BALLAST_COORDINATOR=127.0.0.1:{grpc_port}"])
    deadline = time.time() + 30
    while run("podman", "healthcheck", "run", name).returncode != 0:
        assert time.time() < deadline, run("podman", "logs", name).stderr
        time.sleep(0.3)
    r = run(os.path.join(BIN, "ballast"), "--coordinator", f"127.0.0.1:{grpc_port}", "health")
    assert (r.returncode, r.stdout) == (0, "SERVING\n"), r.stderr
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=5) as response:
        assert response.read() == b"ok\n"
    assert "store sqlite:/var/lib/ballast/ballastd.db" in run("podman", "logs", name).stderr

    started = time.monotonic()
    r = run("podman", "stop", "--time", "30", name)
    elapsed = time.monotonic() - started
    assert r.returncode == 0, r.stderr
    assert elapsed < 5, f"podman stop took {elapsed:.1f} s"
    assert inspect(name, "{{.State.ExitCode}}") == "0"
    assert "shutting down" in run("podman", "logs", name).stderr


def test_the_worker_container_finds_every_library_and_runs_libtorch_2_11(images, container):
    r = run("podman", "run", "--rm", "--entrypoint", "ldd", WORKER, "/opt/ballast/bin/ballast-train")
    assert r.returncode == 0 and "not found" not in r.stdout, r.stdout
    resolved = {line.split()[0]: os.path.normpath(line.split()[2])
                for line in r.stdout.splitlines() if " => /" in line}
    # The wheel's layout: torch/lib through the binary's RPATH, nvidia/ through
    # libtorch_cuda's own.
    assert resolved["libtorch_cuda.so"] == "/opt/ballast/site-packages/torch/lib/libtorch_cuda.so"
    assert resolved["libnccl.so.2"] == "/opt/ballast/site-packages/nvidia/nccl/lib/libnccl.so.2"
    assert resolved["libcudnn.so.9"] == "/opt/ballast/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
    r = run("podman", "run", "--rm", "--entrypoint", "ballast-train", WORKER, "--version")
    assert r.returncode == 0 and "LibTorch 2.11.0" in r.stdout, r.stdout + r.stderr

    # As PID 1 with nothing to reach, it still stops at once on SIGTERM.
    name = container(WORKER, "--cpu-slots", "1", "--coordinator", f"127.0.0.1:{free_port()}")
    time.sleep(1)
    started = time.monotonic()
    assert run("podman", "stop", "--time", "30", name).returncode == 0
    assert time.monotonic() - started < 5
    assert inspect(name, "{{.State.ExitCode}}") == "0"


def test_the_worker_names_the_shared_storage_it_cannot_see(images, tmp_path):
    r = run("podman", "run", "--rm", "--network=host", WORKER, "--cpu-slots", "1",
            "--shared-dir", "/srv/ballast")
    assert r.returncode == 1
    assert "shared storage /srv/ballast is missing on this node" in r.stderr, r.stderr
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    r = run("podman", "run", "--rm", "--network=host", "-v", f"{private}:/srv/ballast", WORKER,
            "--cpu-slots", "1", "--shared-dir", "/srv/ballast")
    assert r.returncode == 1
    assert "shared storage /srv/ballast is not readable by uid 10001" in r.stderr, r.stderr


def compose_env(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    return dict(os.environ, BALLAST_BIN_DIR=BIN, BALLAST_SHARED=str(shared),
                BALLAST_GRPC_PORT=str(free_port()), BALLAST_HTTP_PORT=str(free_port()),
                BALLAST_WORKER1_HTTP_PORT=str(free_port()),
                BALLAST_WORKER2_HTTP_PORT=str(free_port()),
                BALLAST_COMPOSE_PROJECT=f"ballast-test-{os.getpid()}", BALLAST_SKIP_IMAGES="1")


def test_make_demo_containers_trains_the_demo_job_onto_the_shared_volume(images, tmp_path):
    env = compose_env(tmp_path)
    r = run("bash", os.path.join(ROOT, "scripts", "demo-containers"), timeout=900, env=env,
            cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCEEDED" in r.stdout
    assert "guard skip at step 33" in r.stdout and "guard rollback" in r.stdout, r.stdout
    outputs = os.path.join(env["BALLAST_SHARED"], "outputs")
    (job,) = os.listdir(outputs)
    assert os.path.getsize(os.path.join(outputs, job, "adapter", "adapter_model.safetensors")) > 0
    # Torn down: no container of the project is left.
    left = run("podman", "ps", "-a", "--filter", f"label=io.podman.compose.project="
               f"{env['BALLAST_COMPOSE_PROJECT']}", "--format", "{{.Names}}").stdout
    assert left.strip() == ""


def test_a_gang_spans_both_worker_containers(images, tmp_path):
    env = compose_env(tmp_path)
    shared = env["BALLAST_SHARED"]
    compose = ["podman-compose", "--project-name", env["BALLAST_COMPOSE_PROJECT"], "-f",
               os.path.join(ROOT, "deploy", "compose", "compose.yaml")]
    run("python3", os.path.join(ROOT, "scripts", "tiny-model"), os.path.join(shared, "tiny"))
    os.makedirs(os.path.join(shared, "outputs"))
    os.chmod(os.path.join(shared, "outputs"), 0o777)
    run("chmod", "-R", "a+rX", shared)
    with open(os.path.join(ROOT, "examples", "tiny-lora.yaml")) as f:
        spec = f.read().replace("build/tiny/", "/srv/ballast/tiny/")
    with open(os.path.join(shared, "job.yaml"), "w") as f:
        f.write(spec)
    up = run(*compose, "up", "-d", env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        cli = [os.path.join(BIN, "ballast"), "--coordinator",
               f"127.0.0.1:{env['BALLAST_GRPC_PORT']}"]
        deadline = time.time() + 60
        while True:
            r = run(*cli, "workers", "-o", "json")
            alive = [w for w in json.loads(r.stdout or "{}").get("workers", []) if w.get("alive")] \
                if r.returncode == 0 else []
            if len(alive) == 2:
                break
            assert time.time() < deadline, r.stderr + run(*compose, "logs", env=env).stdout
            time.sleep(0.3)
        r = run(*cli, "submit", os.path.join(shared, "job.yaml"), "-o", "json",
                "--set", "devices=4", "--set", "data.grad_accum_steps=4", "--set", "max_steps=6",
                "--set", "checkpoint_every=0")
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout)["id"]
        r = run(*cli, "watch", job_id, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr + run(*compose, "logs", env=env).stdout
        job = json.loads(run(*cli, "get", job_id, "-o", "json").stdout)
        assert job["state"] == "JOB_STATE_SUCCEEDED", job
        # Two ranks in each worker container, each exiting 0.
        names = run("podman", "ps", "--filter",
                    f"label=io.podman.compose.project={env['BALLAST_COMPOSE_PROJECT']}",
                    "--format", "{{.Names}}").stdout.split()
        workers = [n for n in names if "worker" in n]
        assert len(workers) == 2, names
        for name in workers:
            lines = run("podman", "logs", name).stdout.splitlines()
            assert sum("started rank" in line and job_id in line for line in lines) == 2, lines
            assert sum(f"of {job_id} attempt 1 exited with code 0" in line
                       for line in lines) == 2, lines
    finally:
        run(*compose, "down", "--volumes", env=env, timeout=300)
