#include "worker/train/text/byte_level.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

TEST(ByteLevel, PrintableBytesStandForThemselvesAndTheRestShiftPastU0100) {
  EXPECT_EQ(ByteSymbol('a'), U'a');
  EXPECT_EQ(ByteSymbol('!'), U'!');
  EXPECT_EQ(ByteSymbol(0xA1), U'\u00A1');
  EXPECT_EQ(ByteSymbol(0xFF), U'\u00FF');
  EXPECT_EQ(ByteSymbol(0x00), U'\u0100');
  EXPECT_EQ(ByteSymbol(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(ByteSymbol('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(ByteSymbol(0x7F), U'\u0121');
  EXPECT_EQ(ByteSymbol(0xAD), U'\u0143');  // the 68th and last shifted byte
}

TEST(ByteLevel, MapIsABijectionOnTheBytes) {
  std::set<char32_t> symbols;
  for (int byte = 0; byte < 256; ++byte) {
    const char32_t symbol = ByteSymbol(static_cast<uint8_t>(byte));
    symbols.insert(symbol);
    ASSERT_EQ(SymbolByte(symbol), byte);
  }
  EXPECT_EQ(symbols.size(), 256u);
  EXPECT_EQ(SymbolByte(U'\u0144'), std::nullopt);
  EXPECT_EQ(SymbolByte(U'\u00AD'), std::nullopt);  // 0xAD itself is shifted
  EXPECT_EQ(SymbolByte(U'語'), std::nullopt);
}

TEST(ByteLevel, BytesToSymbolsSpellsEachByte) {
  EXPECT_EQ(BytesToSymbols("a b\n"), "a\u0120b\u010A");
  EXPECT_EQ(BytesToSymbols("\xC3\xA9"), "\u00C3\u00A9");  // é
}

TEST(ByteLevel, TokenBytesAreCopiedWhenATokenIsNotAllSymbols) {
  std::string out;
  AppendTokenBytes("\u0120hi", &out);
  EXPECT_EQ(out, " hi");
  out.clear();
  AppendTokenBytes("<|im_end|>", &out);
  EXPECT_EQ(out, "<|im_end|>");
  out.clear();
  AppendTokenBytes("<a b>", &out);  // a raw space is not a symbol
  EXPECT_EQ(out, "<a b>");
  out.clear();
  AppendTokenBytes("x\u4E2D", &out);
  EXPECT_EQ(out, "x\u4E2D");
}

TEST(Utf8, ValidityRejectsOverlongsSurrogatesAndCuts) {
  EXPECT_TRUE(IsValidUtf8("plain \u00E9 \u4E2D \U0001F600"));
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong NUL
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xE4\xB8"));          // cut short
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // above U+10FFFF
}

TEST(Utf8, LossyReplacesEachMaximalIllFormedSubpartAsRustDoes) {
  const std::string fffd = "\uFFFD";
  EXPECT_EQ(Utf8Lossy("ok \u4E2D"), "ok \u4E2D");
  EXPECT_EQ(Utf8Lossy("\xE4\xB8"), fffd);  // one cut character, one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xF0\x9F"
                      "A"),
            fffd + "A");
  EXPECT_EQ(Utf8Lossy("\xC0\x80"), fffd + fffd);  // C0 never starts a sequence
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(Utf8Lossy("\x80\xBF"), fffd + fffd);
}

TEST(Utf8, NextCodePointWalksAndAppendUtf8Inverts) {
  const std::string text = "a\u00E9\u4E2D\U0001F600";
  size_t pos = 0;
  std::string rebuilt;
  std::vector<char32_t> code_points;
  while (pos < text.size()) {
    code_points.push_back(NextCodePoint(text, &pos));
    AppendUtf8(code_points.back(), &rebuilt);
  }
  EXPECT_EQ(code_points, (std::vector<char32_t>{U'a', U'\u00E9', U'\u4E2D', U'\U0001F600'}));
  EXPECT_EQ(rebuilt, text);
}

}  // namespace
}  // namespace ballast::train
