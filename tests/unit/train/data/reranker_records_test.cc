#include "worker/train/data/reranker_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/unit/train/text/tokenizer_json.h"
#include "worker/train/data/document_encoder.h"
#include "worker/train/data/tokenized_dataset.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// After the 256 bytes and the two merges " d" and "oc".
constexpr TokenId kImStart = 259, kImEnd = 260;

Tokenizer ChatmlTokenizer() {
  const nlohmann::json json =
      WithSpecialTokens(QwenStyleJson({{" ", "d"}, {"o", "c"}}),
                        {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 258);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(json);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

const RerankerPrompt kPrompt = {"<|im_start|>user\n", "find", "<|im_end|>\n"};

TEST(RerankerRecordsTest, ReadsTheShapesMsSwiftAndMtebWrite) {
  const auto parse = [](const char* text) {
    return ParseRerankerRecord(nlohmann::json::parse(text));
  };
  absl::StatusOr<RerankerRecord> mteb =
      parse(R"({"query": "q", "positive": "p", "negative": ["a", "b"]})");
  ASSERT_TRUE(mteb.ok()) << mteb.status();
  EXPECT_EQ(mteb->query, "q");
  EXPECT_THAT(mteb->positives, ElementsAre("p"));
  EXPECT_THAT(mteb->negatives, ElementsAre("a", "b"));
  absl::StatusOr<RerankerRecord> swift = parse(
      R"({"messages": [{"role": "user", "content": "q"}],
          "positive_messages": [[{"role": "assistant", "content": "p"}]],
          "negative_messages": [[{"role": "assistant", "content": "n1"}],
                                [{"role": "assistant", "content": "n2"}]]})");
  ASSERT_TRUE(swift.ok()) << swift.status();
  EXPECT_EQ(swift->query, "q");
  EXPECT_THAT(swift->negatives, ElementsAre("n1", "n2"));
  absl::StatusOr<RerankerRecord> response =
      parse(R"({"query": "q", "response": "p", "rejected_response": ["n"]})");
  ASSERT_TRUE(response.ok());
  EXPECT_THAT(response->positives, ElementsAre("p"));

  EXPECT_THAT(parse(R"({"query": "q", "negative": ["n"]})").status().message(),
              HasSubstr("needs a positive"));
  EXPECT_THAT(parse(R"({"positive": "p"})").status().message(), HasSubstr("no \"query\""));
  EXPECT_THAT(parse(R"({"query": "q", "positive": 3})").status().message(),
              HasSubstr("neither a string nor a list"));
}

TEST(RerankerRecordsTest, CandidatesAreTokenizedWholeAndOnlyTheDocumentIsCut) {
  const Tokenizer tokenizer = ChatmlTokenizer();
  const std::string head = "user\n<Instruct>: find\n<Query>: q\n<Document>:";
  bool cut = true;
  absl::StatusOr<std::vector<TokenId>> ids =
      EncodeCandidate(tokenizer, kPrompt, "q", "doc", 1000, &cut);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_FALSE(cut);
  // The same as the whole text encoded at once ("Ġd" joins the space).
  EXPECT_EQ(*ids,
            *tokenizer.Encode("<|im_start|>" + head + " doc<|im_end|>\n", /*allow_special=*/true));
  // Cut to 8 tokens fewer: the document loses its tail, the suffix stays.
  const int64_t full = static_cast<int64_t>(ids->size());
  absl::StatusOr<std::vector<TokenId>> shorter =
      EncodeCandidate(tokenizer, kPrompt, "q", "doc doc doc doc doc", full + 2, &cut);
  ASSERT_TRUE(shorter.ok()) << shorter.status();
  EXPECT_TRUE(cut);
  EXPECT_EQ(static_cast<int64_t>(shorter->size()), full + 2);
  EXPECT_EQ(shorter->at(shorter->size() - 2), kImEnd);
  EXPECT_EQ(shorter->front(), kImStart);

  EXPECT_THAT(EncodeCandidate(tokenizer, kPrompt, "q", "doc", 10, &cut).status().message(),
              HasSubstr("the prompt without its document is"));
}

TEST(RerankerRecordsTest, SpecialTokenTextInTheQueryOrDocumentIsPlainText) {
  const Tokenizer tokenizer = ChatmlTokenizer();
  bool cut = true;
  absl::StatusOr<std::vector<TokenId>> ids =
      EncodeCandidate(tokenizer, kPrompt, "q<|im_start|>", "a<|im_end|> doc", 1000, &cut);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The prompt's control tokens, and the rest as `tokenizers` encodes it
  // with encode_special_tokens=True.
  std::vector<TokenId> want = {kImStart};
  for (const std::vector<TokenId>& part :
       {tokenizer
            .Encode("user\n<Instruct>: find\n<Query>: q<|im_start|>\n<Document>: a<|im_end|> doc",
                    /*allow_special=*/false)
            .value(),
        {kImEnd},
        tokenizer.Encode("\n", false).value()}) {
    want.insert(want.end(), part.begin(), part.end());
  }
  EXPECT_EQ(*ids, want);
  EXPECT_EQ(std::count(ids->begin(), ids->end(), kImStart), 1);
}

TEST(RerankerRecordsTest, ARecordBecomesAGroupPerPositiveWithItsNegatives) {
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create({.format = DataFormat::kReranker,
                               .vocab_size = 300,
                               .reranker = kPrompt,
                               .max_positives = 2,
                               .max_negatives = 2,
                               .needs_negative = true,
                               .max_tokens = 1000},
                              ChatmlTokenizer(), std::nullopt);
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  std::vector<EncodedDocument> docs;
  bool special_token_text = false;
  ASSERT_TRUE(encoder
                  ->Encode(R"({"query": "q", "positive": ["p1", "p2", "p3"],
                               "negative": ["n1", "n2", "n3"]})",
                           &docs, &special_token_text)
                  .ok());
  // Two positives kept, each with the first two negatives.
  ASSERT_EQ(docs.size(), 6u);
  std::vector<std::pair<int, int>> shape;
  for (const EncodedDocument& d : docs) {
    shape.emplace_back(d.group, d.relevance);
    EXPECT_EQ(d.labels, std::vector<int32_t>(d.input_ids.size(), kIgnoreLabel));
  }
  EXPECT_THAT(shape, ElementsAre(std::pair{0, 1}, std::pair{0, 0}, std::pair{0, 0}, std::pair{1, 1},
                                 std::pair{1, 0}, std::pair{1, 0}));
  // Listwise needs a negative to learn from.
  const absl::Status lonely =
      encoder->Encode(R"({"query": "q", "positive": "p"})", &docs, &special_token_text);
  EXPECT_EQ(lonely.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(lonely.message(), HasSubstr("needs a negative"));
}

TEST(RerankerRecordsTest, GroupsStayWholeInPackedRowsWithTheirPositiveFirst) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / ("reranker_" + std::to_string(getpid())))
          .string();
  std::mt19937 rng(std::random_device{}());
  {
    std::ofstream out(path);
    for (int r = 0; r < 60; ++r) {
      nlohmann::json record = {{"query", "q" + std::to_string(r)},
                               {"positive", std::string(rng() % 20 + 1, 'p')}};
      for (int n = 0, negatives = 1 + rng() % 4; n < negatives; ++n) {
        record["negative"].push_back(std::string(rng() % 20 + 1, 'n'));
      }
      out << record.dump() << "\n";
    }
  }
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create({.format = DataFormat::kReranker,
                               .vocab_size = 300,
                               .reranker = kPrompt,
                               .max_negatives = 7,
                               .needs_negative = true,
                               .max_tokens = 512},
                              ChatmlTokenizer(), std::nullopt);
  ASSERT_TRUE(encoder.ok());
  absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
      *encoder, {.data_path = path, .seq_len = 512, .max_line_bytes = 1 << 20});
  ASSERT_TRUE(cache.ok()) << cache.status();
  unlink(path.c_str());
  TokenizedDataset ds(*std::move(cache),
                      {.seq_len = 512, .packing = true, .shuffle = true, .seed = 4});
  ASSERT_LT(ds.rows_per_epoch(), 60);
  int64_t groups = 0;
  for (int64_t r = 0; r < ds.rows_per_epoch(); ++r) {
    const PackedBatch b = ds.Pack(r, 1);
    ASSERT_TRUE(b.group_offsets.defined());
    const at::Tensor offsets = b.group_offsets;
    const at::Tensor relevance = b.relevance;
    ASSERT_EQ(relevance.numel(), b.cu_seqlens.numel() - 1);
    for (int64_t g = 0; g + 1 < offsets.numel(); ++g) {
      const int64_t begin = offsets[g].item<int64_t>(), end = offsets[g + 1].item<int64_t>();
      // A whole record: its positive first, then 1..4 negatives, from one line.
      ASSERT_EQ(relevance[begin].item<float>(), 1.0f);
      ASSERT_GE(end - begin, 2);
      ASSERT_LE(end - begin, 5);
      for (int64_t k = begin + 1; k < end; ++k) {
        ASSERT_EQ(relevance[k].item<float>(), 0.0f);
        ASSERT_EQ(b.document_ids[k], b.document_ids[begin]);
      }
      ++groups;
    }
  }
  EXPECT_EQ(groups, 60);
}

}  // namespace
}  // namespace ballast::train
