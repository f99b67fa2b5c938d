#include "worker/train/data/token_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int32_t> Vec(absl::Span<const int32_t> s) { return {s.begin(), s.end()}; }

class TokenCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "token_cache_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    absl::StatusOr<DocumentEncoder> encoder = DocumentEncoder::Create(
        {.format = DataFormat::kTokens, .vocab_size = 100}, std::nullopt, std::nullopt);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    encoder_.emplace(*std::move(encoder));
  }
  // remove_all would bind to a copy libtorch.so exports, which crashes.
  void TearDown() override {
    for (const char* name : {"/data.jsonl", "/cache/documents.ids", "/cache/documents.labels",
                             "/cache/documents.index", "/cache/cache.json", "/cache/.lock"}) {
      unlink((dir_ + name).c_str());
    }
    rmdir((dir_ + "/cache").c_str());
    rmdir(dir_.c_str());
  }

  std::string data() const { return dir_ + "/data.jsonl"; }
  std::string cache_dir() const { return dir_ + "/cache"; }
  void Write(const std::string& text) { std::ofstream(data()) << text; }
  TokenCacheOptions Options() const {
    return {.data_path = data(),
            .seq_len = 4,
            .max_line_bytes = 1 << 20,
            .threads = 3,
            .fingerprint = "v1"};
  }

  std::string dir_;
  std::optional<DocumentEncoder> encoder_;
};

TEST_F(TokenCacheTest, BuildsOnceAndReadsTheSameDocumentsBack) {
  Write("{\"input_ids\": [1, 2, 3]}\n\n{\"input_ids\": [4, 5], \"labels\": [-100, 5]}\n");
  absl::StatusOr<TokenCache> built = TokenCache::OpenOrBuild(cache_dir(), *encoder_, Options());
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_TRUE(built->built());
  absl::StatusOr<TokenCache> read = TokenCache::OpenOrBuild(cache_dir(), *encoder_, Options());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->built());
  for (const TokenCache* cache : {&*built, &*read}) {
    ASSERT_EQ(cache->documents(), 2);
    EXPECT_THAT(Vec(cache->input_ids(0)), ElementsAre(1, 2, 3));
    EXPECT_THAT(Vec(cache->labels(0)), ElementsAre(1, 2, 3));
    EXPECT_THAT(Vec(cache->input_ids(1)), ElementsAre(4, 5));
    EXPECT_THAT(Vec(cache->labels(1)), ElementsAre(-100, 5));
    EXPECT_EQ(cache->line(0), 0);
    EXPECT_EQ(cache->line(1), 2);
    EXPECT_EQ(cache->statistics().records, 2);
    EXPECT_EQ(cache->statistics().tokens, 5);
    EXPECT_EQ(cache->statistics().trained_tokens, 3);
  }
  // Another fingerprint (the file or an option changed) builds again.
  TokenCacheOptions changed = Options();
  changed.fingerprint = "v2";
  absl::StatusOr<TokenCache> rebuilt = TokenCache::OpenOrBuild(cache_dir(), *encoder_, changed);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_TRUE(rebuilt->built());
  // A damaged cache (a file cut short) is built again, not trusted.
  fs::resize_file(cache_dir() + "/documents.ids", 4);
  absl::StatusOr<TokenCache> repaired = TokenCache::OpenOrBuild(cache_dir(), *encoder_, changed);
  ASSERT_TRUE(repaired.ok()) << repaired.status();
  EXPECT_TRUE(repaired->built());
  EXPECT_THAT(Vec(repaired->input_ids(1)), ElementsAre(4, 5));
}

TEST_F(TokenCacheTest, ManyThreadsWriteWhatOneReadsInFileOrder) {
  std::mt19937 rng(std::random_device{}());
  std::string text;
  for (int d = 0; d < 3000; ++d) {
    text += "{\"input_ids\": [" + std::to_string(d % 100);
    for (int t = std::uniform_int_distribution<int>(1, 3)(rng); t > 0; --t) {
      text += ", " + std::to_string(rng() % 100);
    }
    text += "]}\n";
  }
  Write(text);
  TokenCacheOptions one = Options();
  one.threads = 1;
  absl::StatusOr<TokenCache> a = TokenCache::BuildInMemory(*encoder_, one);
  absl::StatusOr<TokenCache> b = TokenCache::OpenOrBuild(cache_dir(), *encoder_, Options());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(a->documents(), 3000);
  ASSERT_EQ(b->documents(), 3000);
  for (int64_t d = 0; d < 3000; ++d) {
    ASSERT_EQ(Vec(a->input_ids(d)), Vec(b->input_ids(d)));
    ASSERT_EQ(b->input_ids(d)[0], d % 100);
    ASSERT_EQ(b->line(d), d);
  }
}

TEST_F(TokenCacheTest, BadRecordsFailNamingTheLineOrAreSkippedAndCounted) {
  Write("{\"input_ids\": [1, 2]}\nnot json\n{\"input_ids\": [1, 200]}\n{\"input_ids\": [3, 4]}\n");
  absl::StatusOr<TokenCache> failed = TokenCache::BuildInMemory(*encoder_, Options());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.status().message(), HasSubstr("data.jsonl:2: not a JSON object"));

  TokenCacheOptions skip = Options();
  skip.skip_bad_records = true;
  absl::StatusOr<TokenCache> skipped = TokenCache::BuildInMemory(*encoder_, skip);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->documents(), 2);
  EXPECT_EQ(skipped->line(1), 3);
  EXPECT_EQ(skipped->statistics().skipped_records, 2);
  EXPECT_THAT(skipped->statistics().bad_record_examples,
              ElementsAre(HasSubstr("data.jsonl:2: not a JSON object"),
                          HasSubstr("data.jsonl:3: token id 200 outside the vocabulary")));

  Write("not json\n[]\n");
  EXPECT_THAT(TokenCache::BuildInMemory(*encoder_, skip).status().message(),
              HasSubstr("no documents to train on (2 records, 2 skipped as bad"));
}

// Issue 34: the count of records with special-token text is of records, not
// occurrences; over chunks encoded on several threads; without the bad
// records skipped; and the same when the cache is read back.
TEST_F(TokenCacheTest, CountsTheRecordsWithSpecialTokenTextAndKeepsTheCount) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 random(seed);
  // Past kLinesPerChunk (256), so that several chunks count.
  std::string text;
  int64_t special = 0;
  int64_t bad = 0;
  for (int i = 0; i < 700; ++i) {
    const int kind = static_cast<int>(random() % 4);
    if (kind == 0) {
      text += "{\"text\": \"ab<|im_start|>c<|endoftext|><|im_start|>\"}\n";
      ++special;
    } else if (kind == 1) {
      text += "{\"text\": \"<|im_start|> bad\"} junk\n";  // bad, not counted
      ++bad;
    } else {
      text += "{\"text\": \"ab<|im_start c\"}\n";
    }
  }
  Write(text);
  for (const bool allow : {false, true}) {
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::FromJson(
        WithSpecialTokens(QwenStyleJson({}), {"<|endoftext|>", "<|im_start|>"}, 256));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    absl::StatusOr<DocumentEncoder> encoder = DocumentEncoder::Create(
        {.format = DataFormat::kText, .vocab_size = 300, .allow_special_tokens = allow},
        *std::move(tokenizer), std::nullopt);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    TokenCacheOptions options = Options();
    options.seq_len = 100;
    options.skip_bad_records = true;
    options.fingerprint = allow ? "allowed" : "plain";
    absl::StatusOr<TokenCache> built = TokenCache::OpenOrBuild(cache_dir(), *encoder, options);
    ASSERT_TRUE(built.ok()) << built.status();
    absl::StatusOr<TokenCache> read = TokenCache::OpenOrBuild(cache_dir(), *encoder, options);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_TRUE(built->built());
    ASSERT_FALSE(read->built());
    for (const TokenCache* cache : {&*built, &*read}) {
      EXPECT_EQ(cache->statistics().special_token_records, special) << "allow " << allow;
      EXPECT_EQ(cache->statistics().skipped_records, bad);
    }
  }
}

// Issue 33: a record followed by a NUL byte was a good record.
TEST_F(TokenCacheTest, ARecordWithANulByteAfterItIsABadRecord) {
  Write(std::string("{\"input_ids\": [1, 2]}\0\n{\"input_ids\": [3, 4]}\0junk\n", 50));
  absl::StatusOr<TokenCache> failed = TokenCache::BuildInMemory(*encoder_, Options());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(failed.status().message(), HasSubstr("data.jsonl:1: a NUL byte at byte 22"));

  TokenCacheOptions skip = Options();
  skip.skip_bad_records = true;
  EXPECT_THAT(TokenCache::BuildInMemory(*encoder_, skip).status().message(),
              HasSubstr("no documents to train on (2 records, 2 skipped as bad"));
  Write(std::string("{\"input_ids\": [1, 2]}\0\n{\"input_ids\": [3, 4]}\n", 45));
  absl::StatusOr<TokenCache> skipped = TokenCache::BuildInMemory(*encoder_, skip);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->documents(), 1);
  EXPECT_EQ(skipped->statistics().skipped_records, 1);
  EXPECT_THAT(skipped->statistics().bad_record_examples,
              ElementsAre(HasSubstr("data.jsonl:1: a NUL byte at byte 22")));
}

TEST_F(TokenCacheTest, LongDocumentsAreRefusedCutOrDropped) {
  Write(
      "{\"input_ids\": [1, 2, 3, 4, 5, 6]}\n{\"input_ids\": [7, 8], \"labels\": [-100, 8]}\n"
      "{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, -100, -100, -100, 5]}\n");
  TokenCacheOptions options = Options();
  absl::Status error = TokenCache::BuildInMemory(*encoder_, options).status();
  EXPECT_THAT(error.message(),
              HasSubstr("data.jsonl:1: the document has 6 tokens, more than data.seq_len = 4"));

  options.truncate = Truncate::kCut;
  absl::StatusOr<TokenCache> cut = TokenCache::BuildInMemory(*encoder_, options);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->documents(), 2);
  EXPECT_THAT(Vec(cut->input_ids(0)), ElementsAre(1, 2, 3, 4));
  // Line 3 cut to 4 tokens trains nothing: dropped, not kept as dead weight.
  EXPECT_EQ(cut->statistics().cut_documents, 1);
  EXPECT_EQ(cut->statistics().dropped_documents, 1);

  options.truncate = Truncate::kDrop;
  absl::StatusOr<TokenCache> dropped = TokenCache::BuildInMemory(*encoder_, options);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  ASSERT_EQ(dropped->documents(), 1);
  EXPECT_EQ(dropped->line(0), 1);
  EXPECT_EQ(dropped->statistics().dropped_documents, 2);
}

}  // namespace
}  // namespace ballast::train
