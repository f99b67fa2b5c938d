#include "worker/train/text/tokenize_lines.h"

#include <filesystem>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "worker/train/text/chat_template.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {
namespace {

absl::StatusOr<std::vector<ChatMessage>> Messages(const nlohmann::json& list) {
  if (!list.is_array()) return absl::InvalidArgumentError("messages is not a list");
  std::vector<ChatMessage> messages;
  for (const nlohmann::json& m : list) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError("a message needs a string role");
    }
    ChatMessage message{m["role"].get<std::string>(), "", std::nullopt};
    if (m.contains("content") && m["content"].is_string()) {
      message.content = m["content"].get<std::string>();
    } else if (m.contains("content") && !m["content"].is_null()) {
      return absl::InvalidArgumentError("a message's content is not a string");
    }
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string()) {
      message.reasoning = m["reasoning_content"].get<std::string>();
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

}  // namespace

absl::StatusOr<int64_t> TokenizeLines(const TokenizeLinesOptions& options, std::istream& in,
                                      std::ostream& out) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(options.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status();
  std::error_code ec;
  const std::string folder = std::filesystem::is_directory(options.tokenizer, ec)
                                 ? options.tokenizer
                                 : std::filesystem::path(options.tokenizer).parent_path().string();
  absl::StatusOr<ChatTemplate> chat_template = options.chat_template.empty()
                                                   ? ChatTemplate::Detect(folder)
                                                   : ChatTemplate::Named(options.chat_template);
  if (!options.chat_template.empty() && !chat_template.ok()) return chat_template.status();

  int64_t failed = 0;
  int64_t number = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++number;
    const auto fail = [&](absl::string_view what) {
      ++failed;
      out << nlohmann::json{{"error", absl::StrCat("line ", number, ": ", what)}}.dump() << "\n";
    };
    const nlohmann::json request = nlohmann::json::parse(line, nullptr, false);
    if (request.is_discarded() || !request.is_object()) {
      fail("not a JSON object");
    } else if (request.contains("text") && request["text"].is_string()) {
      absl::StatusOr<std::vector<TokenId>> ids =
          tokenizer->Encode(request["text"].get<std::string>(), options.allow_special);
      if (ids.ok()) {
        out << nlohmann::json{{"ids", *ids}}.dump() << "\n";
      } else {
        fail(ids.status().message());
      }
    } else if (request.contains("messages")) {
      absl::StatusOr<std::vector<ChatMessage>> messages = Messages(request["messages"]);
      absl::StatusOr<EncodedChat> chat =
          !messages.ok() ? absl::StatusOr<EncodedChat>(messages.status())
          : !chat_template.ok()
              ? absl::StatusOr<EncodedChat>(chat_template.status())
              : chat_template->Encode(*tokenizer, *messages,
                                      options.train_on_all ? TrainOn::kAll : TrainOn::kAssistant);
      if (chat.ok()) {
        out << nlohmann::json{{"ids", chat->ids}, {"assistant_masks", chat->supervised}}.dump()
            << "\n";
      } else {
        fail(chat.status().message());
      }
    } else {
      fail("expected {\"text\": str} or {\"messages\": [...]}");
    }
  }
  return failed;
}

}  // namespace ballast::train
