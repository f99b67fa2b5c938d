#include "worker/train/text/oniguruma_classes.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

// The code points that Oniguruma (tokenizers 0.22.2) puts in each class and
// PCRE2 10.42 does not, as PCRE2 class items. Found by matching every code
// point against the class in both; the parity test
// (tests/parity/test_tokenizer.py) probes every code point again, so a
// change on either side fails there.
constexpr char kExtraLetters[] =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{1123F}-\x{11240}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{11F02}\x{11F04}-\x{11F10}\x{11F12}-\x{11F33}\x{1342F}\x{13441}-\x{13446}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1B132}\x{1B155}\x{1DF25}-\x{1DF2A}\x{1E030}-\x{1E06D}\x{1E4D0}-\x{1E4EB}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2B739}\x{2EBF0}-\x{2EE5D}\x{31350}-\x{323AF})";
constexpr char kExtraNumbers[] =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{11F50}-\x{11F59}\x{16130}-\x{16139}\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1D2C0}-\x{1D2D3}\x{1E4F0}-\x{1E4F9}\x{1E5F1}-\x{1E5FA})";
constexpr char kExtraMarks[] =
    R"(\x{897}\x{CF3}\x{ECE}\x{10D69}-\x{10D6D}\x{10EFC}-\x{10EFF}\x{11241}\x{113B8}-\x{113C0}\x{113C2}\x{113C5}\x{113C7}-\x{113CA}\x{113CC}-\x{113D0}\x{113D2}\x{113E1}-\x{113E2}\x{11F00}-\x{11F01}\x{11F03}\x{11F34}-\x{11F3A}\x{11F3E}-\x{11F42}\x{11F5A}\x{13440}\x{13447}-\x{13455}\x{1611E}-\x{1612F}\x{1E08F}\x{1E4EC}-\x{1E4EF}\x{1E5EE}-\x{1E5EF})";

// Unicode White_Space: Oniguruma's \s.
constexpr char kWhiteSpace[] =
    R"(\t\n\x0B\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

absl::Status Refused(std::string_view escape, const char* why) {
  return absl::InvalidArgumentError(absl::StrCat("pre_tokenizer Split regex uses ",
                                                 std::string(escape), ", which is not supported (",
                                                 why, ")"));
}

}  // namespace

absl::StatusOr<std::string> OnigurumaClassesForPcre2(std::string_view regex) {
  constexpr char kDiffers[] = "its set differs between Oniguruma and PCRE2";
  std::string out;
  bool in_class = false;
  size_t class_first = 0;  // where a ']' is still a literal, right after '[' or '[^'
  for (size_t i = 0; i < regex.size(); ++i) {
    const char c = regex[i];
    if (c != '\\' || i + 1 == regex.size()) {
      if (!in_class && c == '[') {
        in_class = true;
        out += c;
        if (i + 1 < regex.size() && regex[i + 1] == '^') out += regex[++i];
        class_first = i + 1;
        continue;
      }
      // Ruby syntax, which Oniguruma follows in `tokenizers`, nests classes
      // and intersects them with && where PCRE2 reads literals; its ^ and $
      // match at every line, and its (?m) is PCRE2's (?s).
      if (in_class && c == '[') return Refused("'[' inside [...]", kDiffers);
      if (in_class && c == '&' && i + 1 < regex.size() && regex[i + 1] == '&') {
        return Refused("&& inside [...]", kDiffers);
      }
      if (!in_class && (c == '^' || c == '$')) {
        return Refused(regex.substr(i, 1), "Oniguruma anchors it at every line");
      }
      if (!in_class && c == '(' && i + 2 < regex.size() && regex[i + 1] == '?') {
        const size_t end =
            regex.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-", i + 2);
        const std::string_view options = regex.substr(
            i + 2, end == std::string_view::npos ? std::string_view::npos : end - i - 2);
        if (options.find_first_not_of("i-") != std::string_view::npos) {
          return Refused(absl::StrCat("(?", std::string(options)), "only the option i is");
        }
      }
      if (in_class && c == ']' && i != class_first) in_class = false;
      out += c;
      continue;
    }
    const char escape = regex[++i];
    if (escape == 'p' || escape == 'P') {
      const size_t close = regex.find('}', i);
      if (i + 1 >= regex.size() || regex[i + 1] != '{' || close == std::string_view::npos) {
        return Refused(regex.substr(i - 1, 2), "write the class as \\p{L}, \\p{N} or \\p{M}");
      }
      const std::string_view name = regex.substr(i + 2, close - i - 2);
      const char* extra = name == "L"   ? kExtraLetters
                          : name == "N" ? kExtraNumbers
                          : name == "M" ? kExtraMarks
                                        : nullptr;
      if (extra == nullptr) {
        return Refused(regex.substr(i - 1, close - i + 2), "only \\p{L}, \\p{N} and \\p{M} are");
      }
      const std::string set = absl::StrCat("\\p{", std::string(name), "}", extra);
      if (escape == 'p') {
        out += in_class ? set : absl::StrCat("[", set, "]");
      } else if (in_class) {
        return Refused(regex.substr(i - 1, close - i + 2), "a negated class inside [...]");
      } else {
        out += absl::StrCat("[^", set, "]");
      }
      i = close;
    } else if (escape == 's') {
      out += in_class ? std::string(kWhiteSpace) : absl::StrCat("[", kWhiteSpace, "]");
    } else if (escape == 'S') {
      if (in_class) return Refused("\\S", "a negated class inside [...]");
      out += absl::StrCat("[^", kWhiteSpace, "]");
    } else if (std::strchr("wWdDbBhHvVRXQ", escape) != nullptr) {
      return Refused(regex.substr(i - 1, 2), kDiffers);
    } else {
      out += c;
      out += escape;
    }
  }
  return out;
}

}  // namespace ballast::train
