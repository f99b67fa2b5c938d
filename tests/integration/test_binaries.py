"""The four binaries: --version answers, and the control-plane ones stay free of LibTorch."""
import os
import re
import subprocess

import pytest

BIN = os.environ["BALLAST_BIN_DIR"]
BINARIES = ["ballast", "ballastd", "ballast-worker", "ballast-train"]


def run(*args):
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", BINARIES)
def test_version_names_release_and_commit(name):
    r = run(os.path.join(BIN, name), "--version")
    assert r.returncode == 0, r.stderr
    assert re.match(rf"^{re.escape(name)} \d+\.\d+\.\d+ \(commit [0-9a-f]{{7,}}(-dirty)?\)", r.stdout), r.stdout


def test_train_version_reports_libtorch_and_backends():
    out = run(os.path.join(BIN, "ballast-train"), "--version").stdout
    assert "LibTorch 2.11.0" in out
    assert re.search(r"^CUDA: (not )?compiled in, (not )?available", out, re.M), out
    assert re.search(r"^NCCL: (not )?compiled in, (not )?available", out, re.M), out


@pytest.mark.parametrize("name", ["ballast", "ballastd", "ballast-worker"])
def test_control_plane_binaries_do_not_link_libtorch(name):
    deps = run("ldd", os.path.join(BIN, name)).stdout
    assert "libtorch" not in deps and "libc10" not in deps, deps


def test_train_does_not_link_grpc():
    deps = run("ldd", os.path.join(BIN, "ballast-train")).stdout
    assert "libgrpc" not in deps, deps


def test_unknown_flag_is_usage_error():
    r = run(os.path.join(BIN, "ballastd"), "--no-such-flag")
    assert r.returncode != 0
    assert "no-such-flag" in (r.stderr + r.stdout)


def test_a_store_url_of_no_known_scheme_is_a_usage_error(tmp_path):
    r = run(os.path.join(BIN, "ballastd"), "--state-dir", str(tmp_path), "--store", "mysql://db/x")
    assert r.returncode == 2, r.stderr
    assert "--store: 'mysql://db/x' is not supported; expected sqlite:PATH or postgresql://" in r.stderr
