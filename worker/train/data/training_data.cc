#include "worker/train/data/training_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_files.h"
#include "common/regular_file.h"
#include "worker/train/data/record_reader.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// Lines of a text format may hold long documents that data.truncate cuts;
// bounded all the same, so a file without newlines is refused, not read.
int64_t MaxLineBytes(DataFormat format, int64_t seq_len) {
  // A tokens line holds at most seq_len ids and as many labels, each at
  // most 21 characters with its separator.
  if (format == DataFormat::kTokens) return 4096 + 2 * 24 * seq_len;
  return std::clamp<int64_t>(4096 + 64 * seq_len, int64_t{16} << 20, int64_t{1} << 30);
}

// The folder that holds tokenizer_config.json next to `tokenizer_path`.
std::string TokenizerFolder(const std::string& tokenizer_path) {
  std::error_code ec;
  if (fs::is_directory(tokenizer_path, ec)) return tokenizer_path;
  const std::string parent = fs::path(tokenizer_path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// tokenizer_config.json's eos_token (a string, or an AddedToken object), or -1.
absl::StatusOr<TokenId> ConfiguredEos(const std::string& folder, const Tokenizer& tokenizer) {
  const std::string path = folder + "/tokenizer_config.json";
  absl::StatusOr<std::string> text = ReadRegularFile(path, int64_t{16} << 20);
  if (absl::IsNotFound(text.status())) return -1;
  if (!text.ok()) return text.status();
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  const auto eos = config.find("eos_token");
  if (eos == config.end() || eos->is_null()) return -1;
  std::string content;
  if (eos->is_string()) {
    content = eos->get<std::string>();
  } else if (eos->is_object() && eos->contains("content") && (*eos)["content"].is_string()) {
    content = (*eos)["content"].get<std::string>();
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path,
                                                   ": eos_token is neither a string nor "
                                                   "an object with a content"));
  }
  const TokenId id = tokenizer.TokenToId(content);
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": eos_token ", content, " is not a token of the tokenizer"));
  }
  return id;
}

// What a file is, for the fingerprint: a changed file is tokenized again.
std::string FileIdentity(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return path;
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return absl::StrCat(ec ? path : absolute.string(), " size ", st.st_size, " mtime ",
                      st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

// The same for a data path, each of a folder's files.
std::string DataIdentity(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> files = ListDataFiles(path);
  if (!files.ok()) return FileIdentity(path);
  return absl::StrJoin(*files, "; ", [](std::string* out, const std::string& file) {
    out->append(FileIdentity(file));
  });
}

// The format of the first record of `path`, read with data.columns; a mixed
// file then fails on its first record of another shape, naming the line or
// row. Errors in reading the file start with `key`, the spec's field that
// names it, when not empty.
absl::StatusOr<DataFormat> DetectFileFormat(const std::string& path, absl::string_view key,
                                            const v1::DataSpec& data) {
  const auto named = [&](const absl::Status& s) {
    return key.empty() ? s : absl::Status(s.code(), absl::StrCat(key, ": ", s.message()));
  };
  absl::StatusOr<std::unique_ptr<RecordReader>> reader =
      RecordReader::Open(path, {.max_line_bytes = MaxLineBytes(DataFormat::kText, data.seq_len()),
                                .columns = data.columns()});
  RawRecord first;
  absl::StatusOr<bool> more = reader.ok() ? (*reader)->Next(&first) : reader.status();
  if (!more.ok()) return named(more.status());
  if (!*more) return absl::InvalidArgumentError(absl::StrCat(path, ": no records"));
  absl::StatusOr<nlohmann::json> record = ParseRawRecord(first);
  absl::StatusOr<DataFormat> format =
      record.ok() ? DetectDataFormat(*record) : absl::StatusOr<DataFormat>(record.status());
  if (!format.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat((*reader)->Where(first.index), ": ", format.status().message()));
  }
  return format;
}

absl::StatusOr<DataFormat> ResolveFormat(const v1::DataSpec& data) {
  if (!data.format().empty()) return ParseDataFormat(data.format());
  return DetectFileFormat(data.path(), "data.path", data);
}

// Whether a document of `set` has a supervised target: without one, a
// validation loss is undefined.
bool HasSupervision(TokenizedDataset& set) {
  const bool diffusion = set.order().diffusion.block_length > 0;
  for (int64_t row = 0; row < set.rows_per_epoch(); ++row) {
    for (const int64_t d : set.RowDocuments(row)) {
      // A causal target is the next token's label; block diffusion trains
      // the answer tokens themselves.
      const absl::Span<const int32_t> labels = set.cache().labels(d);
      for (size_t t = diffusion ? 0 : 1; t < labels.size(); ++t) {
        if (labels[t] != kIgnoreLabel) return true;
      }
    }
  }
  return false;
}

// eval.path's file read as data.path's. INVALID_ARGUMENT naming eval.path
// for a file of another format than data.path's.
absl::StatusOr<TokenCache> ReadEvalFile(const v1::JobSpec& spec, const DocumentEncoder& encoder,
                                        const TokenCacheOptions& options) {
  const v1::DataSpec& data = spec.data();
  const std::string& path = spec.eval().path();
  const DataFormat format = encoder.options().format;
  absl::StatusOr<DataFormat> eval_format = DetectFileFormat(path, "eval.path", data);
  if (!eval_format.ok()) return eval_format.status();
  if (*eval_format != format) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.path: ", path, " holds ", DataFormatName(*eval_format),
                     " records, but data.path ", data.path(), " holds ", DataFormatName(format),
                     " records; the validation set must be in the training data's format"));
  }
  TokenCacheOptions eval_options = options;
  eval_options.data_path = path;
  eval_options.data_path_name.clear();  // named below
  absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(encoder, eval_options);
  if (!cache.ok()) {
    return absl::Status(cache.status().code(),
                        absl::StrCat("eval.path: ", cache.status().message()));
  }
  return cache;
}

// The validation set, ordered for evaluation: file order, packed as the
// training rows are, block diffusion's noise drawn from eval.seed (the
// job's seed by default) and the same at every evaluation. `training` is
// the training data's cache, whose eval.fraction share it holds out.
// INVALID_ARGUMENT naming the key for a set without a supervised token, and
// as ReadEvalFile.
absl::StatusOr<std::unique_ptr<TokenizedDataset>> OpenEvalSet(const v1::JobSpec& spec,
                                                              const DocumentEncoder& encoder,
                                                              const TokenCacheOptions& options,
                                                              const TokenCache& training,
                                                              const DataOrder& training_order) {
  const v1::EvalSpec& e = spec.eval();
  DataOrder order = training_order;
  order.shuffle = false;
  order.seed = order.split.seed;  // eval.seed, or the job's
  order.split.held_out = true;
  std::unique_ptr<TokenizedDataset> set;
  if (e.fraction() > 0) {
    set = std::make_unique<TokenizedDataset>(training, order);
  } else {
    absl::StatusOr<TokenCache> cache = ReadEvalFile(spec, encoder, options);
    if (!cache.ok()) return cache.status();
    set = std::make_unique<TokenizedDataset>(*std::move(cache), order);
  }
  if (!HasSupervision(*set)) {
    const std::string key = e.fraction() > 0 ? "eval.fraction" : "eval.path";
    return absl::InvalidArgumentError(absl::StrCat(
        key, ": the validation set (", e.fraction() > 0 ? spec.data().path() : e.path(),
        e.fraction() > 0 ? absl::StrCat(", ", e.fraction(), " of its documents") : "",
        ") has no supervised token under data.train_on ", spec.data().train_on(),
        ", so its loss is undefined"));
  }
  return set;
}

// The block-diffusion noise of a block_diffusion job. Its mask token: the
// spec's (which PrepareJobSpec fills from an SDAR config.json), else
// config.json's mask_token_id, else the tokenizer's <|MASK|> (SDAR's
// tokenizer has it, id 151669).
absl::StatusOr<DiffusionNoise> DiffusionNoiseOf(const v1::JobSpec& spec, int64_t vocab_size,
                                                const Tokenizer* tokenizer) {
  if (spec.task() != "block_diffusion") return DiffusionNoise{};
  const v1::BlockDiffusionSpec& b = spec.block_diffusion();
  DiffusionNoise noise{.block_length = b.block_length(), .eps = b.eps()};
  if (b.has_mask_token_id()) {
    noise.mask_token_id = b.mask_token_id();
  } else {
    const std::string path = spec.model().path() + "/config.json";
    absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxConfigJsonBytes);
    if (!text.ok()) return text.status();
    const nlohmann::json config = nlohmann::json::parse(*text, nullptr, false);
    const auto id = config.is_object() ? config.find("mask_token_id") : config.end();
    const TokenId from_tokenizer = tokenizer != nullptr ? tokenizer->TokenToId("<|MASK|>") : -1;
    if (id != config.end() && id->is_number_integer()) {
      noise.mask_token_id = id->get<int64_t>();
    } else if (from_tokenizer >= 0) {
      noise.mask_token_id = from_tokenizer;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "task block_diffusion needs a mask token: set block_diffusion.mask_token_id, give ", path,
          " a mask_token_id, or give the tokenizer a <|MASK|> token"));
    }
  }
  if (noise.mask_token_id < 0 || noise.mask_token_id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_diffusion.mask_token_id = ", noise.mask_token_id,
                     " is outside the model's vocabulary [0, ", vocab_size, ")"));
  }
  return noise;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DocumentEncoder>> OpenDocumentEncoder(const v1::JobSpec& spec,
                                                                     int64_t vocab_size,
                                                                     v1::DataReport* report) {
  const v1::DataSpec& data = spec.data();
  absl::StatusOr<DataFormat> format = ResolveFormat(data);
  if (!format.ok()) return format.status();
  report->set_format(std::string(DataFormatName(*format)));
  const bool reranker_task = spec.task() == "generative_reranker";
  if (reranker_task != (*format == DataFormat::kReranker)) {
    return absl::InvalidArgumentError(absl::StrCat(
        data.path(), " holds ", DataFormatName(*format), " records, which task ", spec.task(),
        reranker_task ? " cannot train: it reads reranker records ({\"query\", \"positive\", "
                        "\"negative\"})"
                      : " cannot train: reranker records are for task generative_reranker"));
  }

  DocumentEncoderOptions options;
  options.format = *format;
  options.train_on = data.train_on() == "all" ? TrainOn::kAll : TrainOn::kAssistant;
  options.vocab_size = vocab_size;
  options.allow_special_tokens = data.allow_special_tokens();
  report->set_special_tokens_allowed(data.allow_special_tokens());
  if (reranker_task) {
    const v1::RerankerSpec& r = spec.reranker();
    options.reranker = {r.prefix(), r.instruction(), r.suffix()};
    options.max_positives = r.max_positives();
    options.max_negatives = r.max_negatives();
    options.needs_negative = r.loss() != "pointwise";
    options.max_tokens = data.seq_len();
  }
  std::optional<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  if (*format != DataFormat::kTokens) {
    const std::string path = data.tokenizer().empty() ? spec.model().path() : data.tokenizer();
    absl::StatusOr<Tokenizer> loaded = Tokenizer::Load(path);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("data.format ", DataFormatName(*format),
                                       " needs a tokenizer: ", loaded.status().message()));
    }
    tokenizer = *std::move(loaded);
    const std::string folder = TokenizerFolder(path);
    absl::StatusOr<TokenId> eos = ConfiguredEos(folder, *tokenizer);
    if (!eos.ok()) return eos.status();
    options.eos = *eos;
    const bool chat = *format == DataFormat::kMessages || *format == DataFormat::kPromptCompletion;
    if (chat && data.template_() != "none") {
      absl::StatusOr<ChatTemplate> resolved = data.template_().empty()
                                                  ? ChatTemplate::Detect(folder)
                                                  : ChatTemplate::Named(data.template_());
      if (resolved.ok()) {
        chat_template = *std::move(resolved);
        report->set_template_(std::string(chat_template->name()));
      } else if (!(absl::IsNotFound(resolved.status()) &&
                   *format == DataFormat::kPromptCompletion)) {
        // prompt_completion without a chat template concatenates; messages
        // cannot do without one.
        return absl::Status(
            resolved.status().code(),
            absl::StrCat(resolved.status().message(),
                         "; set data.template to qwen3, qwen3_5, chatml or llama3"));
      }
    }
    if (!chat_template && chat) report->set_template_("none");
  }
  absl::StatusOr<DocumentEncoder> encoder =
      DocumentEncoder::Create(options, std::move(tokenizer), std::move(chat_template));
  if (!encoder.ok()) return encoder.status();
  return std::make_unique<DocumentEncoder>(*std::move(encoder));
}

absl::StatusOr<TrainingData> OpenTrainingData(const v1::JobSpec& spec,
                                              const TrainingDataOptions& options) {
  const v1::DataSpec& data = spec.data();
  TrainingData result;
  absl::StatusOr<std::unique_ptr<DocumentEncoder>> encoder =
      OpenDocumentEncoder(spec, options.vocab_size, &result.report);
  if (!encoder.ok()) return encoder.status();
  result.encoder = *std::move(encoder);
  absl::StatusOr<DiffusionNoise> noise =
      DiffusionNoiseOf(spec, options.vocab_size, result.encoder->tokenizer());
  if (!noise.ok()) return noise.status();
  // A block-diffusion document is packed twice, [x_t ; x_0], so it may have
  // half a row's tokens.
  const int64_t document_limit =
      noise->block_length > 0 ? data.seq_len() / 2 : static_cast<int64_t>(data.seq_len());

  TokenCacheOptions cache_options;
  cache_options.data_path = data.path();
  cache_options.columns = data.columns();
  cache_options.seq_len = document_limit;
  if (noise->block_length > 0) {
    cache_options.seq_len_name = "data.seq_len / 2 (block diffusion packs [x_t ; x_0])";
  }
  cache_options.truncate = data.truncate() == "cut"    ? Truncate::kCut
                           : data.truncate() == "drop" ? Truncate::kDrop
                                                       : Truncate::kError;
  cache_options.skip_bad_records = data.on_bad_record() == "skip";
  cache_options.max_line_bytes = MaxLineBytes(result.encoder->options().format, data.seq_len());
  cache_options.threads =
      static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  const std::string tokenizer_path =
      data.tokenizer().empty() ? spec.model().path() + "/tokenizer.json" : data.tokenizer();
  cache_options.fingerprint =
      nlohmann::json{{"data", DataIdentity(data.path())},
                     {"columns", data.columns().ShortDebugString()},
                     {"tokenizer", result.encoder->tokenizer() ? FileIdentity(tokenizer_path) : ""},
                     {"format", result.report.format()},
                     {"template", result.report.template_()},
                     {"train_on", data.train_on()},
                     {"allow_special_tokens", data.allow_special_tokens()},
                     {"seq_len", data.seq_len()},
                     {"truncate", data.truncate()},
                     {"on_bad_record", data.on_bad_record()},
                     {"vocab_size", options.vocab_size},
                     {"eos", result.encoder->options().eos},
                     {"reranker", spec.reranker().ShortDebugString()}}
          .dump();
  absl::StatusOr<TokenCache> cache =
      options.cache_dir.empty()
          ? TokenCache::BuildInMemory(*result.encoder, cache_options)
          : TokenCache::OpenOrBuild(options.cache_dir, *result.encoder, cache_options);
  if (!cache.ok()) return cache.status();
  const DataOrder order{
      .seq_len = data.seq_len(),
      .packing = data.packing(),
      .shuffle = data.shuffle(),
      .seed = static_cast<uint64_t>(spec.seed()),
      .diffusion = *noise,
      // eval.seed seeds the split and the eval set's noise (OpenEvalSet).
      .split = {.fraction = spec.eval().fraction(),
                .seed = spec.eval().has_seed() ? spec.eval().seed()
                                               : static_cast<uint64_t>(spec.seed())}};
  if (order.split.fraction > 0 && cache->documents() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.fraction: ", data.path(), " has ", cache->documents(),
                     " document(s); holding some out of training needs at least 2"));
  }
  if (spec.has_eval()) {
    absl::StatusOr<std::unique_ptr<TokenizedDataset>> eval =
        OpenEvalSet(spec, *result.encoder, cache_options, *cache, order);
    if (!eval.ok()) return eval.status();
    result.eval = *std::move(eval);
  }
  result.dataset = std::make_unique<TokenizedDataset>(*std::move(cache), order);

  const DataStatistics& s = result.dataset->cache().statistics();
  v1::DataReport& r = result.report;
  r.set_records(s.records);
  r.set_documents(s.documents);
  r.set_skipped_records(s.skipped_records);
  r.set_special_token_records(s.special_token_records);
  for (const std::string& example : s.bad_record_examples) r.add_bad_record_examples(example);
  r.set_cut_documents(s.cut_documents);
  r.set_dropped_documents(s.dropped_documents);
  r.set_tokens(s.tokens);
  r.set_trained_tokens(s.trained_tokens);
  const EpochPacking packing = result.dataset->packing();
  r.set_rows(packing.rows);
  r.set_packing_efficiency(packing.efficiency);
  r.set_tokenized(result.dataset->cache().built());

  if (const std::string& eval_path = spec.reranker().eval_path(); !eval_path.empty()) {
    TokenCacheOptions eval_options = cache_options;
    eval_options.data_path = eval_path;
    eval_options.data_path_name.clear();  // named below
    absl::StatusOr<TokenCache> eval = TokenCache::BuildInMemory(*result.encoder, eval_options);
    if (!eval.ok()) {
      return absl::Status(eval.status().code(),
                          absl::StrCat("reranker.eval_path: ", eval.status().message()));
    }
    result.eval = std::make_unique<TokenizedDataset>(
        *std::move(eval), DataOrder{.seq_len = data.seq_len(), .shuffle = false});
  }
  return result;
}

std::string SpecialTokenRecordsNote(const v1::DataReport& report) {
  if (report.special_token_records() == 0) return "";
  return absl::StrCat(
      report.special_token_records(), " records contained special-token text, encoded as ",
      report.special_tokens_allowed() ? "special tokens (data.allow_special_tokens: true)"
                                      : "plain text (data.allow_special_tokens: false)");
}

}  // namespace ballast::train
