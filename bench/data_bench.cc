// data_bench: the data pipeline's hot parts on a corpus, for
// bench/data_pipeline.py, which runs the baselines side by side.
//
//   data_bench --tokenizer TOKENIZER_JSON --corpus TEXTS.jsonl --threads N --seq-len S
//
// Reads {"text": str} lines, then times (best of 3) encoding all of them on
// N threads, each taking a contiguous share, and best-fit-decreasing packing
// of the documents' lengths into rows of S tokens. Prints one JSON object:
// bytes, tokens, encode_s, documents, rows, pack_s, efficiency.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/train/data/packing.h"
#include "worker/train/text/tokenizer.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, corpus_path;
  int threads = 1;
  int64_t seq_len = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--tokenizer") tokenizer_path = argv[i + 1];
    if (flag == "--corpus") corpus_path = argv[i + 1];
    if (flag == "--threads") threads = std::stoi(argv[i + 1]);
    if (flag == "--seq-len") seq_len = std::stoll(argv[i + 1]);
  }
  absl::StatusOr<ballast::train::Tokenizer> tokenizer =
      ballast::train::Tokenizer::Load(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 2;
  }
  std::vector<std::string> texts;
  int64_t bytes = 0;
  std::ifstream corpus(corpus_path);
  for (std::string line; std::getline(corpus, line);) {
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    bytes += static_cast<int64_t>(texts.back().size());
  }

  std::vector<int64_t> lengths(texts.size());
  double encode_s = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    const size_t share = (texts.size() + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (size_t i = t * share; i < std::min(texts.size(), (t + 1) * share); ++i) {
          lengths[i] = static_cast<int64_t>(tokenizer->Encode(texts[i], false)->size());
        }
      });
    }
    for (std::thread& th : pool) th.join();
    encode_s = std::min(encode_s, Seconds(start));
  }
  const int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});

  for (int64_t& l : lengths) l = std::clamp<int64_t>(l, 1, seq_len);
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  double pack_s = 1e30;
  ballast::train::PackedRows rows;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    rows = ballast::train::PackBestFitDecreasing(order, lengths, seq_len);
    pack_s = std::min(pack_s, Seconds(start));
  }
  const int64_t packed = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  std::cout << nlohmann::json{{"bytes", bytes},
                              {"tokens", tokens},
                              {"encode_s", encode_s},
                              {"documents", texts.size()},
                              {"rows", rows.rows()},
                              {"pack_s", pack_s},
                              {"efficiency", static_cast<double>(packed) /
                                                 (static_cast<double>(rows.rows()) * seq_len)}}
                   .dump()
            << "\n";
  return 0;
}
