"""The README's five-minute tour, run as a new user would. The commands are
read from README.md's text, so the README and this test cannot drift apart.

Every command runs as written, from the repository root, except where a
shared test machine makes that impossible. These are all the substitutions:
- `build/bin/` becomes BALLAST_BIN_DIR, the build that CTest is testing.
- `ballastd &` gets `--listen 127.0.0.1:0 --http 127.0.0.1:0 --ready-file F`:
  the tour's default ports (50051, 9090) may be held by another ballastd on
  this machine, and two runs of this test must not meet. The worker and the
  CLI then find it through BALLAST_COORDINATOR, which they document, and
  `localhost:9090` in the curl becomes the HTTP address ballastd bound.
- The example job id in the README becomes the id that `submit` printed.
- XDG_STATE_HOME is a temporary folder, so the store and the worker's folder
  are this test's and not the user's ~/.local/state/ballast.
`scripts/tiny-model build/tiny` writes the checkout's git-ignored build/tiny,
as it does for a user; it writes the same files every time.

Everything started here is stopped when the test ends, on failure too.

Beside the tour: every relative link of README.md and docs/*.md leads to a
file inside the repository.
"""
import glob
import json
import os
import re
import shlex
import subprocess

from cluster import Process, wait_for

ROOT = os.environ.get("BALLAST_SOURCE_DIR",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN = os.path.abspath(os.environ.get("BALLAST_BIN_DIR", os.path.join(ROOT, "build", "bin")))


def tour_block():
    """The first ```sh block of the README's "Five-minute tour" section."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)\n```", section, re.S).group(1)


def tour_commands(block):
    """(command, its trailing comment) for each line that is not an output
    line (those start with #)."""
    commands = []
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"(.*?)\s{2,}#\s*(.*)", line)
        command, comment = (m.group(1), m.group(2)) if m else (line, "")
        commands.append((command.strip(), comment.strip()))
    return commands


def read_ready(process, path):
    """ballastd's ready file once written; fails if ballastd has exited."""
    assert process.alive(), "ballastd exited:\n" + process.output()
    return json.loads(path.read_text()) if path.exists() else None


def test_readme_tour_runs_as_written(tmp_path, monkeypatch):
    block = tour_block()
    commands = tour_commands(block)
    example_id = re.search(r"^#\s+submitted (job-[0-9a-f]+)$", block, re.M).group(1)
    example_step = re.search(r"^#\s+(step \d+/\d+ .*)$", block, re.M).group(1)
    # The relative paths of the tour (build/bin, build/tiny, examples/) are the
    # repository root's, for the processes started below too.
    monkeypatch.chdir(ROOT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("BALLAST_COORDINATOR", "BALLAST_TOKEN")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    background, outputs = [], {}
    job_id = http = None
    try:
        for command, comment in commands:
            command = command.replace("build/bin/", BIN + "/")
            if command.endswith("&"):
                argv = shlex.split(command[:-1])
                name = os.path.basename(argv[0])
                ready = tmp_path / "ready.json"
                if name == "ballastd":
                    argv += ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                             "--ready-file", str(ready)]
                process = Process(argv, str(tmp_path / f"{name}.log"), env=dict(env))
                background.append(process)
                if name == "ballastd":
                    info = wait_for(lambda: read_ready(process, ready), 30, "ballastd's ready file")
                    env["BALLAST_COORDINATOR"], http = info["grpc"], info["http"]
                continue
            if job_id is not None:
                command = command.replace(example_id, job_id)
            if http is not None:
                command = command.replace("localhost:9090", http)
            r = subprocess.run(["bash", "-o", "pipefail", "-c", command], env=env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, f"`{command}` exited {r.returncode}:\n{r.stdout}{r.stderr}"
            subcommand = shlex.split(command)[1] if command.startswith(BIN) else command.split()[0]
            outputs[subcommand] = (r.stdout, comment)
            if subcommand == "submit":
                job_id = re.fullmatch(r"submitted (job-[0-9a-f]+)\n", r.stdout).group(1)

        assert [os.path.basename(p.argv[0]) for p in background] == ["ballastd", "ballast-worker"]
        assert job_id is not None, "the tour submits no job"

        # watch exits 0 only when the job succeeded; its step lines have the
        # README's fields in the README's order, up to the step count --set gave.
        max_steps = re.search(r"--set max_steps=(\d+)", block).group(1)
        watched, _ = outputs["watch"]
        fields = [w for w in example_step.split() if re.fullmatch(r"[A-Za-z_/]+", w)]
        last = [line for line in watched.splitlines() if line.startswith("step ")][-1]
        assert [w for w in last.split() if re.fullmatch(r"[A-Za-z_/]+", w)] == fields, last
        assert last.startswith(f"step {max_steps}/{max_steps} "), last

        # list prints the columns the README's comment names, and the job.
        listed, columns = outputs["list"]
        assert listed.splitlines()[0].split() == columns.split(), listed
        row = next(line for line in listed.splitlines() if line.startswith(job_id))
        assert "SUCCEEDED" in row.split(), row

        metrics, _ = outputs["curl"]
        assert re.search(rf'^ballast_job_loss{{job_id="{job_id}"}} \S+$', metrics, re.M), metrics
    except BaseException:
        for process in background:
            print(f"==== {process.log_path}\n{process.output()[-6000:]}")
        raise
    finally:
        for process in reversed(background):
            process.stop()


def relative_links(path):
    """The targets of path's markdown links that are not URLs or anchors, with
    any #anchor cut off; code blocks and `code spans` are not links."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#", 1)[0] for t in targets
            if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_relative_links_of_the_readme_and_docs_resolve_inside_the_repository():
    root = os.path.realpath(ROOT)
    pages = [os.path.join(ROOT, "README.md"),
             *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    broken = []
    # The README links docs/: a pattern that found no link would pass anything.
    assert "docs/design.md" in relative_links(pages[0])
    for page in pages:
        for target in relative_links(page):
            resolved = os.path.realpath(os.path.join(os.path.dirname(page), target))
            if not resolved.startswith(root + os.sep) or not os.path.exists(resolved):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert not broken, "links that leave the repository or lead nowhere:\n" + "\n".join(broken)
