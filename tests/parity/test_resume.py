"""(g) A run killed after step 7, with a checkpoint every 5 steps, resumes from
step 5: steps 6-20 equal those of the uninterrupted run."""
import os
import signal
import subprocess
import time

from reference import (TRAIN, base_spec, make_dataset, make_model, read_metrics, relative_error,
                       run_train, write_spec)


def test_resume_after_kill_matches_uninterrupted_run(tmp_path):
    model_dir, data = str(tmp_path / "model"), str(tmp_path / "data.jsonl")
    make_model("qwen3", model_dir, seed=12)
    make_dataset(data, n=24, vocab=320, seed=13)
    # Dropout and shuffling on, so that RNG state and data position must both
    # come back from the checkpoint.
    # Step 5's checkpoint is good once step 6 is clean (guard.good_after_steps),
    # before the kill.
    spec = base_spec(model_dir, data, checkpoint_every=5, lora={"lora_dropout": 0.1},
                     data={"shuffle": True}, guard={"good_after_steps": 1})
    write_spec(tmp_path / "job.yaml", **spec)
    run_train(str(tmp_path / "job.yaml"), str(tmp_path / "full"))
    full = read_metrics(str(tmp_path / "full"))

    out = str(tmp_path / "killed")
    proc = subprocess.Popen([TRAIN, "--spec", str(tmp_path / "job.yaml"), "--out", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 7:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    done = len(read_metrics(out))
    assert 7 <= done < 10, f"killed after step {done}; the test needs a kill before step 10"
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["step-00000005"]

    run_train(str(tmp_path / "job.yaml"), out)
    resumed = read_metrics(out)
    assert [m["step"] for m in resumed] == list(range(1, 21))
    # Same ops on the same restored state: equal up to rounding.
    assert relative_error([m["loss"] for m in resumed[5:]], [m["loss"] for m in full[5:]]) <= 1e-6
    assert relative_error([m["grad_norm"] for m in resumed[5:]],
                          [m["grad_norm"] for m in full[5:]]) <= 1e-6
