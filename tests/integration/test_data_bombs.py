"""Data files built to hurt (issue 33), through ballast-train as a user runs
it: each gets bounded time and memory, and a clear error or the right
documents. Each check measures the child's wall time and peak RSS
(wait4's ru_maxrss) against a data-check of three good lines in the same
run, and the bounds are generous, for a loaded machine; docs/limits.md
("Data") has the figures measured."""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
from reference import TRAIN, base_spec, write_spec  # noqa: E402
from test_data_pipeline import model  # noqa: E402,F401 (the tiny qwen3 with its tokenizer)

# Over a data-check of three lines.
EXTRA_RSS_MIB = 512
SECONDS = 120

# Runs argv and prints its peak RSS last on stderr. A child forked from
# pytest would count pytest's own RSS at the fork (LibTorch, the test's
# data) in its ru_maxrss, so the measured command is forked from this small
# process instead.
MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"peak_rss_kib {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.fixture(scope="module")
def check(model, tmp_path_factory):
    """Runs data-check on a data file; asserts the bounds against a baseline
    measured here, and returns (exit code, stdout + stderr)."""
    folder = tmp_path_factory.mktemp("spec")
    spec = str(folder / "job.yaml")

    def run(data, *sets):
        write_spec(spec, **base_spec(model, data, max_steps=4))
        argv = ["data-check", "--spec", spec] + [a for s in sets for a in ("--set", s)]
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-c", MEASURE, TRAIN, *argv], capture_output=True,
                           text=True, timeout=600)
        seconds = time.monotonic() - started
        err, _, peak = r.stderr.rpartition("peak_rss_kib ")
        return r.returncode, r.stdout + err, seconds, int(peak) / 1024

    good = str(folder / "good.jsonl")
    with open(good, "w") as f:
        f.write('{"text": "one two"}\n' * 3)
    code, text, _, base_rss = run(good)
    assert code == 0, text

    def bounded(data, *sets, extra_rss_mib=EXTRA_RSS_MIB):
        code, text, seconds, rss = run(data, *sets)
        print(f"{os.path.basename(data)} {sets}: exit {code}, {seconds:.1f} s, "
              f"peak RSS {rss:.0f} MiB (baseline {base_rss:.0f} MiB)")
        assert seconds < SECONDS, (seconds, text)
        assert rss - base_rss < extra_rss_mib, (rss, base_rss, text)
        return code, text

    return bounded


def test_a_record_with_a_nul_byte_after_it_is_a_bad_record(check, tmp_path):
    data = str(tmp_path / "nul.jsonl")
    with open(data, "wb") as f:
        f.write(b'{"text": "hello world"}\x00\n' * 5 + b'{"text": "x y"}\x00garbage\n')
    code, text = check(data)
    assert code == 2, text
    assert f"{data}:1: a NUL byte at byte 24" in text
    # Skipped, each is counted (with the format given: a bad first record
    # cannot tell it); a file of nothing else has nothing to train on.
    code, text = check(data, "data.on_bad_record=skip", "data.format=text")
    assert code == 2, text
    assert "no documents to train on (6 records, 6 skipped as bad" in text
    with open(data, "ab") as f:
        f.write(b'{"text": "good one"}\n')
    code, text = check(data, "data.on_bad_record=skip", "data.format=text")
    assert code == 0, text
    assert "records 7, documents 1, bad records skipped 6" in text
    assert f"bad record: {data}:1: a NUL byte at byte 24" in text


def test_a_million_one_token_lines(check, tmp_path):
    data = str(tmp_path / "lines.jsonl")
    with open(data, "w") as f:
        f.write('{"text": "a"}\n' * 10**6)
    code, text = check(data)
    assert code == 0, text
    assert "records 1000000, documents 1000000" in text
    assert "tokens 2000000, trained 1000000" in text  # "a" and EOS each


def test_long_lines_are_held_a_few_at_a_time(check, tmp_path):
    """768 lines of 512 KiB: chunks of 256 lines held 384 MiB of text in
    flight (+359 MiB peak); a chunk now ends at 1 MiB too."""
    data = str(tmp_path / "long.jsonl")
    with open(data, "w") as f:
        f.write('{"text": "a b"}\n')
        f.write(('{"note": "' + "x" * (512 << 10) + '"}\n') * 768)
    code, text = check(data, "data.format=text", "data.on_bad_record=skip",
                       extra_rss_mib=128)
    assert code == 0, text
    assert "records 769, documents 1, bad records skipped 768" in text


def test_a_chat_of_a_hundred_thousand_turns(check, tmp_path):
    data = str(tmp_path / "turns.jsonl")
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
             for i in range(10**5)]
    with open(data, "w") as f:
        f.write(json.dumps({"messages": turns}) + "\n")
    code, text = check(data)
    assert code == 2, text
    assert f"{data}:1: the document has 1150006 tokens, more than data.seq_len = 64" in text
    code, text = check(data, "data.truncate=cut")
    assert code == 0, text
    assert "records 1, documents 1, bad records skipped 0, cut 1" in text


def test_a_record_nested_a_hundred_thousand_deep(check, tmp_path):
    data = str(tmp_path / "deep.jsonl")
    n = 10**5
    with open(data, "w") as f:
        f.write('{"text": "a b"}\n')
        f.write('{"text": "a b", "x": ' + "[" * n + "]" * n + "}\n")
        # As deep as the line limit (16 MiB) allows: once 500 MiB to parse.
        n = (8 << 20) - 64
        f.write('{"text": "a b", "x": ' + "[" * n + "]" * n + "}\n")
    code, text = check(data, "data.on_bad_record=skip")
    assert code == 0, text
    assert "records 3, documents 1, bad records skipped 2" in text
    assert f"{data}:2: the record nests deeper than 128 levels (at byte 149)" in text


def test_invalid_utf8_in_a_string_is_a_bad_record_that_says_so(check, tmp_path):
    data = str(tmp_path / "utf8.jsonl")
    with open(data, "wb") as f:
        f.write(b'{"text": "fine text"}\n{"text": "bad \xff\xfe byte"}\n'
                b'{"text": "overlong \xc0\xaf"}\n{"text": "lone \\ud800 surrogate"}\n')
    code, text = check(data)
    assert code == 2, text
    assert f"{data}:2: not a JSON object: at byte 15, syntax error while parsing value - " \
           "invalid string: ill-formed UTF-8 byte" in text
    code, text = check(data, "data.on_bad_record=skip")
    assert code == 0, text
    assert "records 4, documents 1, bad records skipped 3" in text
    assert "surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF" in text


def test_a_file_that_grows_while_it_is_read_ends_with_an_error(check, tmp_path):
    """Before, a file appended to faster than it was tokenized was read until
    the writer stopped."""
    data = str(tmp_path / "growing.jsonl")
    block = '{"text": "a b c"}\n' * 4096
    with open(data, "w") as f:
        f.write(block * 50)
    done = threading.Event()

    def append():
        deadline = time.monotonic() + 60
        with open(data, "a") as f:
            while not done.is_set() and time.monotonic() < deadline:
                f.write(block)
                f.flush()
                time.sleep(0.005)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        code, text = check(data)
    finally:
        done.set()
        writer.join()
    assert code == 2, text
    assert re.search(f"data.path: {re.escape(data)} changed while it was read: "
                     r"\d+ bytes when it was opened, \d+ now", text), text


def test_a_data_file_deleted_mid_job(model, tmp_path):
    """The running job reads its token cache, never the file again, and
    trains to the end; a restart of it checks the file again and fails,
    saying it is gone."""
    data = str(tmp_path / "data.jsonl")
    with open(data, "w") as f:
        for i in range(64):
            f.write(json.dumps({"text": f"line {i} of the data"}) + "\n")
    spec = str(tmp_path / "job.yaml")
    write_spec(spec, **base_spec(model, data, max_steps=30))
    out = str(tmp_path / "out")
    p = subprocess.Popen([TRAIN, "--spec", spec, "--out", out], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.monotonic() + 300
    while not (os.path.exists(metrics) and os.path.getsize(metrics) > 0):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    os.remove(data)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    assert "tokenized into the job's token cache" in err
    steps = [json.loads(line) for line in open(metrics)]
    assert steps[-1]["step"] == 30

    r = subprocess.run([TRAIN, "--spec", spec, "--out", out], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr
    assert f"data.path: {data} does not exist" in r.stderr
