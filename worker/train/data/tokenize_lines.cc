#include "worker/train/data/tokenize_lines.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "worker/train/data/data_format.h"
#include "worker/train/data/document_encoder.h"
#include "worker/train/text/chat_template.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {

absl::StatusOr<TokenizeLinesCounts> TokenizeLines(const TokenizeLinesOptions& options,
                                                  std::istream& in, std::ostream& out) {
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

  TokenizeLinesCounts counts;
  int64_t number = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++number;
    const auto fail = [&](absl::string_view what) {
      ++counts.failed;
      out << nlohmann::json{{"error", absl::StrCat("line ", number, ": ", what)}}.dump() << "\n";
    };
    const absl::StatusOr<nlohmann::json> parsed = ParseRecord(line);
    if (!parsed.ok()) {
      fail(parsed.status().message());
      continue;
    }
    const nlohmann::json& request = *parsed;
    if (request.contains("text") && request["text"].is_string()) {
      bool special_token_text = false;
      absl::StatusOr<std::vector<TokenId>> ids =
          EncodeRecordText(*tokenizer, request["text"].get_ref<const std::string&>(),
                           options.allow_special, &special_token_text);
      if (ids.ok()) {
        counts.special_token_text += special_token_text;
        out << nlohmann::json{{"ids", *ids}}.dump() << "\n";
      } else {
        fail(ids.status().message());
      }
    } else if (request.contains("messages")) {
      absl::StatusOr<std::vector<ChatMessage>> messages =
          ParseMessages(request["messages"], "messages");
      absl::StatusOr<EncodedChat> chat =
          !messages.ok() ? absl::StatusOr<EncodedChat>(messages.status())
          : !chat_template.ok()
              ? absl::StatusOr<EncodedChat>(chat_template.status())
              : chat_template->Encode(*tokenizer, *messages,
                                      options.train_on_all ? TrainOn::kAll : TrainOn::kAssistant,
                                      options.allow_special);
      if (chat.ok()) {
        counts.special_token_text += chat->special_token_text;
        out << nlohmann::json{{"ids", chat->ids}, {"assistant_masks", chat->supervised}}.dump()
            << "\n";
      } else {
        fail(chat.status().message());
      }
    } else {
      fail("expected {\"text\": str} or {\"messages\": [...]}");
    }
  }
  return counts;
}

}  // namespace ballast::train
