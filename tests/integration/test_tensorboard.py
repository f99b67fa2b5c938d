"""`report_to: [tensorboard]`: ballast-train's TensorBoard event files, read
back by TensorBoard's own readers, equal metrics.jsonl step for step (the
validation loss included), with the guard's events on the text dashboard, across a rollback and a resume that
redo steps already reported. (A reporter other than tensorboard is refused:
test_train_cli.py.)"""
import glob
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parity"))
from reference import (TRAIN, base_spec, make_dataset, make_model, read_metrics,  # noqa: E402
                       write_spec)

SCALARS = ("loss", "grad_norm", "lr", "tokens_per_s")
EVENT_FILE = re.compile(r"events\.out\.tfevents\.\d{10}\.[^/]+\.\d+")


def read_tensorboard(out_dir):
    """The run under OUT/tensorboard as TensorBoard's two readers see it:
    the classic EventAccumulator and the one behind its dashboards
    (plugin_event_accumulator, which `tensorboard --load_fast=false` serves),
    keeping every point (size guidance 0)."""
    logdir = os.path.join(out_dir, "tensorboard")
    classic = EventAccumulator(logdir, size_guidance={"scalars": 0, "tensors": 0})
    classic.Reload()
    plugins = plugin_event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
    plugins.Reload()
    return classic, plugins


def guard_texts(plugins):
    """{tag: [(step, text)]} of the guard's text events, as the text dashboard
    has them, leaving out tags whose every event was dropped (the classic
    EventAccumulator never drops tensors, text included, at a session start;
    the dashboards' reader does)."""
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in plugins.Tensors(tag)]
             for tag in plugins.PluginTagToContent("text")}
    return {tag: events for tag, events in texts.items() if events}


def assert_tensorboard_equals_metrics(out_dir):
    """Every scalar of every step equals metrics.jsonl's value (as float32,
    which is what TensorBoard stores), a null in metrics.jsonl is no point,
    and both readers agree. Returns the dashboards' reader."""
    lines = read_metrics(out_dir)
    classic, plugins = read_tensorboard(out_dir)
    steps = [line for line in lines if "eval" not in line]
    evals = [line["eval"] for line in lines if "eval" in line]
    points = {f"train/{key}": [(line["step"], line[key]) for line in steps] for key in SCALARS}
    if evals:
        points["eval/loss"] = [(e["step"], e["loss"]) for e in evals]
    assert set(plugins.PluginTagToContent("scalars")) == set(points)
    for tag, values in points.items():
        want = [(step, float(np.float32(v))) for step, v in values if v is not None]
        assert want, tag
        got = [(e.step, e.value) for e in classic.Scalars(tag)]
        assert got == want, tag
        got = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item())
               for e in plugins.Tensors(tag)]
        assert got == want, tag
    assert all(tag.startswith("guard/") for tag in plugins.PluginTagToContent("text"))
    return plugins


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    make_model("qwen3", str(root / "model"), seed=1)
    make_dataset(str(root / "data.jsonl"), n=64, vocab=320, seed=2)
    make_dataset(str(root / "eval.jsonl"), n=8, vocab=320, seed=3)
    return str(root / "model"), str(root / "data.jsonl"), str(root / "eval.jsonl")


def train(tmp_path, spec, *extra):
    write_spec(tmp_path / "job.yaml", **spec)
    return subprocess.run([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out",
                           str(tmp_path / "out"), *extra], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


# Standalone, and as a worker starts a rank (--attempt N): the trainer writes
# into OUT/attempts/N and commits its event file into OUT/tensorboard.
@pytest.mark.parametrize("attempts", [False, True], ids=["standalone", "attempts"])
def test_event_files_equal_metrics_across_a_rollback_and_a_resume(tmp_path, model_and_data,
                                                                  attempts):
    # Steps 5 and 6 are skipped, 7 rolls back to step 2's snapshot; 11 is
    # skipped and stays so (after step 8's checkpoint has become good).
    model, data, held_out = model_and_data
    spec = base_spec(model, data, max_steps=12, checkpoint_every=4, report_to=["tensorboard"],
                     eval={"path": held_out, "every": 4},
                     guard={"snapshot_every": 2, "good_after_steps": 2,
                            "inject": {"nan_grad_at_step": [5, 6, 7, 11]}})
    r = train(tmp_path, spec, *(["--attempt", "1"] if attempts else []))
    assert r.returncode == 0, r.stderr
    out = str(tmp_path / "out")
    guard_lines = re.findall(r"^ballast-train: (guard (\w+) at step (\d+): .*)$", r.stderr, re.M)
    assert [(kind, int(step)) for _, kind, step in guard_lines] == [
        ("skip", 5), ("skip", 6), ("rollback", 7), ("skip", 11)], r.stderr
    assert [line["step"] for line in read_metrics(out) if "eval" not in line] == list(range(1, 13))
    assert [line["step"] for line in read_metrics(out) if "eval" in line] == [0, 4, 8, 12]
    plugins = assert_tensorboard_equals_metrics(out)
    # The skips before the rollback went with the steps it undid, as their
    # metrics.jsonl lines did; the rollback's own line is at its bad step.
    rollback, skip = guard_lines[2][0], guard_lines[3][0]
    assert guard_texts(plugins) == {"guard/rollback": [(7, rollback)], "guard/skip": [(11, skip)]}
    (first,) = os.listdir(os.path.join(out, "tensorboard"))
    assert EVENT_FILE.fullmatch(first) and f".{socket.gethostname()}." in first, first

    # A crash after step 12 and before its checkpoint: the next run resumes
    # from step 8 and reports 9..12 again, in a file of its own.
    shutil.rmtree(os.path.join(out, "checkpoints", "step-00000012"))
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(out, "tensorboard", "*"))}
    r = train(tmp_path, spec, *(["--attempt", "2"] if attempts else []))
    assert r.returncode == 0, r.stderr
    assert "resuming from checkpoint step 8" in r.stderr
    files = sorted(os.listdir(os.path.join(out, "tensorboard")))
    assert len(files) == 2 and files[0] == first and EVENT_FILE.fullmatch(files[1]), files
    # The first run's file is untouched: only its own process wrote it.
    assert all(open(p, "rb").read() == b for p, b in before.items())
    assert [line["step"] for line in read_metrics(out) if "eval" not in line] == list(range(1, 13))
    plugins = assert_tensorboard_equals_metrics(out)
    # The session start at step 9 dropped the first run's skip at 11; the
    # new process, whose injection fires again, skipped it anew.
    (skip_again,) = re.findall(r"^ballast-train: (guard \w+ at step \d+: .*)$", r.stderr, re.M)
    assert skip_again.startswith("guard skip at step 11: "), r.stderr
    assert guard_texts(plugins) == {"guard/rollback": [(7, rollback)],
                                    "guard/skip": [(11, skip_again)]}
