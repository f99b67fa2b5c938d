"""The built-in `qwen3_5` chat template (worker/train/text/chat_render.cc,
through build/bin/tokenize_check --chat qwen3_5) against transformers 5.23's
apply_chat_template with Qwen3.5's own template and tokenizer (runs under
build/hf5), on random conversations drawn fresh on every run (the seed is
printed on failure):

- the rendered text equals apply_chat_template(tokenize=False), with and
  without a generation prompt, enable_thinking true, false or unset;
- the ids equal apply_chat_template(tokenize=True) of Qwen3_5Tokenizer;
- the assistant mask equals return_assistant_tokens_mask of a copy of the
  template marked with {% generation %} (Qwen3.5's has no marks): each
  assistant turn's content and <|im_end|>, and after the last query the
  reasoning and "\\n</think>\\n\\n" when it has reasoning. That is what the
  model writes after the template's generation prompt, which ends in
  "<think>\\n" (thinking) or in an empty think block (non-thinking); the
  marked copy must render the same text as the real one;
- what the template raises on (a system message after the first, no user
  query) is an error with the template's words.

The conversations are test_chat_template.py's, with what Qwen3.5's template
treats apart: padding that str.strip() takes, reasoning in the content, tool
results (first in the chat too), user turns that wrap a tool result, later
system messages and chats without a query.

The template is tests/parity/qwen3_5_chat_template.jinja: the text of
Qwen3.5's chat_template.jinja, byte for byte. No hub here; it was found with
the code search, in two places that agree: the chat_template of
Qwen/Qwen3.5-27B's tokenizer_config.json as copied into a Python module, and
mlx-community/Qwen3.5-35B-A3B-4bit/chat_template.jinja as copied into a test
fixture with its SHA-256, a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715,
which the file has. Qwen3.5-4B's lines are cited elsewhere at the same line
numbers (122, the tool-call arguments; 149-152, enable_thinking).
"""
import hashlib
import json
import os
import subprocess

import pytest
import trained_tokenizers
from test_chat_template import compare
from trained_tokenizers import QWEN3_5_CHAT_TEMPLATE, require_transformers_5

require_transformers_5()
from transformers import AutoTokenizer  # noqa: E402

SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"

with open(QWEN3_5_CHAT_TEMPLATE) as f:
    QWEN3_5 = f.read()

# The assistant branch of Qwen3.5's template from its think-block test to
# <|im_end|>, and the same with the trained spans marked. The marked copy
# leaves out tool_calls, which the built-in does not render (records carry
# none that it reads); the text comparison below would show a difference.
QWEN3_5_ASSISTANT = r"""
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
"""
QWEN3_5_TOOL_CALLS_TO_IM_END = (
    "        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls "
    "is not mapping %}")
QWEN3_5_ASSISTANT_MARKED = r"""
        {%- if loop.index0 > ns.last_query_index and reasoning_content %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' }}
            {%- generation %}{{- reasoning_content + '\n</think>\n\n' + content + '<|im_end|>' }}{%- endgeneration %}
        {%- elif loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n\n</think>\n\n' }}
            {%- generation %}{{- content + '<|im_end|>' }}{%- endgeneration %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' }}
            {%- generation %}{{- content + '<|im_end|>' }}{%- endgeneration %}
        {%- endif %}
        {{- '\n' }}
"""


def marked_template():
    start = QWEN3_5.index(QWEN3_5_ASSISTANT.strip("\n"))
    im_end = "        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}"
    end = QWEN3_5.index(im_end, start)
    assert QWEN3_5.count(QWEN3_5_ASSISTANT.strip("\n")) == 1
    assert QWEN3_5_TOOL_CALLS_TO_IM_END in QWEN3_5[start:end]
    return (QWEN3_5[:start] + QWEN3_5_ASSISTANT_MARKED.strip("\n") + "\n" +
            QWEN3_5[end + im_end.index("    {%- elif"):])


# ----------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("qwen3_5"))
    trained_tokenizers.qwen3_5_folder(out)
    return out


def test_the_template_file_is_qwen3_5s():
    assert hashlib.sha256(QWEN3_5.encode()).hexdigest() == SHA256
    assert "reasoning_content|trim" in QWEN3_5  # what ChatTemplate::Detect looks for


def test_qwen3_5_template_matches_transformers(folder):
    real = AutoTokenizer.from_pretrained(folder)
    assert type(real).__name__ == "Qwen3_5Tokenizer" and real.chat_template == QWEN3_5
    marked = AutoTokenizer.from_pretrained(folder)
    marked.chat_template = marked_template()
    added = [t.content for t in real.added_tokens_decoder.values() if not t.special]
    specials = [t.content for t in real.added_tokens_decoder.values() if t.special]
    expected = compare(folder, "qwen3_5", real, marked, specials, added)
    # Both of the template's own errors are reached.
    raised = {w["raises"] for w in expected if "raises" in w}
    assert raised == {"System message must be at the beginning.",
                      "No user query found in messages."}, raised
    # And both thinking forms of the last turn: a block with reasoning, and
    # the empty block of a turn without.
    texts = [w.get("text", "") for w in expected]
    assert any("<think>\n\n</think>\n\n" in t for t in texts)
    assert any("<think>\n" in t and "<think>\n\n</think>" not in t for t in texts)


def test_ballast_train_tokenize_detects_qwen3_5_and_trains_what_the_docs_say(folder):
    """The user's path: `ballast-train tokenize` on a Qwen3.5 folder, with the
    template detected from its tokenizer_config.json. The thinking form
    trains from the reasoning on, the non-thinking form only the answer
    (docs/data.md, "Qwen3.5")."""
    binary = os.path.join(os.environ.get("BALLAST_BIN_DIR", "build/bin"), "ballast-train")
    user = {"role": "user", "content": "2+2?"}
    chats = [[user, {"role": "assistant", "reasoning_content": "Add them.", "content": "4"}],
             [user, {"role": "assistant", "content": "4"}],
             [user, {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"}],
             [{"role": "system", "content": "Be brief."}, user,
              {"role": "assistant", "reasoning_content": "dropped", "content": "4"},
              {"role": "user", "content": "3+3?"},
              {"role": "assistant", "reasoning_content": "Add again.", "content": "6"}]]
    proc = subprocess.run([binary, "tokenize", "--tokenizer", folder],
                          input="".join(json.dumps({"messages": c}) + "\n" for c in chats),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    replies = [json.loads(line) for line in proc.stdout.split("\n")[:-1]]
    real = AutoTokenizer.from_pretrained(folder)
    marked = AutoTokenizer.from_pretrained(folder)
    marked.chat_template = marked_template()

    def trained(reply):  # the trained tokens, decoded together
        return real.decode([i for i, m in zip(reply["ids"], reply["assistant_masks"]) if m])

    for chat, reply in zip(chats, replies):
        assert reply["ids"] == real.apply_chat_template(chat, tokenize=True, return_dict=False)
        assert reply["assistant_masks"] == marked.apply_chat_template(
            chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)[
                "assistant_masks"]
    assert trained(replies[0]) == "Add them.\n</think>\n\n4<|im_end|>"
    assert trained(replies[1]) == "4<|im_end|>"
    assert trained(replies[2]) == trained(replies[0])
    assert trained(replies[3]) == "4<|im_end|>Add again.\n</think>\n\n6<|im_end|>"
