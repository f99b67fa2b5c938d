"""ballast-train on bad input: a clear message naming the field or file, a
usage exit code, and nothing written as if the run had worked."""
import json
import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from reference import TRAIN, base_spec, make_dataset, make_model, write_spec  # noqa: E402
from untrainable_inputs import SHORT_RUN, untrainable_cases  # noqa: E402


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    make_model("qwen3", str(root / "model"), seed=1)
    make_dataset(str(root / "data.jsonl"), n=4, vocab=320, seed=2)
    return str(root / "model"), str(root / "data.jsonl")


def run(tmp_path, spec, *extra):
    write_spec(tmp_path / "job.yaml", **spec)
    return subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                           str(tmp_path / "out"), *extra], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("override,message", [
    (["--set", "lora.rank=4"], "unknown key 'lora.rank'"),
    (["--set", "optimizer.lr=-0.1"], "optimizer.lr = -0.1 is out of range; allowed: (0, 1]"),
    (["--set", "lora.r=0"], "lora.r = 0 is out of range"),
    (["--set", "data.seq_len=100000"], "data.seq_len = 100000 is out of range; allowed: 1..256"),
    (["--set", "max_steps=ten"], "max_steps: expected an integer, got 'ten'"),
    (["--set", "report_to=[tensorboard, wandb]"],
     "report_to = 'wandb' is not supported; allowed: tensorboard"),
])
def test_invalid_spec_names_field_and_range(tmp_path, model_and_data, override, message):
    r = run(tmp_path, base_spec(*model_and_data), *override)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


@pytest.mark.parametrize("flags,message", [
    (["--rank", "0", "--world-size", "2", "--master-port", "1"],
     "--world-size 2 disagrees with the spec's devices: 1"),
    (["--nproc", "2"], "--nproc 2 disagrees with the spec's devices: 1"),
    (["--set", "devices=2", "--set", "data.grad_accum_steps=2", "--nproc", "4"],
     "--nproc 4 disagrees with the spec's devices: 2"),
    (["--set", "devices=0"], "devices = 0 is out of range; allowed: 1..1024"),
])
def test_a_rank_count_that_disagrees_with_the_specs_devices_is_refused(tmp_path, model_and_data,
                                                                      flags, message):
    # The spec's devices is the job's world size, under a coordinator or not.
    r = run(tmp_path, base_spec(*model_and_data), *flags)
    assert r.returncode == 2, r.stderr
    assert f"ballast-train: {message}\n" in r.stderr
    assert "[rank " not in r.stderr  # refused before any rank started
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


def test_device_cuda_without_a_gpu_fails_at_start_saying_what_was_found(tmp_path,
                                                                        model_and_data):
    # As a worker starts a rank on a CPU slot: CUDA_VISIBLE_DEVICES empty,
    # so that no GPU is visible even on a machine with one.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    write_spec(tmp_path / "job.yaml", **base_spec(*model_and_data, device="cuda"))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 2, r.stderr
    assert "device: cuda, but this rank has no usable GPU" in r.stderr
    assert "CUDA_VISIBLE_DEVICES is empty" in r.stderr or "built without CUDA" in r.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")
    # auto trains on the CPU instead, and says where.
    r = run(tmp_path, base_spec(*model_and_data, device="auto", max_steps=3))
    assert r.returncode == 0, r.stderr
    assert "on cpu (fp32)" in r.stderr
    # report_to is empty by default: no TensorBoard files.
    assert not os.path.exists(tmp_path / "out" / "tensorboard")


def test_profile_writes_a_chrome_trace_of_each_steps_ops(tmp_path, model_and_data):
    # --profile: torch's profiler over the run (worker/train/trainer/op_profile.h),
    # which bench/op_profile.py sums by op.
    trace = tmp_path / "trace.json"
    r = run(tmp_path, base_spec(*model_and_data, max_steps=3), "--profile", str(trace))
    assert r.returncode == 0, r.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert len([e for e in events if e.get("name") == "ballast::step"]) == 3
    products = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"]
    assert products and all(e["args"]["Input Dims"] for e in products)
    # Our kernels' backward nodes are ops of the trace too.
    assert any("AttentionFunction" in e.get("name", "") for e in events)
    assert len((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()) == 3


def test_profile_of_a_job_of_two_ranks_writes_a_trace_per_rank(tmp_path, model_and_data):
    trace = tmp_path / "trace.json"
    r = run(tmp_path, base_spec(*model_and_data, max_steps=3, devices=2), "--nproc", "2",
            "--profile", str(trace))
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        events = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())["traceEvents"]
        assert len([e for e in events if e.get("name") == "ballast::step"]) == 3
    assert not trace.exists()


def test_profile_into_a_missing_folder_is_refused_before_any_step(tmp_path, model_and_data):
    trace = tmp_path / "no-such-folder" / "trace.json"
    r = run(tmp_path, base_spec(*model_and_data, max_steps=3), "--profile", str(trace))
    assert r.returncode == 2, r.stderr
    assert f"--profile {trace}: cannot write it: No such file or directory" in r.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


def test_missing_model_names_the_file(tmp_path, model_and_data):
    r = run(tmp_path, base_spec(str(tmp_path / "nowhere"), model_and_data[1]))
    assert r.returncode == 2
    assert str(tmp_path / "nowhere" / "config.json") in r.stderr


def test_unsupported_model_type_is_refused_as_at_submission(tmp_path, model_and_data):
    # The same rule and message as ballastd's SubmitJob (common/job_spec_files.h).
    model = tmp_path / "model"
    shutil.copytree(model_and_data[0], model)
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "mixtral"
    (model / "config.json").write_text(json.dumps(config))
    r = run(tmp_path, base_spec(str(model), model_and_data[1]))
    assert r.returncode == 2, r.stderr
    assert (f"{model / 'config.json'} has model_type 'mixtral', which is not supported; "
            "allowed: llama, qwen2, qwen3, sdar") in r.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


def test_dot_json_spec_is_read_as_proto_json(tmp_path, model_and_data):
    # lowerCamelCase names are proto JSON only; the YAML loader would refuse
    # "maxSteps" as an unknown key, so this error shows which parser read it.
    spec = base_spec(*model_and_data)
    del spec["max_steps"]
    spec["maxSteps"] = "0"
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "spec.json"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "max_steps = 0 is out of range; allowed: 1..10^9" in r.stderr


def test_corrupt_safetensors_names_the_file(tmp_path, model_and_data):
    model = tmp_path / "model"
    shutil.copytree(model_and_data[0], model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated mid-buffer
    r = run(tmp_path, base_spec(str(model), model_and_data[1]))
    # 2, not 1: a restart reads the same file, so the coordinator must not retry.
    assert r.returncode == 2, r.stderr
    assert "model.safetensors" in r.stderr


def test_tensor_of_the_wrong_shape_is_not_restartable(tmp_path, model_and_data):
    import json
    import shutil
    model = tmp_path / "model"
    shutil.copytree(model_and_data[0], model)
    config = json.loads((model / "config.json").read_text())
    config["intermediate_size"] += 8  # the weights no longer match config.json
    (model / "config.json").write_text(json.dumps(config))
    r = run(tmp_path, base_spec(str(model), model_and_data[1]))
    assert r.returncode == 2, r.stderr
    assert "mlp.gate_proj.weight has shape" in r.stderr
    assert not os.path.exists(tmp_path / "out" / "metrics.jsonl")


def test_token_outside_vocabulary_names_file_and_line(tmp_path, model_and_data):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, 3]}\n{"input_ids": [1, 99999]}\n')
    r = run(tmp_path, base_spec(model_and_data[0], str(bad)))
    assert r.returncode == 2
    assert f"{bad}:2: token id 99999 outside the vocabulary" in r.stderr


def test_allocation_failure_is_not_restartable(tmp_path, model_and_data):
    """A step that does not fit in memory fails the same way on every
    restart: exit 2 with a message that says what to lower. The limit is an
    address-space rlimit; the CUDA build of LibTorch maps about 2.6 GB of
    libraries before main, so the test raises the limit from there until the
    binary starts, and the step's activations (64 documents of 256 tokens)
    then need more than the 50 MB steps it takes."""
    import resource
    long_docs = tmp_path / "long.jsonl"
    make_dataset(str(long_docs), n=64, vocab=320, seed=3, min_len=250, max_len=256)
    spec = base_spec(model_and_data[0], str(long_docs))
    write_spec(tmp_path / "job.yaml", **spec)
    for limit_mb in range(2400, 4000, 50):
        def limit(mb=limit_mb):
            resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
        r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                            str(tmp_path / f"out{limit_mb}"), "--set", "data.seq_len=256",
                            "--set", "data.micro_batch_size=64"],
                           capture_output=True, text=True, timeout=300, preexec_fn=limit)
        if "starting at step" not in r.stderr:
            # The libraries or the model did not fit yet: the loader exits 127
            # or a library's static initialiser crashes before main.
            continue
        assert r.returncode == 2, r.stderr
        assert "out of memory" in r.stderr and "micro_batch_size" in r.stderr
        return
    pytest.fail("ballast-train never started under an address-space limit below 4 GB")


def folder_digest(folder):
    """Every file under `folder` with its size and mtime: what a write changes."""
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), folder)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("where", ["the model folder", "inside the model folder",
                                   "a link to the model folder", "around the model folder"])
def test_an_output_folder_over_the_model_is_refused_before_anything_is_written(
        tmp_path, where):
    # Issue 33: `--out` naming the model's own folder once exported over it.
    model = tmp_path / "work" / "model"
    make_model("qwen3", str(model), seed=1)
    make_dataset(str(tmp_path / "data.jsonl"), n=4, vocab=320, seed=2)
    os.symlink(model, tmp_path / "link")
    out = {"the model folder": model, "inside the model folder": model / "runs" / "a",
           "a link to the model folder": tmp_path / "link",
           "around the model folder": tmp_path / "work"}[where]
    before = folder_digest(model)
    write_spec(tmp_path / "job.yaml", **base_spec(str(model), str(tmp_path / "data.jsonl")))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert f"the output folder {out} " in r.stderr and f"model.path {model}" in r.stderr, r.stderr
    assert "would write over its own input" in r.stderr
    assert folder_digest(model) == before
    assert not os.path.exists(model / "runs")


def test_a_data_file_inside_the_output_folder_is_allowed(tmp_path, model_and_data):
    # The other side of the rule: a run writes only its own names there.
    model, data = model_and_data
    shutil.copy(data, tmp_path / "data.jsonl")
    write_spec(tmp_path / "job.yaml", **base_spec(model, str(tmp_path / "data.jsonl"),
                                                  max_steps=4))
    r = subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(tmp_path / "metrics.jsonl")


@pytest.mark.parametrize("case", ["labels_masked", "nan_base_weight", "inf_embedding",
                                  "every_record_bad", "bad_and_masked_records"])
def test_a_run_that_can_apply_no_step_fails_saying_why(tmp_path, model_and_data, case):
    # Before issue 33 a run shorter than guard.max_consecutive_bad skipped
    # every step, exited 0 and exported an adapter that never trained.
    model, data, overrides, message = untrainable_cases(str(tmp_path / "inputs"),
                                                        *model_and_data)[case]
    r = run(tmp_path, base_spec(model, data, **{**SHORT_RUN, **overrides}))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not os.path.exists(tmp_path / "out" / "adapter")
    if case in ("nan_base_weight", "inf_embedding"):
        assert "starting at step" not in r.stderr  # found at load, before step 1
