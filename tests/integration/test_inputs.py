"""Hostile and careless input through the real `ballast` CLI and ballastd
(issue 20): relative paths mean the submitter's folder, --path-root confines
paths past `..` and symlinks, and what cannot be a spec is refused at once,
with exit 2 and a message that says why. Every case but two ends at
submission, with no worker; a symlink swapped after it is refused by the
rank, and a job whose links stay inside the roots trains to the end.
docs/limits.md lists the limits."""
import json
import os
import time

import pytest

from cluster import Cluster, base_spec, make_dataset, make_model


def model_and_data(folder):
    """The files submission reads: config.json and a data file."""
    os.makedirs(os.path.join(folder, "model"), exist_ok=True)
    with open(os.path.join(folder, "model", "config.json"), "w") as f:
        json.dump({"model_type": "qwen3", "max_position_embeddings": 256, "vocab_size": 320,
                   "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4}, f)
    with open(os.path.join(folder, "data.jsonl"), "w") as f:
        f.write('{"input_ids": [1, 2, 3]}\n')


SPEC = "model: {path: %s}\ndata: {path: %s, seq_len: 64}\noptimizer: {lr: 1.0e-3}\nmax_steps: 2\n"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_relative_paths_mean_the_submitters_folder(cluster, tmp_path):
    cluster.start_coordinator()
    mine = tmp_path / "submitter"
    model_and_data(str(mine))
    spec = write(mine / "job.yaml", SPEC % ("model", "./data.jsonl"))
    # ballastd runs elsewhere; before, it looked for ./model in its own folder.
    assert os.getcwd() != str(mine)
    r = cluster.cli("submit", "job.yaml", "-o", "json", cwd=str(mine))
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["spec"]["model"]["path"] == str(mine / "model")
    assert job["spec"]["data"]["path"] == str(mine / "data.jsonl")

    # The folder the CLI runs in, not the spec file's.
    r = cluster.cli("submit", spec, cwd=str(tmp_path))
    assert r.returncode == 2
    assert f"model.path: {tmp_path}/model/config.json does not exist" in r.stderr, r.stderr


def test_path_roots_confine_paths_past_dot_dot_and_symlinks(cluster, tmp_path):
    root, outside = tmp_path / "shared", tmp_path / "private"
    model_and_data(str(root))
    model_and_data(str(outside))
    cluster.start_coordinator(extra_args=["--path-root", str(root)])
    spec = write(tmp_path / "job.yaml", SPEC % (root / "model", root / "data.jsonl"))
    r = cluster.cli("submit", spec)
    assert r.returncode == 0, r.stderr

    os.symlink(outside / "data.jsonl", root / "link.jsonl")
    os.mkdir(root / "tokenizer")
    os.symlink(outside / "model" / "config.json", root / "tokenizer" / "tokenizer.json")
    for override, named in [
        (f"data.path={outside}/data.jsonl", "data.path: "),
        (f"data.path={root}/../private/data.jsonl", "data.path: "),
        (f"data.path={root}/link.jsonl", "data.path: "),
        (f"data.tokenizer={root}/tokenizer", "data.tokenizer entry: "),
    ]:
        r = cluster.cli("submit", spec, "--set", override)
        assert r.returncode == 2, (override, r.stdout)
        assert named in r.stderr and f"is outside the path roots {root}" in r.stderr, r.stderr
    assert cluster.coordinator.alive()


def test_a_symlink_swapped_after_submission_is_refused_by_the_rank(cluster, tmp_path):
    """Submission resolved the link inside the root; by the time the job runs
    it points outside. The rank checks the paths against ballastd's roots
    again before it opens any, so the job fails, naming the path."""
    root, outside = tmp_path / "shared", tmp_path / "private"
    model_and_data(str(root))
    model_and_data(str(outside))
    os.symlink(root / "data.jsonl", root / "link.jsonl")
    cluster.start_coordinator(extra_args=["--path-root", str(root)])
    spec = write(tmp_path / "job.yaml", SPEC % (root / "model", root / "link.jsonl"))
    r = cluster.cli("submit", spec, "-o", "json")
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    # Queued (no worker yet) while the link is swapped.
    os.remove(root / "link.jsonl")
    os.symlink(outside / "data.jsonl", root / "link.jsonl")
    cluster.start_worker("w1")
    job = cluster.wait_state(job_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 120)
    assert job["state"] == "JOB_STATE_FAILED", job
    reason = job.get("failure_reason", "")
    assert "data.path: " in reason and f"is outside the path roots {root}" in reason, \
        reason + "\n" + cluster.logs()


def test_a_job_under_the_roots_trains_through_links_that_stay_inside(cluster, tmp_path):
    """The other side of the roots: a model folder of absolute symlinks into
    the root (as a hub cache's snapshot is) and a linked data file pass the
    checks at submission and in the rank, which then reads every file
    confined to the roots, and the job trains to the end."""
    root = tmp_path / "shared"
    make_model("qwen3", str(root / "blobs" / "model"), seed=1)
    make_dataset(str(root / "blobs" / "data.jsonl"), n=16, vocab=320, seed=2)
    os.makedirs(root / "snapshot")
    for name in os.listdir(root / "blobs" / "model"):
        os.symlink(root / "blobs" / "model" / name, root / "snapshot" / name)
    os.symlink(root / "blobs" / "data.jsonl", root / "data.jsonl")
    cluster.start_coordinator(extra_args=["--path-root", str(root)])
    cluster.start_worker("w1")
    job_id = cluster.submit(base_spec(str(root / "snapshot"), str(root / "data.jsonl"),
                                      max_steps=4))
    job = cluster.wait_state(job_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 120)
    assert job["state"] == "JOB_STATE_SUCCEEDED", job.get("failure_reason", "") + cluster.logs()


def test_an_output_folder_planted_as_a_link_is_refused_and_its_target_untouched(cluster,
                                                                               tmp_path):
    """Issue 33: a job's folder is OUTPUT_ROOT/ID, which its worker makes. A
    link planted there while the job was queued once led the rank's log,
    checkpoints and export into the folder it named (another job's). The
    worker refuses the link, the job fails for good (restarts 0), and the
    link's target is left as it was."""
    make_model("qwen3", str(tmp_path / "model"), seed=1)
    make_dataset(str(tmp_path / "data.jsonl"), n=16, vocab=320, seed=2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "export").mkdir()
    (victim / "export" / "weights.txt").write_text("another job's result\n")
    cluster.start_coordinator()
    job_id = cluster.submit(base_spec(str(tmp_path / "model"), str(tmp_path / "data.jsonl"),
                                      max_steps=4))
    output_dir = cluster.job(job_id)["output_dir"]
    os.makedirs(os.path.dirname(output_dir), exist_ok=True)
    os.symlink(victim, output_dir)
    cluster.start_worker("w1")
    job = cluster.wait_state(job_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 120)
    assert job["state"] == "JOB_STATE_FAILED", job
    assert int(job.get("restarts", 0)) == 0, job
    reason = job.get("failure_reason", "")
    assert f"the job's output folder {output_dir} is a symbolic link (to {victim})" in reason, \
        reason + "\n" + cluster.logs()
    assert sorted(os.listdir(victim)) == ["export"]
    assert os.listdir(victim / "export") == ["weights.txt"]


def test_a_bad_root_stops_ballastd_at_start(tmp_path):
    c = Cluster(str(tmp_path / "cluster"))
    with pytest.raises(AssertionError, match="--path-root relative/root: not an absolute path"):
        c.start_coordinator(extra_args=["--path-root", "relative/root"])
    c.stop()


def test_what_cannot_be_a_spec_is_refused_at_once(cluster, tmp_path):
    cluster.start_coordinator()
    model_and_data(str(tmp_path))
    spec = write(tmp_path / "job.yaml", SPEC % (tmp_path / "model", tmp_path / "data.jsonl"))
    huge = tmp_path / "huge.yaml"
    with open(huge, "w") as f:
        f.write("guard:\n  inject:\n    zero_tokens_at_steps:\n")
        f.write("      - 1\n" * (6 << 20))  # 60 MB: once 3.9 GB and 33 s
    os.mkfifo(tmp_path / "fifo.yaml")
    started = time.monotonic()
    cases = [
        ([str(huge)], "at most 1048576"),
        ([str(tmp_path / "fifo.yaml")], "is a FIFO"),
        ([spec, "--set", 'name="a\\e[2J\\nb"'], "name has a control character"),
        ([spec, "--set", "max_steps=010"], "has a leading zero"),
        ([spec, "--set", "method=full", "--set", "lora.lora_dropout=.nan"],
         "lora.lora_dropout = nan"),
        ([spec, "--set", "lora.init_adapter=" + str(tmp_path)], "lora.init_adapter: "),
        ([spec, "--set", "a" + ".a" * 16000 + "=1"], "spec keys have at most 8"),
    ]
    for args, message in cases:
        r = cluster.cli("submit", *args)
        assert r.returncode == 2, (message, r.stdout, r.stderr)
        assert message in r.stderr, (message, r.stderr)
    assert time.monotonic() - started < 30
    os.remove(tmp_path / "model" / "config.json")
    os.mkfifo(tmp_path / "model" / "config.json")
    r = cluster.cli("submit", spec)
    assert r.returncode == 2 and "config.json is a FIFO" in r.stderr, r.stderr
    assert cluster.coordinator.alive()


def test_a_data_path_that_is_not_a_file_on_disk_fails_without_a_restart(cluster, tmp_path):
    """Issue 33: /proc/self/mem is "regular" (size 0) and its read fails with
    EIO; the rank exited 1 and the job was retried. Now a file of /proc or
    /sys is refused at submission, and one swapped in while the job was
    queued fails the rank with exit 2: the job is FAILED, restarts 0, and
    the reason names the field and the path."""
    model_and_data(str(tmp_path))
    cluster.start_coordinator()
    spec = write(tmp_path / "job.yaml", SPEC % (tmp_path / "model", tmp_path / "link.jsonl"))
    os.symlink("/proc/self/mem", tmp_path / "link.jsonl")
    r = cluster.cli("submit", spec, "--set", "data.path=/proc/self/mem")
    assert r.returncode == 2, r.stdout
    assert "data.path: /proc/self/mem is a file of the kernel's proc file system" in r.stderr
    r = cluster.cli("submit", spec)
    assert r.returncode == 2 and "kernel's proc file system" in r.stderr, r.stderr

    os.remove(tmp_path / "link.jsonl")
    os.symlink(tmp_path / "data.jsonl", tmp_path / "link.jsonl")
    r = cluster.cli("submit", spec, "-o", "json")
    assert r.returncode == 0, r.stderr
    job_id = json.loads(r.stdout)["id"]
    os.remove(tmp_path / "link.jsonl")
    os.symlink("/proc/self/mem", tmp_path / "link.jsonl")
    worker = cluster.start_worker("w1")
    job = cluster.wait_state(job_id, ("JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"), 120)
    assert job["state"] == "JOB_STATE_FAILED", job
    assert int(job.get("restarts", 0)) == 0, job
    reason = job.get("failure_reason", "")
    assert f"data.path: {tmp_path}/link.jsonl is a file of the kernel's proc file system" \
        in reason, reason + "\n" + cluster.logs()
    assert f"rank 0 of {job_id} attempt 1 exited with code 2" in worker.output()
