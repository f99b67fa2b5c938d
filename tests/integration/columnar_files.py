"""Large parquet files of text, written a row group at a time so that the
writer holds one, and ballast-train's peak RSS while it tokenizes one: what
test_columnar_data's bounded-memory test and bench/parquet_rss.py share."""
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "parity"))
from reference import TRAIN, base_spec, run_measuring_rss, write_spec  # noqa: E402

# Random bytes as lowercase words: incompressible enough that the file's
# size is about its text's.
_LETTERS = bytes((ord(" ") if b % 7 == 0 else ord("a") + b % 26) for b in range(256))


def write_text_parquet(path, text_bytes, row_group_rows, row_bytes=1000):
    """About text_bytes of {"text": ...} rows of row_bytes each, in row groups
    of row_group_rows. Returns the number of rows."""
    rows = max(1, text_bytes // row_bytes)
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, row_group_rows):
            n = min(row_group_rows, rows - start)
            blob = os.urandom(n * row_bytes).translate(_LETTERS).decode()
            texts = [blob[i * row_bytes:(i + 1) * row_bytes] for i in range(n)]
            writer.write_table(pa.table({"text": texts}, schema=schema))
    return rows


def tokenize_peak_rss(model, data, out):
    """Runs a one-step job on `data` (text, every document cut to 64 tokens,
    so the cache stays small while every row is tokenized whole) into `out`;
    returns (exit code, stderr, peak RSS in bytes)."""
    write_spec(out + ".yaml", **base_spec(model, data, max_steps=1,
                                          schedule={"kind": "cosine", "warmup_steps": 0},
                                          data={"seq_len": 64, "format": "text",
                                                "truncate": "cut"}))
    code, _, err, peak = run_measuring_rss([TRAIN, "--spec", out + ".yaml", "--out", out])
    return code, err, peak
