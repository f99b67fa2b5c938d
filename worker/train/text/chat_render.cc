#include "worker/train/text/chat_render.h"

#include <array>

#include "absl/strings/str_cat.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

// The roles all three templates know; CheckChat names them.
constexpr std::array<std::string_view, 4> kRoles = {"system", "user", "assistant", "tool"};

// The role as a literal, so that it reads as the template's own text.
std::string_view RoleLiteral(std::string_view role) {
  for (const std::string_view known : kRoles) {
    if (role == known) return known;
  }
  return {};
}

// Python's str.isspace().
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python's str.lstrip('\n'), rstrip('\n') and strip('\n').
std::string_view LstripNewlines(std::string_view text) {
  const size_t start = text.find_first_not_of('\n');
  return start == std::string_view::npos ? std::string_view() : text.substr(start);
}
std::string_view RstripNewlines(std::string_view text) {
  const size_t last = text.find_last_not_of('\n');
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}
std::string_view StripNewlines(std::string_view text) {
  return RstripNewlines(LstripNewlines(text));
}

// Collects the pieces of one rendering.
class Pieces {
 public:
  // The template's own text.
  void Literal(std::string_view text, bool supervised = false) {
    pieces_.push_back(ChatPiece{text, supervised});
  }
  // Text from a message.
  void Content(std::string_view text, bool supervised) {
    pieces_.push_back(ChatPiece{text, supervised, /*from_message=*/true});
  }
  std::vector<ChatPiece> Take() { return std::move(pieces_); }

 private:
  std::vector<ChatPiece> pieces_;
};

// Qwen3's split of reasoning written into the content: what lies between
// the last <think> before the first </think> and that </think>, and what
// follows the last </think>.
struct ThinkSplit {
  std::string_view reasoning;
  std::string_view content;
};
ThinkSplit SplitThink(std::string_view content) {
  constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  std::string_view before = content.substr(0, content.find(kClose));
  before = RstripNewlines(before);
  if (const size_t open = before.rfind(kOpen); open != std::string_view::npos) {
    before = before.substr(open + kOpen.size());
  }
  return ThinkSplit{LstripNewlines(before),
                    LstripNewlines(content.substr(content.rfind(kClose) + kClose.size()))};
}

// An assistant message's reasoning and the content to show: the given
// reasoning (even empty) and `content`, or else the split of reasoning
// written into `content` (the message's content, as the template has it so
// far), when it has a </think>.
ThinkSplit ReasoningAndContent(const ChatMessage& message, std::string_view content) {
  if (message.reasoning.has_value()) return ThinkSplit{*message.reasoning, content};
  if (content.find("</think>") != std::string_view::npos) return SplitThink(content);
  return ThinkSplit{{}, content};
}

// The index of the last user message that is a query rather than a tool
// result wrapped as one, or -1. Qwen3.5's template trims the content (as
// Python's str.strip()) before it looks at the wrapper; Qwen3's does not.
int LastQuery(absl::Span<const ChatMessage> messages, bool trim) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string_view content =
        trim ? TrimPythonWhitespace(messages[i].content) : std::string_view(messages[i].content);
    if (messages[i].role == "user" &&
        !(content.starts_with("<tool_response>") && content.ends_with("</tool_response>"))) {
      return i;
    }
  }
  return -1;
}

// Qwen3's last query: the last message's index when there is none, as its
// template starts from.
int LastQueryIndex(absl::Span<const ChatMessage> messages) {
  const int last_query = LastQuery(messages, /*trim=*/false);
  return last_query >= 0 ? last_query : static_cast<int>(messages.size()) - 1;
}

// An assistant turn of Qwen3's template. Reasoning is shown only in the
// turns after the last query: in each that has some, and in the last turn
// always, as an empty think block when it has none.
void RenderQwen3Assistant(const ChatMessage& message, bool after_last_query, bool last,
                          Pieces* out) {
  auto [reasoning, content] = ReasoningAndContent(message, message.content);
  out->Literal("<|im_start|>assistant\n");
  if (after_last_query && (last || !reasoning.empty())) {
    const std::string_view shown = StripNewlines(reasoning);
    const bool thought = !shown.empty();
    out->Literal("<think>\n", thought);
    out->Content(shown, thought);
    out->Literal("\n</think>\n\n", thought);
    content = LstripNewlines(content);
  }
  out->Content(content, true);
  out->Literal("<|im_end|>", true);
  out->Literal("\n");
}

// An assistant turn of Qwen3.5's template. Content and reasoning are
// trimmed (Jinja's trim: str.strip()). Every turn after the last query
// shows a think block, empty when it has no reasoning; the turns before show
// none. The mask trains on what the model writes after the template's
// generation prompt ("<|im_start|>assistant\n<think>\n" when thinking):
// the reasoning, "\n</think>\n\n", the content and <|im_end|>. A block
// without reasoning is the non-thinking prompt, given, and not trained.
void RenderQwen3_5Assistant(const ChatMessage& message, bool after_last_query, Pieces* out) {
  auto [reasoning, content] = ReasoningAndContent(message, TrimPythonWhitespace(message.content));
  reasoning = TrimPythonWhitespace(reasoning);
  if (after_last_query) {
    const bool thought = !reasoning.empty();
    out->Literal("<|im_start|>assistant\n<think>\n");
    out->Content(reasoning, thought);
    out->Literal("\n</think>\n\n", thought);
  } else {
    out->Literal("<|im_start|>assistant\n");
  }
  out->Content(content, true);
  out->Literal("<|im_end|>", true);
  out->Literal("\n");
}

// Qwen3's template, or Qwen3.5's, which trims every message, shows reasoning
// differently (the two assistant renderers above) and opens the think block
// in its generation prompt.
std::vector<ChatPiece> RenderQwen(absl::Span<const ChatMessage> messages, bool qwen3_5,
                                  bool add_generation_prompt, bool enable_thinking) {
  Pieces out;
  const int count = static_cast<int>(messages.size());
  const int last_query = qwen3_5 ? LastQuery(messages, /*trim=*/true) : LastQueryIndex(messages);
  for (int i = 0; i < count; ++i) {
    const ChatMessage& message = messages[i];
    const std::string_view role = RoleLiteral(message.role);
    const std::string_view content =
        qwen3_5 ? TrimPythonWhitespace(message.content) : std::string_view(message.content);
    if (role == "assistant") {
      if (qwen3_5) {
        RenderQwen3_5Assistant(message, i > last_query, &out);
      } else {
        RenderQwen3Assistant(message, i > last_query, i == count - 1, &out);
      }
    } else if (role == "tool") {
      // Consecutive tool results share one user turn. Qwen3.5's template
      // opens it only after a message that is not a tool result, so there a
      // tool result first in the chat gets no header at all (`loop.previtem`
      // is undefined); Qwen3's opens it there too.
      if (i == 0 ? !qwen3_5 : messages[i - 1].role != "tool") out.Literal("<|im_start|>user");
      out.Literal("\n<tool_response>\n");
      out.Content(content, false);
      out.Literal("\n</tool_response>");
      if (i == count - 1 || messages[i + 1].role != "tool") out.Literal("<|im_end|>\n");
    } else {
      // user, and system: the first one is written before the loop, which
      // is the same place; Qwen3 renders a later one as it does a user turn,
      // and Qwen3.5 refuses it (CheckQwen3_5Chat).
      out.Literal("<|im_start|>");
      out.Literal(role);
      out.Literal("\n");
      out.Content(content, false);
      out.Literal("<|im_end|>\n");
    }
  }
  if (add_generation_prompt) {
    out.Literal("<|im_start|>assistant\n");
    if (!enable_thinking) {
      out.Literal("<think>\n\n</think>\n\n");
    } else if (qwen3_5) {
      out.Literal("<think>\n");
    }
  }
  return out.Take();
}

}  // namespace

absl::Status CheckChat(absl::Span<const ChatMessage> messages) {
  if (messages.empty()) return absl::InvalidArgumentError("the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (RoleLiteral(message.role).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role \"", message.role,
                                                     "\" is not one of system, user, ",
                                                     "assistant, tool"));
    }
    if (!IsValidUtf8(message.content)) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].content is not valid UTF-8"));
    }
    if (message.reasoning.has_value() && !IsValidUtf8(*message.reasoning)) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].reasoning is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

std::vector<ChatPiece> RenderQwen3(absl::Span<const ChatMessage> messages,
                                   bool add_generation_prompt, bool enable_thinking) {
  return RenderQwen(messages, /*qwen3_5=*/false, add_generation_prompt, enable_thinking);
}

absl::Status CheckQwen3_5Chat(absl::Span<const ChatMessage> messages) {
  // In the template's order: it looks for the query first.
  if (LastQuery(messages, /*trim=*/true) < 0) {
    return absl::InvalidArgumentError(
        "the conversation has no user query (a user message other than a "
        "<tool_response>...</tool_response> result); the qwen3_5 template refuses it "
        "(\"No user query found in messages.\")");
  }
  for (size_t i = 1; i < messages.size(); ++i) {
    if (messages[i].role == "system") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i,
                       "] is a system message after the first message; the qwen3_5 template "
                       "refuses it (\"System message must be at the beginning.\")"));
    }
  }
  return absl::OkStatus();
}

std::vector<ChatPiece> RenderQwen3_5(absl::Span<const ChatMessage> messages,
                                     bool add_generation_prompt, bool enable_thinking) {
  return RenderQwen(messages, /*qwen3_5=*/true, add_generation_prompt, enable_thinking);
}

std::vector<ChatPiece> RenderChatml(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt) {
  Pieces out;
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const std::string_view role = RoleLiteral(messages[i].role);
    const bool assistant = role == "assistant";
    out.Literal("<|im_start|>");
    out.Literal(role);
    out.Literal("\n");
    out.Content(messages[i].content, assistant);
    out.Literal("<|im_end|>", assistant);
    out.Literal("\n");
  }
  if (add_generation_prompt) out.Literal("<|im_start|>assistant\n");
  return out.Take();
}

std::vector<ChatPiece> RenderLlama3(absl::Span<const ChatMessage> messages,
                                    bool add_generation_prompt) {
  Pieces out;
  out.Literal("<|begin_of_text|>");
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const std::string_view role = RoleLiteral(messages[i].role);
    const bool assistant = role == "assistant";
    out.Literal("<|start_header_id|>");
    out.Literal(role);
    out.Literal("<|end_header_id|>\n\n");
    out.Content(TrimPythonWhitespace(messages[i].content), assistant);
    out.Literal("<|eot_id|>", assistant);
  }
  if (add_generation_prompt) out.Literal("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out.Take();
}

std::string_view TrimPythonWhitespace(std::string_view text) {
  size_t start = 0;
  while (start < text.size()) {
    size_t next = start;
    if (!IsPythonSpace(NextCodePoint(text, &next))) break;
    start = next;
  }
  size_t end = text.size();
  while (end > start) {
    size_t lead = end - 1;
    while (lead > start && (static_cast<uint8_t>(text[lead]) & 0xC0) == 0x80) --lead;
    size_t pos = lead;
    if (!IsPythonSpace(NextCodePoint(text, &pos))) break;
    end = lead;
  }
  return text.substr(start, end - start);
}

}  // namespace ballast::train
