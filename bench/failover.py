#!/usr/bin/env python3
"""Benchmark: failover time of two ballastd on one PostgreSQL (issue 36).
Two ballastd share a throwaway PostgreSQL 15 server (tests/unit/server/
postgres_server.sh: a unix socket, no TCP); --kills times the leader is
killed with SIGKILL, each time timing from the kill to the first SubmitJob
that the other one acknowledges (a client given both addresses, following
a standby's `ballast-leader` trailer, retrying every 20 ms), then the
killed one is started again as the standby. Prints one row: the
distribution (min, median, p90, max seconds) against the leader lease.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..")
SERVER = os.path.join(SOURCE, "tests", "unit", "server", "postgres_server.sh")
sys.path.insert(0, os.path.join(SOURCE, "tests", "integration"))
import proto_stubs  # noqa: E402


def stubs(folder):
    """job_service_pb2 and its gRPC stubs, generated from proto/ into `folder`."""
    os.makedirs(folder)
    proto_stubs.generate(folder)
    from ballast.v1 import job_service_pb2, job_service_pb2_grpc, job_spec_pb2
    return job_service_pb2, job_service_pb2_grpc, job_spec_pb2


class Coordinator:
    """One ballastd process on the shared database, on fixed ports."""

    def __init__(self, args, root, name, url, grpc_port, http_port):
        self.args, self.root, self.name, self.url = args, root, name, url
        self.address = f"127.0.0.1:{grpc_port}"
        self.http = f"127.0.0.1:{http_port}"
        self.process = None

    def start(self):
        ready = os.path.join(self.root, f"{self.name}.ready.json")
        if os.path.exists(ready):
            os.remove(ready)
        log = open(os.path.join(self.root, f"{self.name}.log"), "ab")
        self.process = subprocess.Popen(
            [os.path.join(self.args.bin, "ballastd"), "--listen", self.address, "--http", self.http,
             "--state-dir", os.path.join(self.root, self.name), "--store", self.url,
             "--leader-lease-ms", str(self.args.leader_lease_ms), "--ready-file", ready],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"ballastd {self.name} did not start; see {log.name}")
            time.sleep(0.05)

    def kill(self):
        self.process.kill()
        self.process.wait()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(SOURCE, "build", "bin"))
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--leader-lease-ms", type=int, default=5000)
    args = parser.parse_args()
    if args.kills < 1:
        parser.error(f"--kills {args.kills}: at least 1")
    if not 1000 <= args.leader_lease_ms <= 600000:
        parser.error(f"--leader-lease-ms {args.leader_lease_ms}: allowed 1000..600000")
    root = tempfile.mkdtemp(prefix="ballast-failover-")
    os.chmod(root, 0o711)  # the server runs as postgres when this is root
    folder = os.path.join(root, "pg")
    pb, pb_grpc, spec_pb = stubs(os.path.join(root, "stubs"))
    os.makedirs(os.path.join(root, "model"))
    with open(os.path.join(root, "model", "config.json"), "w") as f:
        json.dump({"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "model_type": "qwen3",
                   "max_position_embeddings": 2048}, f)
    with open(os.path.join(root, "data.jsonl"), "w") as f:
        f.write('{"input_ids": [1, 2, 3]}\n')
    spec = spec_pb.JobSpec(name="failover", max_steps=10)
    spec.model.path = os.path.join(root, "model")
    spec.data.path = os.path.join(root, "data.jsonl")
    spec.data.seq_len = 512
    spec.optimizer.lr = 1e-4

    url = f"postgresql:///postgres?host={folder}&port=5432&user=ballast"
    coordinators = [Coordinator(args, root, name, url, free_port(), free_port())
                    for name in ("a", "b")]
    channels = {c.address: grpc.insecure_channel(c.address) for c in coordinators}
    times = []
    submitted = 0

    def submit_until_acked(give_up):
        """The address that acknowledged a SubmitJob, trying until `give_up`."""
        nonlocal submitted
        address = coordinators[0].address
        while time.monotonic() < give_up:
            submitted += 1
            request = pb.SubmitJobRequest(spec=spec, request_id=f"failover-{submitted}")
            try:
                pb_grpc.JobServiceStub(channels[address]).SubmitJob(request, timeout=2)
                return address
            except grpc.RpcError as e:
                leader = dict(e.trailing_metadata() or ()).get("ballast-leader")
                others = [c.address for c in coordinators if c.address != address]
                address = leader if leader in channels and leader != address else others[0]
                time.sleep(0.02)
        raise SystemExit("no coordinator acknowledged a SubmitJob in time; see " + root)

    subprocess.run(["sh", SERVER, "start", folder], check=True)
    try:
        for c in coordinators:
            c.start()
        for _ in range(args.kills):
            leader_address = submit_until_acked(time.monotonic() + 30)
            leader = next(c for c in coordinators if c.address == leader_address)
            leader.kill()
            killed = time.monotonic()
            new = submit_until_acked(killed + 10 * args.leader_lease_ms / 1000)
            times.append(time.monotonic() - killed)
            assert new != leader_address
            leader.start()  # the standby of the next round
    finally:
        for c in coordinators:
            if c.process is not None and c.process.poll() is None:
                c.kill()
        subprocess.run(["sh", SERVER, "stop", folder], check=False)
    shutil.rmtree(root)
    times.sort()
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    lease = args.leader_lease_ms / 1000
    print(f"failover/kill -9 of the leader to the first SubmitJob acknowledged by the standby "
          f"(leader lease {lease:g} s, PostgreSQL 15 on a unix socket): "
          f"min {times[0]:.2f} s, median {statistics.median(times):.2f} s, p90 {p90:.2f} s, "
          f"max {times[-1]:.2f} s; median {statistics.median(times) / lease:.2f}x the lease "
          f"(over {len(times)} kills)")


if __name__ == "__main__":
    main()
