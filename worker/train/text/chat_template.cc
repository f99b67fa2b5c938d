#include "worker/train/text/chat_template.h"

#include <filesystem>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "nlohmann/json.hpp"
#include "worker/train/text/chat_render.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// The control tokens each template writes. A tokenizer without them as
// tokens belongs to another model family: its text would encode as plain
// characters, and train the model on the wrong format.
constexpr std::string_view kChatmlTokens[] = {"<|im_start|>", "<|im_end|>"};
constexpr std::string_view kLlama3Tokens[] = {"<|begin_of_text|>", "<|start_header_id|>",
                                              "<|end_header_id|>", "<|eot_id|>"};

// The text of `path`, or nullopt when it does not exist. tokenizer_config.json
// lists the added tokens, so it gets tokenizer.json's bound.
absl::StatusOr<std::optional<std::string>> ReadIfPresent(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path.string(), kMaxTokenizerJsonBytes);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  return *std::move(text);
}

// The chat_template of a parsed tokenizer_config.json: a string, or a list
// of named templates, of which apply_chat_template uses "default".
absl::StatusOr<std::optional<std::string>> ConfigTemplate(const nlohmann::json& config,
                                                          const std::string& path) {
  if (!config.is_object() || !config.contains("chat_template") ||
      config["chat_template"].is_null()) {
    return std::nullopt;
  }
  const nlohmann::json& value = config["chat_template"];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    for (const nlohmann::json& entry : value) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": chat_template is neither a string nor a list with a \"default\" "
                   "template; set data.template"));
}

// Whether a message's content or reasoning holds a special token's text.
absl::StatusOr<bool> HoldsSpecialTokenText(const Tokenizer& tokenizer,
                                           absl::Span<const ChatMessage> messages) {
  for (const ChatMessage& message : messages) {
    for (const std::string* text :
         {&message.content, message.reasoning.has_value() ? &*message.reasoning : nullptr}) {
      if (text == nullptr) continue;
      absl::StatusOr<std::optional<std::string>> special = tokenizer.FindSpecialToken(*text);
      if (!special.ok()) return special.status();
      if (special->has_value()) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Named(std::string_view name) {
  if (name == "qwen3") return ChatTemplate("qwen3", Kind::kQwen3);
  if (name == "qwen3_5") return ChatTemplate("qwen3_5", Kind::kQwen3_5);
  if (name == "chatml") return ChatTemplate("chatml", Kind::kChatml);
  if (name == "llama3") return ChatTemplate("llama3", Kind::kLlama3);
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template \"", std::string(name), "\" is not one of qwen3, qwen3_5, chatml, llama3"));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Detect(const std::string& model_dir) {
  fs::path path(model_dir);
  std::error_code error;
  if (fs::is_directory(path, error)) path /= "tokenizer_config.json";
  absl::StatusOr<std::optional<std::string>> read = ReadIfPresent(path);
  if (!read.ok()) return read.status();
  const std::optional<std::string>& text = *read;
  if (!text.has_value()) return absl::NotFoundError(absl::StrCat(path.string(), ": no such file"));
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not valid JSON: ", e.what()));
  }
  absl::StatusOr<std::optional<std::string>> jinja = ConfigTemplate(config, path.string());
  if (!jinja.ok()) return jinja.status();
  if (!jinja->has_value()) jinja = ReadIfPresent(path.parent_path() / "chat_template.jinja");
  if (!jinja.ok()) return jinja.status();
  if (!jinja->has_value()) {
    return absl::NotFoundError(absl::StrCat(
        path.string(), " has no chat_template, and no chat_template.jinja is beside it"));
  }
  const std::string& source = **jinja;
  if (source.find("<|im_start|>") != std::string::npos) {
    if (source.find("<think>") == std::string::npos) return Named("chatml");
    // Qwen3.5's template trims the reasoning (Qwen3's strips only "\n").
    return Named(source.find("reasoning_content|trim") != std::string::npos ? "qwen3_5" : "qwen3");
  }
  if (source.find("<|start_header_id|>") != std::string::npos) return Named("llama3");
  return absl::InvalidArgumentError(
      absl::StrCat(path.string(), ": its chat_template is none of the built-ins (qwen3, qwen3_5, ",
                   "chatml, llama3); set data.template"));
}

absl::StatusOr<std::string> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                 bool add_generation_prompt,
                                                 bool enable_thinking) const {
  if (absl::Status status = Check(messages); !status.ok()) return status;
  std::string text;
  for (const ChatPiece& piece : Pieces(messages, add_generation_prompt, enable_thinking)) {
    text.append(piece.text);
  }
  return text;
}

absl::Status ChatTemplate::Check(absl::Span<const ChatMessage> messages) const {
  if (absl::Status status = CheckChat(messages); !status.ok()) return status;
  if (kind_ == Kind::kQwen3_5) return CheckQwen3_5Chat(messages);
  return absl::OkStatus();
}

std::vector<ChatPiece> ChatTemplate::Pieces(absl::Span<const ChatMessage> messages,
                                            bool add_generation_prompt,
                                            bool enable_thinking) const {
  switch (kind_) {
    case Kind::kQwen3:
      return RenderQwen3(messages, add_generation_prompt, enable_thinking);
    case Kind::kQwen3_5:
      return RenderQwen3_5(messages, add_generation_prompt, enable_thinking);
    case Kind::kChatml:
      return RenderChatml(messages, add_generation_prompt);
    case Kind::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
  }
  return {};
}

absl::Status ChatTemplate::CheckTokenizer(const Tokenizer& tokenizer) const {
  const absl::Span<const std::string_view> needed = kind_ == Kind::kLlama3
                                                        ? absl::MakeConstSpan(kLlama3Tokens)
                                                        : absl::MakeConstSpan(kChatmlTokens);
  for (const std::string_view token : needed) {
    if (tokenizer.TokenToId(token) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the tokenizer has no token ", std::string(token), ", which the ", std::string(name_),
          " chat template writes: it is another model's; set data.template"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EncodedChat> ChatTemplate::Encode(const Tokenizer& tokenizer,
                                                 absl::Span<const ChatMessage> messages,
                                                 TrainOn train_on, bool allow_special) const {
  if (absl::Status status = Check(messages); !status.ok()) return status;
  if (absl::Status status = CheckTokenizer(tokenizer); !status.ok()) return status;
  absl::StatusOr<bool> special_token_text = HoldsSpecialTokenText(tokenizer, messages);
  if (!special_token_text.ok()) return special_token_text.status();

  // Where each piece ends in the text the tokens cover. Normalizing the
  // pieces one by one gives the same text as normalizing the whole, since
  // every piece of a message borders on an ASCII character of the template
  // ("\n" before, "<" or "\n" after) that neither composes nor reorders
  // with its neighbour; the comparison below proves it for each chat.
  const std::vector<ChatPiece> pieces =
      Pieces(messages, /*add_generation_prompt=*/false, /*enable_thinking=*/true);
  std::string text;
  std::string expected;
  std::vector<size_t> piece_ends;
  std::vector<ByteRange> message_text;
  piece_ends.reserve(pieces.size());
  for (const ChatPiece& piece : pieces) {
    const bool plain = piece.from_message && !allow_special;
    if (plain && !piece.text.empty()) {
      message_text.push_back(ByteRange{text.size(), text.size() + piece.text.size()});
    }
    text.append(piece.text);
    absl::StatusOr<std::string> normalized = tokenizer.Normalize(piece.text, !plain);
    if (!normalized.ok()) return normalized.status();
    expected.append(*normalized);
    piece_ends.push_back(expected.size());
  }
  absl::StatusOr<Tokenizer::Encoding> encoding =
      tokenizer.EncodeWithOffsets(text, SpecialTokens{.allow = true, .plain = message_text});
  if (!encoding.ok()) return encoding.status();
  if (encoding->normalized != expected) {
    return absl::InternalError(
        absl::StrCat("the ", std::string(name_),
                     " chat's tokens do not line up with its pieces: the "
                     "tokenizer normalizes across a template boundary, so no mask is given"));
  }

  // A token is supervised when its last byte lies in a supervised piece: a
  // token that joins the header's "\n" to content starting with "\n" is the
  // content's, and one that ends in the header is not.
  EncodedChat chat;
  chat.special_token_text = *special_token_text;
  chat.ids = std::move(encoding->ids);
  chat.supervised.resize(chat.ids.size(), 1);
  if (train_on == TrainOn::kAll) return chat;
  size_t piece = 0;
  for (size_t i = 0; i < chat.ids.size(); ++i) {
    const size_t last_byte = encoding->ends[i] - 1;
    while (piece_ends[piece] <= last_byte) ++piece;
    chat.supervised[i] = pieces[piece].supervised ? 1 : 0;
  }
  return chat;
}

}  // namespace ballast::train
