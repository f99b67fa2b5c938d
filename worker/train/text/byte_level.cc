#include "worker/train/text/byte_level.h"

#include <array>

#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

bool StandsForItself(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

struct Alphabet {
  std::array<char32_t, 256> symbol;
  // Indexed by code point: every symbol is below U+0100 + 68.
  std::array<int16_t, 0x100 + 68> byte;
};

const Alphabet& TheAlphabet() {
  static const Alphabet alphabet = [] {
    Alphabet a;
    a.byte.fill(-1);
    char32_t next_shifted = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
      a.symbol[byte] = StandsForItself(byte) ? static_cast<char32_t>(byte) : next_shifted++;
      a.byte[a.symbol[byte]] = static_cast<int16_t>(byte);
    }
    return a;
  }();
  return alphabet;
}

}  // namespace

char32_t ByteSymbol(uint8_t byte) { return TheAlphabet().symbol[byte]; }

std::optional<uint8_t> SymbolByte(char32_t symbol) {
  const Alphabet& alphabet = TheAlphabet();
  if (symbol >= alphabet.byte.size() || alphabet.byte[symbol] < 0) return std::nullopt;
  return static_cast<uint8_t>(alphabet.byte[symbol]);
}

std::string BytesToSymbols(std::string_view bytes) {
  std::string symbols;
  symbols.reserve(bytes.size() * 2);
  for (const char byte : bytes) AppendUtf8(ByteSymbol(static_cast<uint8_t>(byte)), &symbols);
  return symbols;
}

void AppendTokenBytes(std::string_view token, std::string* out) {
  const size_t start = out->size();
  for (size_t pos = 0; pos < token.size();) {
    const std::optional<uint8_t> byte = SymbolByte(NextCodePoint(token, &pos));
    if (!byte) {
      out->resize(start);
      out->append(token);
      return;
    }
    out->push_back(static_cast<char>(*byte));
  }
}

}  // namespace ballast::train
