#include "worker/train/data/token_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "worker/train/io/durable_file.h"

namespace ballast::train {
namespace {

// Bump when the files' layout or the meaning of a document changes.
constexpr int kCacheVersion = 3;
// Per document in documents.index: offset, length, line, group, relevance.
constexpr size_t kIndexFields = 5;
// A chunk ends at whichever comes first: lines may be up to MaxLineBytes
// (16 MiB and more) each, and 2 x threads chunks of 256 such lines would be
// gigabytes in flight.
constexpr size_t kRecordsPerChunk = 256;
constexpr size_t kBytesPerChunk = size_t{1} << 20;
constexpr size_t kBadRecordExamples = 5;

struct EncodedLine {
  int64_t line = 0;  // 0-based
  absl::Status status;
  std::vector<EncodedDocument> documents;
  bool special_token_text = false;
};

std::vector<EncodedLine> EncodeChunk(const DocumentEncoder& encoder,
                                     std::vector<RawRecord> records) {
  std::vector<EncodedLine> encoded(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    encoded[i].line = records[i].index;
    absl::StatusOr<nlohmann::json> record = ParseRawRecord(records[i]);
    encoded[i].status = record.ok() ? encoder.EncodeParsed(*record, &encoded[i].documents,
                                                           &encoded[i].special_token_text)
                                    : record.status();
  }
  return encoded;
}

int64_t TrainedTargets(absl::Span<const int32_t> labels) {
  return std::count_if(labels.begin() + std::min<size_t>(1, labels.size()), labels.end(),
                       [](int32_t label) { return label != kIgnoreLabel; });
}

// Holds an exclusive flock on DIR/.lock while in scope.
class FolderLock {
 public:
  static absl::StatusOr<FolderLock> Acquire(const std::string& dir) {
    const std::string path = dir + "/.lock";
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    while (flock(fd, LOCK_EX) != 0) {
      if (errno != EINTR) {
        const int error = errno;
        close(fd);
        return absl::ErrnoToStatus(error, absl::StrCat("cannot lock ", path));
      }
    }
    return FolderLock(fd);
  }
  FolderLock(FolderLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FolderLock& operator=(FolderLock&&) = delete;
  ~FolderLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  int fd_;
};

nlohmann::json StatisticsJson(const DataStatistics& s) {
  return {{"records", s.records},
          {"documents", s.documents},
          {"skipped_records", s.skipped_records},
          {"special_token_records", s.special_token_records},
          {"cut_documents", s.cut_documents},
          {"dropped_documents", s.dropped_documents},
          {"tokens", s.tokens},
          {"trained_tokens", s.trained_tokens},
          {"bad_record_examples", s.bad_record_examples}};
}

DataStatistics StatisticsFromJson(const nlohmann::json& j) {
  DataStatistics s;
  s.records = j.at("records").get<int64_t>();
  s.documents = j.at("documents").get<int64_t>();
  s.skipped_records = j.at("skipped_records").get<int64_t>();
  s.special_token_records = j.at("special_token_records").get<int64_t>();
  s.cut_documents = j.at("cut_documents").get<int64_t>();
  s.dropped_documents = j.at("dropped_documents").get<int64_t>();
  s.tokens = j.at("tokens").get<int64_t>();
  s.trained_tokens = j.at("trained_tokens").get<int64_t>();
  s.bad_record_examples = j.at("bad_record_examples").get<std::vector<std::string>>();
  return s;
}

}  // namespace

// Keeps the documents in order, in memory, and with files spills them there
// every few MiB, so that building a cache holds a bounded amount.
class TokenCache::Writer {
 public:
  struct Files {
    DurableFile ids, labels, index;
  };

  // Without files, everything stays in memory for TakeInMemory().
  Writer(const TokenCacheOptions& options, std::optional<Files> files)
      : options_(options), files_(std::move(files)) {}

  // `reader` says where a record came from.
  absl::Status Add(EncodedLine& encoded, const RecordReader& reader) {
    ++statistics_.records;
    if (!encoded.status.ok()) {
      std::string what = absl::StrCat(reader.Where(encoded.line), ": ", encoded.status.message());
      if (encoded.status.code() != absl::StatusCode::kInvalidArgument ||
          !options_.skip_bad_records) {
        return absl::Status(encoded.status.code(), what);
      }
      ++statistics_.skipped_records;
      if (statistics_.bad_record_examples.size() < kBadRecordExamples) {
        statistics_.bad_record_examples.push_back(std::move(what));
      }
      return absl::OkStatus();
    }
    statistics_.special_token_records += encoded.special_token_text;
    // A record's documents by group, in order: one document, or a reranker
    // record's groups of candidates.
    std::vector<EncodedDocument>& docs = encoded.documents;
    for (size_t begin = 0, end; begin < docs.size(); begin = end) {
      end = begin + 1;
      while (end < docs.size() && docs[end].group == docs[begin].group) ++end;
      absl::Status s =
          docs[begin].relevance < 0
              ? AddDocument(docs[begin], encoded.line, reader)
              : AddGroup(absl::MakeSpan(docs).subspan(begin, end - begin), encoded.line, reader);
      if (!s.ok()) return s;
    }
    return ids_.size() >= kSpillTokens ? Spill() : absl::OkStatus();
  }

  // One document, its own group; data.truncate for one longer than seq_len.
  absl::Status AddDocument(EncodedDocument& doc, int64_t line, const RecordReader& reader) {
    const int64_t length = static_cast<int64_t>(doc.input_ids.size());
    if (length > options_.seq_len) {
      switch (options_.truncate) {
        case Truncate::kError:
          return absl::InvalidArgumentError(
              absl::StrCat(reader.Where(line), ": the document has ", length, " tokens, more than ",
                           options_.seq_len_name, " = ", options_.seq_len,
                           "; raise seq_len, or set data.truncate to cut or drop"));
        case Truncate::kDrop:
          ++statistics_.dropped_documents;
          return absl::OkStatus();
        case Truncate::kCut:
          doc.input_ids.resize(options_.seq_len);
          doc.labels.resize(options_.seq_len);
          if (TrainedTargets(doc.labels) == 0) {
            ++statistics_.dropped_documents;  // the cut left nothing to train
            return absl::OkStatus();
          }
          ++statistics_.cut_documents;
          break;
      }
    }
    Append(doc, line);
    ++groups_;
    return absl::OkStatus();
  }

  // A reranker group, which packing keeps in one row: the positive and its
  // negatives together at most seq_len tokens. data.truncate for a longer
  // one; cut drops negatives from the end while one is left.
  absl::Status AddGroup(absl::Span<EncodedDocument> group, int64_t line,
                        const RecordReader& reader) {
    int64_t total = 0;
    for (const EncodedDocument& doc : group) total += static_cast<int64_t>(doc.input_ids.size());
    size_t kept = group.size();
    if (total > options_.seq_len) {
      if (options_.truncate == Truncate::kError) {
        return absl::InvalidArgumentError(absl::StrCat(
            reader.Where(line), ": a group of ", group.size(), " candidates has ", total,
            " tokens, more than data.seq_len = ", options_.seq_len,
            " (a group is never split); raise seq_len, lower reranker.max_negatives, or set "
            "data.truncate to cut or drop"));
      }
      while (options_.truncate == Truncate::kCut && kept > 2 && total > options_.seq_len) {
        total -= static_cast<int64_t>(group[--kept].input_ids.size());
      }
      if (total > options_.seq_len) {
        statistics_.dropped_documents += static_cast<int64_t>(group.size());
        return absl::OkStatus();
      }
      statistics_.dropped_documents += static_cast<int64_t>(group.size() - kept);
    }
    for (size_t k = 0; k < kept; ++k) {
      statistics_.cut_documents += group[k].cut;
      Append(group[k], line);
    }
    ++groups_;
    return absl::OkStatus();
  }

  void Append(const EncodedDocument& doc, int64_t line) {
    const int64_t n = static_cast<int64_t>(doc.input_ids.size());
    ids_.insert(ids_.end(), doc.input_ids.begin(), doc.input_ids.end());
    labels_.insert(labels_.end(), doc.labels.begin(), doc.labels.end());
    index_.insert(index_.end(), {statistics_.tokens, n, line, groups_, doc.relevance});
    ++statistics_.documents;
    statistics_.tokens += n;
    statistics_.trained_tokens += TrainedTargets(doc.labels);
  }

  absl::Status CheckNotEmpty() const {
    if (statistics_.documents > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(options_.data_path, ": no documents to train on (", statistics_.records,
                     " records, ", statistics_.skipped_records, " skipped as bad, ",
                     statistics_.dropped_documents, " dropped as longer than seq_len)"));
  }

  // With files: the rest, then cache.json last.
  absl::Status Commit(const std::string& dir) {
    if (absl::Status s = CheckNotEmpty(); !s.ok()) return s;
    if (absl::Status s = Spill(); !s.ok()) return s;
    for (DurableFile* f : {&files_->ids, &files_->labels, &files_->index}) {
      if (absl::Status s = f->Commit(); !s.ok()) return s;
    }
    const std::string meta = nlohmann::json{{"version", kCacheVersion},
                                            {"fingerprint", options_.fingerprint},
                                            {"statistics", StatisticsJson(statistics_)}}
                                 .dump();
    absl::StatusOr<DurableFile> file = DurableFile::Create(dir + "/cache.json");
    if (!file.ok()) return file.status();
    if (absl::Status s = file->Append(meta.data(), meta.size()); !s.ok()) return s;
    return file->Commit();
  }

  // Without files: the cache over the vectors.
  absl::StatusOr<TokenCache> TakeInMemory() {
    if (absl::Status s = CheckNotEmpty(); !s.ok()) return s;
    TokenCache cache;
    auto ids = std::make_shared<const std::vector<int32_t>>(std::move(ids_));
    auto labels = std::make_shared<const std::vector<int32_t>>(std::move(labels_));
    auto index = std::make_shared<const std::vector<int64_t>>(std::move(index_));
    cache.ids_ = ids->data();
    cache.labels_ = labels->data();
    cache.index_ = index->data();
    cache.index_size_ = static_cast<size_t>(statistics_.documents);
    cache.storage_ = {ids, labels, index};
    cache.statistics_ = std::move(statistics_);
    cache.built_ = true;
    return cache;
  }

 private:
  static constexpr size_t kSpillTokens = size_t{1} << 20;

  absl::Status Spill() {
    if (!files_) return absl::OkStatus();
    if (absl::Status s = files_->ids.Append(ids_.data(), ids_.size() * sizeof(int32_t)); !s.ok()) {
      return s;
    }
    if (absl::Status s = files_->labels.Append(labels_.data(), labels_.size() * sizeof(int32_t));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = files_->index.Append(index_.data(), index_.size() * sizeof(int64_t));
        !s.ok()) {
      return s;
    }
    ids_.clear();
    labels_.clear();
    index_.clear();
    return absl::OkStatus();
  }

  const TokenCacheOptions& options_;
  std::optional<Files> files_;
  std::vector<int32_t> ids_, labels_;
  std::vector<int64_t> index_;  // kIndexFields per document
  int64_t groups_ = 0;
  DataStatistics statistics_;
};

absl::StatusOr<TokenCache> TokenCache::OpenOrBuild(const std::string& dir,
                                                   const DocumentEncoder& encoder,
                                                   const TokenCacheOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  absl::StatusOr<FolderLock> lock = FolderLock::Acquire(dir);
  if (!lock.ok()) return lock.status();
  if (absl::StatusOr<TokenCache> cache = Open(dir, options.fingerprint); cache.ok()) return cache;
  // Whatever was there is stale: the meta file goes first, so that a crash
  // mid-build leaves no cache that looks complete.
  unlink((dir + "/cache.json").c_str());
  absl::StatusOr<DurableFile> ids = DurableFile::Create(dir + "/documents.ids");
  if (!ids.ok()) return ids.status();
  absl::StatusOr<DurableFile> labels = DurableFile::Create(dir + "/documents.labels");
  if (!labels.ok()) return labels.status();
  absl::StatusOr<DurableFile> index = DurableFile::Create(dir + "/documents.index");
  if (!index.ok()) return index.status();
  Writer::Files files{*std::move(ids), *std::move(labels), *std::move(index)};
  Writer writer(options, std::move(files));
  if (absl::Status s = Encode(encoder, options, &writer); !s.ok()) return s;
  if (absl::Status s = writer.Commit(dir); !s.ok()) return s;
  absl::StatusOr<TokenCache> cache = Open(dir, options.fingerprint);
  if (cache.ok()) cache->built_ = true;
  return cache;
}

absl::StatusOr<TokenCache> TokenCache::Open(const std::string& dir,
                                            const std::string& fingerprint) {
  absl::StatusOr<std::string> meta_text = ReadRegularFile(dir + "/cache.json", 1 << 20);
  if (!meta_text.ok()) return meta_text.status();
  const nlohmann::json meta = nlohmann::json::parse(*meta_text, nullptr, false);
  if (meta.is_discarded() || meta.value("version", 0) != kCacheVersion ||
      meta.value("fingerprint", "") != fingerprint || !meta.contains("statistics")) {
    return absl::NotFoundError(absl::StrCat(dir, " holds no cache for this data"));
  }
  TokenCache cache;
  try {
    cache.statistics_ = StatisticsFromJson(meta["statistics"]);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(dir, "/cache.json: ", e.what()));
  }
  const DataStatistics& s = cache.statistics_;
  const size_t token_bytes = static_cast<size_t>(s.tokens) * sizeof(int32_t);
  const size_t index_bytes = static_cast<size_t>(s.documents) * kIndexFields * sizeof(int64_t);
  const uint8_t* views[3];
  int i = 0;
  for (auto [name, bytes] : {std::pair{"ids", token_bytes}, std::pair{"labels", token_bytes},
                             std::pair{"index", index_bytes}}) {
    absl::StatusOr<std::shared_ptr<const MappedFile>> mapped =
        MappedFile::Open(absl::StrCat(dir, "/documents.", name));
    if (!mapped.ok()) return mapped.status();
    if ((*mapped)->size() != bytes) {
      return absl::DataLossError(
          absl::StrCat(dir, "/documents.", name, " disagrees with cache.json"));
    }
    views[i++] = (*mapped)->data();
    cache.storage_.push_back(*std::move(mapped));
  }
  cache.ids_ = reinterpret_cast<const int32_t*>(views[0]);
  cache.labels_ = reinterpret_cast<const int32_t*>(views[1]);
  cache.index_ = reinterpret_cast<const int64_t*>(views[2]);
  cache.index_size_ = static_cast<size_t>(s.documents);
  return cache;
}

absl::Status TokenCache::Encode(const DocumentEncoder& encoder, const TokenCacheOptions& options,
                                Writer* writer) {
  const auto named = [&](const absl::Status& s) {
    if (options.data_path_name.empty()) return s;
    return absl::Status(s.code(), absl::StrCat(options.data_path_name, ": ", s.message()));
  };
  absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::Open(
      options.data_path, {.max_line_bytes = options.max_line_bytes, .columns = options.columns});
  if (!reader.ok()) return named(reader.status());
  const size_t window = 2 * static_cast<size_t>(std::max(1, options.threads));
  std::deque<std::future<std::vector<EncodedLine>>> in_flight;
  // On an early return the futures' destructors wait for their chunks; the
  // encoder outlives them.
  auto write_oldest = [&]() -> absl::Status {
    std::vector<EncodedLine> chunk = in_flight.front().get();
    in_flight.pop_front();
    for (EncodedLine& line : chunk) {
      if (absl::Status s = writer->Add(line, **reader); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  std::vector<RawRecord> records;
  // Of lines: a row's values stay in its row group, which the chunk shares.
  size_t chunk_bytes = 0;
  RawRecord record;
  for (bool more = true; more;) {
    absl::StatusOr<bool> next = (*reader)->Next(&record);
    if (!next.ok()) return named(next.status());
    more = *next;
    if (more) {
      chunk_bytes += record.line.size();
      records.push_back(std::exchange(record, {}));
    }
    if (records.size() == kRecordsPerChunk || chunk_bytes >= kBytesPerChunk ||
        (!more && !records.empty())) {
      chunk_bytes = 0;
      in_flight.push_back(std::async(std::launch::async, EncodeChunk, std::cref(encoder),
                                     std::exchange(records, {})));
      if (in_flight.size() >= window) {
        if (absl::Status s = write_oldest(); !s.ok()) return s;
      }
    }
  }
  while (!in_flight.empty()) {
    if (absl::Status s = write_oldest(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenCache> TokenCache::BuildInMemory(const DocumentEncoder& encoder,
                                                     const TokenCacheOptions& options) {
  Writer writer(options, std::nullopt);
  if (absl::Status s = Encode(encoder, options, &writer); !s.ok()) return s;
  return writer.TakeInMemory();
}

}  // namespace ballast::train
