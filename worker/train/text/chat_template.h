// ChatTemplate: the built-in chat templates that turn a conversation into
// training text, with a per-token mask of what the loss trains on. Each one
// renders exactly what transformers' apply_chat_template renders with the
// model's own Jinja template, and encodes to the same ids:
//  - "qwen3": Qwen3's template without tools (the `tool` role is kept):
//    reasoning is shown in the assistant turns after the last user query
//    and dropped before it; the last turn always gets a think block, empty
//    when it has no reasoning.
//  - "qwen3_5": Qwen3.5's template (Qwen/Qwen3.5-* chat_template.jinja)
//    without tools and images (the `tool` role is kept). Each message's
//    text is trimmed as Python's str.strip() does; every assistant turn
//    after the last user query gets a think block, empty when it has no
//    reasoning (the non-thinking form), and the turns before it get none.
//    A system message after the first, and a chat without a user query,
//    are refused, as the template raises on them.
//  - "chatml": <|im_start|>{role}\n{content}<|im_end|>\n per message.
//  - "llama3": Llama 3.0 instruct: <|begin_of_text|>, then per message
//    <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>.
//    Llama 3.1+ templates add a system header with dates; that is not this
//    template, and Detect cannot tell them apart (see there).
//
// The mask (TrainOn::kAssistant) supervises each assistant turn's content and
// its end-of-turn token (<|im_end|> or <|eot_id|>), and a qwen3 think block
// when it holds reasoning; not the headers, not the empty think block of a
// turn without reasoning (nothing to learn there but the template), not the
// "\n" after <|im_end|>. In each case that is what the model writes after
// the template's generation prompt; so for qwen3_5, whose prompt already
// opens the think block, a block with reasoning is trained from the
// reasoning on, without its "<think>\n". The rendered text is tokenized
// whole, as apply_chat_template does (the regex can join a header's "\n" to
// a "\n" that content starts with), and a token is supervised when its last
// byte lies in a supervised span.
//
// A message's text that holds a special token's content is encoded as plain
// text unless Encode is told to allow special tokens: apply_chat_template
// would turn it into a control token, and training data must not unless its
// user says so, while the template's own control tokens around it stay
// control tokens. When allowed, it becomes that control token, as in
// apply_chat_template. (A special token that only forms across a boundary
// of message and template, such as one spelt "x<|im_end|>", is not looked
// for; no known vocabulary has one.)
//
// Thread-safe: a ChatTemplate is an immutable value.
#ifndef BALLAST_WORKER_TRAIN_TEXT_CHAT_TEMPLATE_H_
#define BALLAST_WORKER_TRAIN_TEXT_CHAT_TEMPLATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::train {

struct ChatPiece;  // chat_render.h

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // The record's reasoning_content, when it has one (qwen3 and qwen3_5 only;
  // the other templates ignore it, as theirs do).
  std::optional<std::string> reasoning;
};

// Which tokens the loss trains on.
enum class TrainOn { kAssistant, kAll };

struct EncodedChat {
  std::vector<TokenId> ids;
  std::vector<uint8_t> supervised;  // per id: 1 = trained on
  // Whether a message's text held a special token's text: plain text, or
  // that token when Encode allowed special tokens.
  bool special_token_text = false;
};

class ChatTemplate {
 public:
  // "qwen3", "qwen3_5", "chatml" or "llama3"; INVALID_ARGUMENT listing
  // those otherwise.
  static absl::StatusOr<ChatTemplate> Named(std::string_view name);

  // The built-in that matches the "chat_template" of
  // `model_dir`/tokenizer_config.json (or of that file when given a file;
  // from chat_template.jinja beside it when the config has none, as newer
  // transformers save it): qwen3_5 when it has <|im_start|>, <think> and
  // Qwen3.5's `reasoning_content|trim`, qwen3 when <|im_start|> and <think>
  // only, chatml when <|im_start|> only, llama3 when <|start_header_id|>
  // (also a 3.1+ template, which renders dates that llama3 does not).
  // NOT_FOUND when the file or its chat_template is missing;
  // INVALID_ARGUMENT naming the file when it is not JSON or no built-in
  // matches.
  static absl::StatusOr<ChatTemplate> Detect(const std::string& model_dir);

  std::string_view name() const { return name_; }

  // Exactly the text that apply_chat_template(messages, tokenize=False,
  // add_generation_prompt=..., enable_thinking=...) renders with this
  // template's Jinja text. `enable_thinking` changes only qwen3's and
  // qwen3_5's generation prompt (false: an empty think block in it), so
  // training data, which has none, renders the same either way.
  // INVALID_ARGUMENT naming the message for a role other than the four, an
  // empty conversation, text that is not valid UTF-8, or what the template
  // refuses (qwen3_5: see the class comment).
  absl::StatusOr<std::string> Render(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt, bool enable_thinking = true) const;

  // Render() (no generation prompt) tokenized whole, as
  // apply_chat_template(tokenize=True) does, with the mask of the class
  // comment; special-token text in the messages is plain text unless
  // `allow_special`. INVALID_ARGUMENT as Render; INTERNAL when the tokens
  // do not line up with the rendered pieces (a tokenizer whose normalizer
  // joins text across a template boundary), rather than a wrong mask.
  absl::StatusOr<EncodedChat> Encode(const Tokenizer& tokenizer,
                                     absl::Span<const ChatMessage> messages, TrainOn train_on,
                                     bool allow_special) const;

 private:
  enum class Kind { kQwen3, kQwen3_5, kChatml, kLlama3 };
  ChatTemplate(std::string_view name, Kind kind) : name_(name), kind_(kind) {}

  // OK when this template renders `messages`; else INVALID_ARGUMENT as
  // Render.
  absl::Status Check(absl::Span<const ChatMessage> messages) const;

  // The rendering of `messages`, which passed Check.
  std::vector<ChatPiece> Pieces(absl::Span<const ChatMessage> messages, bool add_generation_prompt,
                                bool enable_thinking) const;

  // INVALID_ARGUMENT when `tokenizer` lacks a control token of this template.
  absl::Status CheckTokenizer(const Tokenizer& tokenizer) const;

  std::string_view name_;  // a literal
  Kind kind_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_CHAT_TEMPLATE_H_
