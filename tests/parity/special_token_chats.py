"""The reference for a chat whose messages hold special-token text, which
Ballast encodes as plain text while the template's own control tokens stay
(docs/data.md): HF's rendered chat cut at the template's control tokens,
each stretch between them encoded by `tokenizers` with
encode_special_tokens=True.

Which control tokens are the template's: the messages' special-token text is
first replaced by private-use placeholders, so every special token left in
the rendering is the template's; Jinja's strip and the think split treat a
placeholder as they treat the token's text (neither is whitespace, nor
</think>). The placeholders are put back before encoding."""
import re


def plain_chat_ids(hf, plain, messages, specials, **kwargs):
    """`hf`: a transformers tokenizer with the chat template; `plain`: a
    `tokenizers.Tokenizer` with encode_special_tokens=True; `specials`: the
    special tokens' contents; kwargs go to apply_chat_template."""
    longest_first = sorted(specials, key=len, reverse=True)
    control = re.compile("|".join(re.escape(t) for t in longest_first))
    # From the end of Supplementary Private Use Area-B, which no draw uses.
    placeholders = {t: chr(0x10FFFD - i) for i, t in enumerate(longest_first)}
    back = {p: t for t, p in placeholders.items()}

    def hide(text):
        return control.sub(lambda m: placeholders[m.group()], text)

    hidden = [{k: hide(v) if isinstance(v, str) and k != "role" else v for k, v in m.items()}
              for m in messages]
    assert not any(p in str(messages) for p in back), "a message holds a placeholder"
    text = hf.apply_chat_template(hidden, tokenize=False, **kwargs)
    ids, at = [], 0

    def encode(stretch):
        stretch = "".join(back.get(c, c) for c in stretch)
        if stretch:
            ids.extend(plain.encode(stretch, add_special_tokens=False).ids)

    for m in control.finditer(text):
        encode(text[at:m.start()])
        ids.append(plain.token_to_id(m.group()))
        at = m.end()
    encode(text[at:])
    return ids
