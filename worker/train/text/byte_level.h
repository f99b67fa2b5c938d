// The GPT-2 byte-level alphabet (`bytes_to_unicode`): every byte gets a
// printable code point, so a byte-level BPE vocabulary is a set of strings
// over 256 symbols. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for
// themselves; the other 68 bytes, in ascending order, take U+0100 onwards
// (space is U+0120 'Ġ', '\n' is U+010A 'Ċ'). Thread-safe.
#ifndef BALLAST_WORKER_TRAIN_TEXT_BYTE_LEVEL_H_
#define BALLAST_WORKER_TRAIN_TEXT_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ballast::train {

// The code point that stands for `byte`.
char32_t ByteSymbol(uint8_t byte);

// The byte that `symbol` stands for; nullopt for a code point outside the
// alphabet.
std::optional<uint8_t> SymbolByte(char32_t symbol);

// `bytes` spelt in the alphabet, as UTF-8: what the ByteLevel pre-tokenizer
// hands to the model.
std::string BytesToSymbols(std::string_view bytes);

// Appends the bytes of one token to `out` as the ByteLevel decoder does: the
// bytes its symbols stand for when every code point of `token` is in the
// alphabet, else `token` unchanged (an added token such as "<|im_end|>" is
// all symbols; one with a space or CJK in it is copied as it is).
void AppendTokenBytes(std::string_view token, std::string* out);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_BYTE_LEVEL_H_
