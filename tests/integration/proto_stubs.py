"""Python modules of Ballast's API, generated from proto/ with grpc_tools: the
stubs a client written outside our C++ code uses (tests, bench/failover.py)."""
import os
import subprocess
import sys

PROTO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")


def generate(folder):
    """Writes the ballast.v1 modules and their gRPC stubs into `folder`, and
    puts it on sys.path so that `from ballast.v1 import ...` finds them."""
    protos = sorted(os.path.join("ballast", "v1", name)
                    for name in os.listdir(os.path.join(PROTO_ROOT, "ballast", "v1"))
                    if name.endswith(".proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", PROTO_ROOT,
                    f"--python_out={folder}", f"--grpc_python_out={folder}", *protos], check=True)
    sys.path.insert(0, str(folder))
