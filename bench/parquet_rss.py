"""Benchmark: tokenizing a large parquet file holds a row group, not the file
(issue 34, item 1). Writes GIGABYTES of text rows (1 KB each, row groups of
ROW_GROUP_ROWS) with pyarrow, runs a one-step ballast-train job on it (data
format text, every document tokenized whole and cut to 64 tokens, so the
token cache stays small), and prints the file's size, the wall time and
ballast-train's peak RSS. Goal: under 1 GiB for 2 GB. The tiny test model
and its trained tokenizer stand in for a real one: the reader's memory does
not depend on the vocabulary.

    python3 bench/parquet_rss.py [--gigabytes 2] [--row-group-rows 20000]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
from columnar_files import tokenize_peak_rss, write_text_parquet  # noqa: E402
from reference import make_model  # noqa: E402
from test_chat_template import QWEN3  # noqa: E402
from trained_tokenizers import write_chat_tokenizer  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--row-group-rows", type=int, default=20000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="parquet-rss-")
    try:
        model = os.path.join(work, "model")
        make_model("qwen3", model, seed=1)
        write_chat_tokenizer(model, QWEN3)
        data = os.path.join(work, "data.parquet")
        rows = write_text_parquet(data, int(args.gigabytes * 1e9), args.row_group_rows)
        start = time.monotonic()
        code, err, peak = tokenize_peak_rss(model, data, os.path.join(work, "out"))
        seconds = time.monotonic() - start
        if code != 0:
            sys.exit(f"ballast-train failed ({code}):\n{err}")
        print(f"parquet_rss/{os.path.getsize(data) / 1e9:.2f} GB, {rows} rows, row groups of "
              f"{args.row_group_rows}: peak RSS {peak / 2**20:.0f} MiB, {seconds:.0f} s "
              f"({os.path.getsize(data) / 1e6 / seconds:.1f} MB/s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
