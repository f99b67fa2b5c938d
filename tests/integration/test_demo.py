"""`make demo` as the README promises it: scripts/demo run whole, on the
build that CTest is testing (its setup and build stages find everything in
place and pass through), and what it prints checked against what it did.

The demo's claims: every stage is printed with the time since the start, in
order; the job runs on two ranks; the NaN injected on rank 0 at steps 33-35
is skipped twice and rolled back to step 20 on both ranks; the job succeeds
with an adapter and a checkpoint shard per rank. The demo's folder goes to
this test's temporary folder (TMPDIR), so nothing is left behind.
"""
import os
import re
import subprocess

ROOT = os.environ.get("BALLAST_SOURCE_DIR",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.path.abspath(os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin")))

STAGES = ["setup", "build", "coordinator", "worker", "model", "submit", "watch", "result", "done"]


def run_demo(tmp_path):
    env = dict(os.environ, BUILD_DIR=os.path.dirname(BIN), TMPDIR=str(tmp_path))
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "demo")], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout
    return done.stdout


def test_demo_runs_its_job_on_two_ranks_through_the_injected_nan(tmp_path):
    out = run_demo(tmp_path)

    # "demo  m:ss stage: ...": each stage, in order, at a time that never goes back.
    stamped = [(int(m), int(s), stage) for m, s, stage in
               re.findall(r"^demo +(\d+):(\d\d) (\w+):", out, re.M)]
    assert list(dict.fromkeys(stage for _, _, stage in stamped)) == STAGES, out
    seconds = [60 * m + s for m, s, _ in stamped]
    assert seconds == sorted(seconds), out
    assert re.search(r"^demo +\d+:\d\d done: setup \d+:\d\d, build \d+:\d\d, run \d+:\d\d$",
                     out, re.M), out

    assert "attempt 1 on 2 device(s)" in out, out
    assert re.search(r"^guard skip at step 33 \[non_finite, deterministic, \S+ on rank 0", out,
                     re.M), out
    assert re.search(r"^guard skip at step 34 ", out, re.M), out
    assert re.search(r"^guard rollback at step 35 to step 20 ", out, re.M), out
    assert re.search(r"^job-\w+ SUCCEEDED$", out, re.M), out

    # The demo prints rank 1's own log of the same decisions.
    rank1 = out.split("rank 1's gradients were clean", 1)[1]
    assert re.search(r"guard skip at step 33: ", rank1), out
    assert re.search(r"guard skip at step 34: ", rank1), out
    assert re.search(r"guard rollback at step 35: .*rolled back to step 20", rank1), out

    adapter = re.search(r"the adapter is in (\S+) \(PEFT format\)", out).group(1)
    assert os.path.isfile(os.path.join(adapter, "adapter_model.safetensors")), adapter
    assert os.path.isfile(os.path.join(adapter, "adapter_config.json")), adapter
    shards = re.search(r"each rank saved its shard: (.+) in (\S+)$", out, re.M)
    assert shards.group(1).split() == ["rank-0.safetensors", "rank-1.safetensors"], out
    assert sorted(f for f in os.listdir(shards.group(2)) if f.startswith("rank-")) == \
        ["rank-0.safetensors", "rank-1.safetensors"]
    assert adapter.startswith(str(tmp_path)), adapter
