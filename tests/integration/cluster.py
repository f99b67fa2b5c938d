"""A real Ballast cluster on loopback for integration tests: ballastd and
ballast-worker as child processes on ephemeral ports, the `ballast` CLI, and a
tiny random model with a tokenized dataset. Everything started here is killed
when the test ends, on failure too."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from reference import BIN, base_spec, make_dataset, make_model, write_spec  # noqa: E402,F401

BALLASTD = os.path.join(BIN, "ballastd")
WORKER = os.path.join(BIN, "ballast-worker")
CLI = os.path.join(BIN, "ballast")


def wait_for(predicate, timeout, what, interval=0.1):
    """Polls predicate until it returns a truthy value; fails naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Process:
    """One child process in its own session, with its output in a log file."""

    def __init__(self, argv, log_path, env=None):
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def descendants(self):
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill9(self, with_children=False):
        """SIGKILL, as a machine failure would: optionally its ranks too."""
        victims = self.descendants() if with_children else []
        self.proc.kill()
        for child in victims:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(timeout=10)

    def stop(self):
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        # Whatever it left behind (ranks in their own process groups) goes too.
        for child in self.descendants():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        self.log.close()

    def output(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


class Cluster:
    """ballastd plus workers under one temporary folder."""

    def __init__(self, root, lease_ms=3000, stop_grace_ms=3000):
        self.root = root
        self.lease_ms = lease_ms
        self.stop_grace_ms = stop_grace_ms
        # Runs every process of the cluster's own (and the CLI) under this
        # command, e.g. `ip netns exec NS`; empty: as they are.
        self.prefix = []
        # Flags every CLI call gets, e.g. --tls-ca.
        self.cli_args = []
        self.coordinator = None
        # ballastd's flags beyond the cluster's, kept for a restart.
        self.coordinator_args = ()
        self.grpc = None
        self.http = None
        self.workers = []
        os.makedirs(root, exist_ok=True)

    # -- coordinator -------------------------------------------------------
    def start_coordinator(self, port=0, host="127.0.0.1", extra_args=()):
        self.coordinator_args = extra_args
        ready = os.path.join(self.root, "ready.json")
        if os.path.exists(ready):
            os.remove(ready)
        argv = [*self.prefix, BALLASTD, "--listen", f"{host}:{port}", "--http", "127.0.0.1:0",
                "--state-dir", os.path.join(self.root, "state"), "--ready-file", ready,
                "--lease-ms", str(self.lease_ms), "--stop-grace-ms", str(self.stop_grace_ms),
                *extra_args]
        self.coordinator = Process(argv, os.path.join(self.root, "ballastd.log"))
        info = wait_for(lambda: self._read_ready(ready), 30, "ballastd's ready file")
        self.grpc, self.http = info["grpc"], info["http"]
        return self.coordinator

    def _read_ready(self, path):
        if not self.coordinator.alive():
            raise AssertionError("ballastd exited:\n" + self.coordinator.output())
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def restart_coordinator_after_kill9(self):
        """kill -9, then start again on the same port, store and flags."""
        host, port = self.grpc.rsplit(":", 1)
        self.coordinator.kill9()
        self.coordinator.log.close()
        return self.start_coordinator(port=int(port), host=host, extra_args=self.coordinator_args)

    # -- workers -----------------------------------------------------------
    def start_worker(self, name, cpu_slots=1, host="127.0.0.1", prefix=None, env=None,
                     extra_args=()):
        """A worker advertising `host` to its gangs' other workers, run under
        `prefix` (default the cluster's), with `extra_args` for its flags."""
        argv = [*(self.prefix if prefix is None else prefix), WORKER, "--coordinator", self.grpc,
                "--cpu-slots", str(cpu_slots), "--work-dir", os.path.join(self.root, name),
                "--host", host, *extra_args]
        worker = Process(argv, os.path.join(self.root, f"{name}.log"), env=env)
        self.workers.append(worker)
        expected = len([w for w in self.workers if w.alive()])
        wait_for(lambda: len([w for w in self.list_workers() if w.get("alive")]) >= expected,
                 30, f"worker {name} to register")
        return worker

    def list_workers(self):
        r = self.cli("workers", "-o", "json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout) if r.stdout.strip() else {}
        return doc.get("workers", []) if isinstance(doc, dict) else doc

    # -- CLI ---------------------------------------------------------------
    def cli(self, *args, timeout=60, token=None, cwd=None):
        """The CLI, in `cwd`; `token` is its BALLAST_TOKEN (default: this process's)."""
        env = None if token is None else {**os.environ, "BALLAST_TOKEN": token}
        return subprocess.run([*self.prefix, CLI, "--coordinator", self.grpc, *self.cli_args, *args],
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)

    def submit(self, spec, tmp_name="job.yaml", *extra):
        path = os.path.join(self.root, tmp_name)
        write_spec(path, **spec)
        r = self.cli("submit", path, "-o", "json", *extra)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)["id"]

    def job(self, job_id):
        r = self.cli("get", job_id, "-o", "json")
        if r.returncode != 0:
            alive = self.coordinator is not None and self.coordinator.alive()
            raise AssertionError(f"{r.stdout}{r.stderr}(ballastd {'alive' if alive else 'exited'})\n"
                                 + self.logs())
        return json.loads(r.stdout)

    def wait_state(self, job_id, states, timeout):
        return wait_for(lambda: (lambda j: j if j.get("state") in states else None)(
            self.job(job_id)), timeout, f"job {job_id} to reach {states}", interval=0.25)

    def stop(self):
        for worker in self.workers:
            worker.stop()
        if self.coordinator is not None:
            self.coordinator.stop()

    def logs(self):
        """Every process log, for a failing test's report."""
        parts = []
        for name in sorted(os.listdir(self.root)):
            if name.endswith(".log"):
                with open(os.path.join(self.root, name), errors="replace") as f:
                    parts.append(f"==== {name}\n{f.read()[-6000:]}")
        return "\n".join(parts)


def train_ranks(output_dir):
    """ballast-train processes writing to output_dir, anywhere on the machine."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and os.path.basename(cmd[0]) == "ballast-train" and output_dir in cmd:
            found.append(p)
    return found
