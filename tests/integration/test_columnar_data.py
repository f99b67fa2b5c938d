"""Parquet and Arrow data sets as a user gives them to ballast-train (issue
34, item 1): a .parquet file, a folder of shards, a datasets.save_to_disk
folder, and data.columns. The same records as JSONL and as columns give
byte-identical token caches and the same step-1 loss; bad files exit 2
naming file, column and row. Files are written with pyarrow; the
save_to_disk folder is laid out as datasets 4.x writes it (Arrow IPC stream
shards, state.json, dataset_info.json), since the datasets package is not
installed here. Records are drawn fresh each run (the seed is printed)."""
import json
import os
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
from columnar_files import tokenize_peak_rss, write_text_parquet  # noqa: E402
from reference import TRAIN, base_spec, make_model, read_metrics, write_spec  # noqa: E402
from test_chat_template import QWEN3  # noqa: E402
from trained_tokenizers import write_chat_tokenizer  # noqa: E402

SEED = int.from_bytes(os.urandom(4), "little")
# The smaller file of the memory test: 500-row groups of 4 KB rows, 4 of them.
SMALL_BYTES = 8 << 20
WORDS = ["the", "cat", "sat", "on", "a", "mat", "2+2", "is", "4", "héllo", "wörld", "why", "so"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "model")
    make_model("qwen3", path, seed=1)
    write_chat_tokenizer(path, QWEN3)
    return path


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))


def chats(n, rng):
    """Chats of 1-2 exchanges; some assistant turns reason, most do not (a
    null in the parquet struct, an absent key in JSONL)."""
    records = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": sentence(rng)})
        for _ in range(rng.randint(1, 2)):
            messages.append({"role": "user", "content": sentence(rng)})
            answer = {"role": "assistant", "content": sentence(rng)}
            if rng.random() < 0.4:
                answer["reasoning_content"] = sentence(rng)
            messages.append(answer)
        records.append({"messages": messages})
    return records


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def train(model, data_path, out, max_steps=1, **spec):
    spec.setdefault("schedule", {"kind": "cosine", "warmup_steps": 0})
    write_spec(out + ".yaml", **base_spec(model, data_path, max_steps=max_steps, **spec))
    return subprocess.run([TRAIN, "--spec", out + ".yaml", "--out", out], capture_output=True,
                          text=True, timeout=600)


def cache_files(out):
    folder = os.path.join(out, "data-cache")
    files = {name: open(os.path.join(folder, name), "rb").read()
             for name in ("documents.ids", "documents.labels", "documents.index")}
    files["statistics"] = json.load(open(os.path.join(folder, "cache.json")))["statistics"]
    return files


def assert_same_training(model, tmp_path, jsonl, columnar, columns=None, **spec):
    a, b = str(tmp_path / "jsonl"), str(tmp_path / "columnar")
    ra = train(model, jsonl, a, **spec)
    assert ra.returncode == 0, ra.stderr
    if columns:
        spec["data"] = {**spec["data"], "columns": columns}
    rb = train(model, columnar, b, **spec)
    assert rb.returncode == 0, rb.stderr
    assert cache_files(a) == cache_files(b), f"seed {SEED}"
    # Bit-identical documents in the same order: the same first step.
    assert read_metrics(a)[0]["loss"] == read_metrics(b)[0]["loss"], f"seed {SEED}"
    return rb


def test_parquet_chats_train_as_their_jsonl_does(model, tmp_path):
    rng = random.Random(SEED)
    records = chats(24, rng)
    write_jsonl(tmp_path / "chats.jsonl", records)
    # Row groups of 5: a record batch never lines up with the token cache's chunks.
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "chats.parquet", row_group_size=5)
    r = assert_same_training(model, tmp_path, str(tmp_path / "chats.jsonl"),
                             str(tmp_path / "chats.parquet"),
                             data={"seq_len": 256, "packing": True})
    assert "as messages (detected from its first record)" in r.stderr


def test_a_save_to_disk_folder_with_renamed_columns_trains_as_jsonl_does(model, tmp_path):
    rng = random.Random(SEED + 1)
    pairs = [{"prompt": sentence(rng), "completion": sentence(rng)} for _ in range(20)]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    # datasets.save_to_disk's layout: IPC stream shards of record batches,
    # listed in state.json, the features in dataset_info.json.
    folder = tmp_path / "saved"
    folder.mkdir()
    table = pa.Table.from_pylist([{"id": i, "question": p["prompt"], "answer": p["completion"]}
                                  for i, p in enumerate(pairs)])
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for name, part in zip(names, [table.slice(0, 12), table.slice(12)]):
        with pa.ipc.new_stream(folder / name, part.schema) as writer:
            writer.write_table(part, max_chunksize=5)
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": n} for n in names], "_fingerprint": "0",
         "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
         "_output_all_columns": False, "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {
        "id": {"dtype": "int64", "_type": "Value"},
        "question": {"dtype": "string", "_type": "Value"},
        "answer": {"dtype": "string", "_type": "Value"}}}))
    assert_same_training(model, tmp_path, str(tmp_path / "pairs.jsonl"), str(folder),
                         columns={"prompt": "question", "completion": "answer"},
                         data={"seq_len": 256})


def test_mteb_reranking_parquet_trains_as_its_jsonl_does(model, tmp_path):
    """scidocs-reranking's shape: query, positive and negative lists of strings."""
    rng = random.Random(SEED + 2)
    groups = [{"query": sentence(rng), "positive": [sentence(rng)],
               "negative": [sentence(rng) for _ in range(rng.randint(1, 3))]} for _ in range(12)]
    write_jsonl(tmp_path / "groups.jsonl", groups)
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(groups[:7]), shards / "train-00000.parquet")
    pq.write_table(pa.Table.from_pylist(groups[7:]), shards / "train-00001.parquet")
    assert_same_training(
        model, tmp_path, str(tmp_path / "groups.jsonl"), str(shards),
        task="generative_reranker", data={"seq_len": 256, "packing": True, "truncate": "cut"},
        reranker={"prefix": "<|im_start|>", "instruction": "f", "suffix": "<|im_end|>\n",
                  "yes_token": "y", "no_token": "n"})


def bad_files(tmp_path):
    """(file, data.columns, what the error must say) for each kind of bad input."""
    ok = pa.table({"text": [f"document {i}" for i in range(40)]})
    pq.write_table(ok, tmp_path / "ok.parquet", row_group_size=10)
    whole = (tmp_path / "ok.parquet").read_bytes()
    cases = []
    path = tmp_path / "null.parquet"
    pq.write_table(pa.table({"text": ["a b", "c d", None, "e f"]}), path, row_group_size=2)
    cases.append((path, {}, [f"{path}: row 2: column 'text' is null"]))
    path = tmp_path / "type.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    cases.append((path, {}, [str(path), "column 'text'", "is int64", "must be a string"]))
    path = tmp_path / "missing.parquet"
    pq.write_table(pa.table({"body": ["a b"]}), path)
    cases.append((path, {"text": "content"}, [str(path), "no column 'content'",
                                               "data.columns.text"]))
    path = tmp_path / "footer.parquet"
    path.write_bytes(whole[:-8] + b"\xff\xff\xff\x7f" + whole[-4:])
    cases.append((path, {}, [str(path), "not a readable parquet file"]))
    path = tmp_path / "cut.parquet"
    path.write_bytes(whole[:len(whole) // 2])
    cases.append((path, {}, [str(path), "not a readable parquet file"]))
    return cases


def test_bad_files_exit_2_naming_file_column_and_row(model, tmp_path):
    for i, (path, columns, words) in enumerate(bad_files(tmp_path)):
        r = train(model, str(path), str(tmp_path / f"out{i}"),
                  data={"seq_len": 64, "format": "text", **({"columns": columns} if columns else {})})
        assert r.returncode == 2, (path, r.stderr)
        for word in words:
            assert word in r.stderr, (path, word, r.stderr)
    # data.columns renames columns; a JSONL file's records keep their keys.
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text('{"text": "a b"}\n')
    r = train(model, str(jsonl), str(tmp_path / "out-jsonl"),
              data={"seq_len": 64, "columns": {"text": "body"}})
    assert r.returncode == 2, r.stderr
    assert "data.columns" in r.stderr and str(jsonl) in r.stderr


def test_peak_rss_does_not_grow_with_the_file(model, tmp_path):
    """Two files 20x apart, in the same row groups: if the reader held the
    file (or its decoded text), the larger run's peak RSS would grow by at
    least the text added, SMALL_BYTES x 19. It may grow by half of that: the
    token cache's index (40 bytes a document, mapped as the dataset reads it)
    and the allocators' drift, which alone moves a run's ~530 MiB peak by
    +-30 MiB from run to run (a 10x pair's 36 MiB bound failed in CI). Rows
    of 4 KB keep the documents few. bench/parquet_rss.py measures 2 GB once
    (docs/data.md)."""
    peaks = {}
    for name, size in [("small", SMALL_BYTES), ("large", 20 * SMALL_BYTES)]:
        data = str(tmp_path / f"{name}.parquet")
        write_text_parquet(data, size, row_group_rows=500, row_bytes=4000)
        code, err, peaks[name] = tokenize_peak_rss(model, data, str(tmp_path / name))
        assert code == 0, err
    growth = peaks["large"] - peaks["small"]
    print(f"peak RSS {peaks['small'] / 2**20:.0f} MiB, then {peaks['large'] / 2**20:.0f} MiB "
          f"on 20x the data")
    assert growth < 19 * SMALL_BYTES / 2, peaks
