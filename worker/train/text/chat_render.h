// The built-in chat templates of chat_template.h, rendered as pieces: each
// piece is either the template's own text or a stretch of one message, and
// knows whether the loss trains on it. Joined, the pieces are the text that
// transformers' apply_chat_template renders; ChatTemplate::Encode maps them
// onto the tokens. Stateless and thread-safe; the pieces point into the
// messages and into literals, so they live as long as the messages.
#ifndef BALLAST_WORKER_TRAIN_TEXT_CHAT_RENDER_H_
#define BALLAST_WORKER_TRAIN_TEXT_CHAT_RENDER_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/train/text/chat_template.h"

namespace ballast::train {

struct ChatPiece {
  std::string_view text;
  bool supervised;  // in an assistant turn's trained span
  // A message's text rather than the template's: the text whose special
  // tokens stay plain unless the caller allows them.
  bool from_message = false;
};

// OK when every message has one of the four roles and UTF-8 text, and there
// is at least one; else INVALID_ARGUMENT naming the message and the field.
// The renderers below expect messages that passed.
absl::Status CheckChat(absl::Span<const ChatMessage> messages);

// The checks that Qwen3.5's template makes before it renders anything:
// INVALID_ARGUMENT naming the message for a system message after the first,
// and for a conversation without a user query (a user message that is not a
// tool result wrapped in <tool_response>...</tool_response>), where the
// template raises. `messages` passed CheckChat.
absl::Status CheckQwen3_5Chat(absl::Span<const ChatMessage> messages);

// Qwen3's template, without tools. `enable_thinking` false closes an empty
// think block in the generation prompt.
std::vector<ChatPiece> RenderQwen3(absl::Span<const ChatMessage> messages,
                                   bool add_generation_prompt, bool enable_thinking);

// Qwen3.5's template, without tools and images, for messages that passed
// CheckQwen3_5Chat. The generation prompt opens a think block, or with
// `enable_thinking` false holds an empty one.
std::vector<ChatPiece> RenderQwen3_5(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt, bool enable_thinking);

// ChatML, as Qwen2's and many others' templates without a default system.
std::vector<ChatPiece> RenderChatml(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt);

// Llama 3.0 instruct, with <|begin_of_text|> as the bos_token.
std::vector<ChatPiece> RenderLlama3(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt);

// `text` without the leading and trailing characters that Python's
// str.strip() removes, which is what Jinja's `trim` filter calls:
// str.isspace(), Unicode White_Space and also U+001C..U+001F (Python counts
// the bidi classes B and S). `text` is valid UTF-8.
std::string_view TrimPythonWhitespace(std::string_view text);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_CHAT_RENDER_H_
