"""The built-in chat templates (worker/train/text/chat_template.h, through
build/bin/tokenize_check --chat) against transformers' apply_chat_template
with each model's own Jinja template, on random conversations drawn fresh on
every run (the seed is printed on failure):

- the rendered text equals apply_chat_template(tokenize=False);
- the ids equal apply_chat_template(tokenize=True), which tokenizes the whole
  text at once;
- the assistant mask equals the one transformers computes itself
  (return_assistant_tokens_mask) with a copy of the template whose
  assistant spans are marked with {% generation %}: the span of each
  assistant turn is its content and end-of-turn token, and a qwen3 think
  block that holds reasoning. The marked copy must render the same text as
  the real template, so the marks cannot move the text.

Tokenizers come from trained_tokenizers.py: the Qwen-style one for qwen3 and
chatml, the Llama-3-style one for llama3.
"""
import json
import random
import time

import pytest
from special_token_chats import plain_chat_ids
from tokenizers import Tokenizer
from trained_tokenizers import llama3_style, qwen_style, run_tool
from trained_tokenizers import random_text as random_tokenizer_text

CONVERSATIONS = 1000

# ----------------------------------------------------------------------------
# The templates
# ----------------------------------------------------------------------------

# Qwen3's chat_template (Qwen/Qwen3-8B tokenizer_config.json) without the
# tools branches: the `tools` system block and the tool_calls of assistant
# turns. The rest is as published, whitespace control included.
QWEN3 = r"""
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""".strip()

# The assistant branch of QWEN3 from its think-block test on, and the same
# with the supervised spans marked: the think block only when it holds
# reasoning, then the content and <|im_end|>, never the "\n" after it.
QWEN3_ASSISTANT = r"""
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
"""
QWEN3_ASSISTANT_MARKED = r"""
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {%- if reasoning_content.strip('\n') %}
                {%- generation %}{{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') + '<|im_end|>' }}{%- endgeneration %}
            {%- else %}
                {{- '<think>\n\n</think>\n\n' }}
                {%- generation %}{{- content.lstrip('\n') + '<|im_end|>' }}{%- endgeneration %}
            {%- endif %}
        {%- else %}
            {%- generation %}{{- content + '<|im_end|>' }}{%- endgeneration %}
        {%- endif %}
        {{- '\n' }}
"""
assert QWEN3.count(QWEN3_ASSISTANT.strip("\n")) == 1
QWEN3_MARKED = QWEN3.replace(QWEN3_ASSISTANT.strip("\n"), QWEN3_ASSISTANT_MARKED.strip("\n"))

# The ChatML template as the task defines `chatml`.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_MARKED = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
                 "{% if message['role'] == 'assistant' %}{% generation %}"
                 "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
                 "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")

# Meta-Llama-3-8B-Instruct's chat_template (Llama 3.0; 3.1 adds dates).
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")
LLAMA3_MARKED = ("{{ bos_token }}{% for message in messages %}"
                 "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
                 "{% if message['role'] == 'assistant' %}{% generation %}"
                 "{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
                 "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

TEMPLATES = {"qwen3": (QWEN3, QWEN3_MARKED), "chatml": (CHATML, CHATML_MARKED),
             "llama3": (LLAMA3, LLAMA3_MARKED)}

# ----------------------------------------------------------------------------
# Random conversations
# ----------------------------------------------------------------------------

# What content may start and end with: the newlines that Qwen3's template
# strips, and the Python whitespace that Llama 3's trim takes (U+001C and
# U+0085 too, but not U+200B).
PADDING = ["", "", "", "\n", "\n\n", " ", "  \n", "\t", "\u3000", "\x85", "\u2028", "\x1c",
           "\u200b", " \n \n"]
WORDS = ["Hello", "world", "the answer is", "42", "日本語", "中文字符", "😀", "👨‍👩‍👧‍👦",
         "café", "e\u0301", "\u0338", "=>", "x_1", "  ", "\n", "\n\n"]


def random_text(rng, added):
    """Short text, often padded, with the tokenizer's non-special added
    tokens mixed in (Qwen's <think>, an lstrip token that eats the header's
    "\\n") and the whole alphabet of trained_tokenizers' random text."""
    kind = rng.random()
    if kind < 0.1:
        body = ""
    elif kind < 0.5:
        body = " ".join(rng.choice(WORDS + added) for _ in range(rng.randint(1, 8)))
    else:
        body = random_tokenizer_text(rng, added)
    return rng.choice(PADDING) + body + rng.choice(PADDING)


def random_reasoning(rng, added):
    return rng.choice(["", "\n", "\n\n", " \n ", random_text(rng, added),
                       random_text(rng, added)])


def random_assistant(rng, template, added):
    message = {"role": "assistant", "content": random_text(rng, added)}
    roll = rng.random()
    if roll < 0.35:
        message["reasoning_content"] = random_reasoning(rng, added)
    elif template in ("qwen3", "qwen3_5") and roll < 0.65:
        # Reasoning written into the content, as Qwen's templates split it.
        opener = rng.choice(["<think>", "<think>\n", "", "x<think>\n\n", " <think> "])
        message["content"] = (rng.choice(PADDING) + opener + random_reasoning(rng, added) +
                              rng.choice(["</think>", "\n</think>\n\n", "</think>\n",
                                          "</think> "]) +
                              message["content"] +
                              rng.choice(["", "", "</think>tail", "<think>"]))
    return message


def random_conversation(rng, template, added):
    messages = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": random_text(rng, added)})
    if template == "qwen3_5" and rng.random() < 0.05:
        # A tool result first, which Qwen3.5's template writes headless.
        messages.append({"role": "tool", "content": random_text(rng, added)})
    turns = rng.randint(1, 6)
    for turn in range(turns):
        query = random_text(rng, added)
        if rng.random() < 0.1:
            # A tool result sent as a user turn: not a query for Qwen3 (nor,
            # once trimmed, for Qwen3.5).
            query = (rng.choice(PADDING) + "<tool_response>" + query + "</tool_response>" +
                     rng.choice(PADDING))
        messages.append({"role": "user", "content": query})
        if rng.random() < 0.05:
            messages.append({"role": "system", "content": random_text(rng, added)})
        if turn == turns - 1 and rng.random() < 0.2:
            break
        messages.append(random_assistant(rng, template, added))
        if rng.random() < 0.2:
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "tool", "content": random_text(rng, added)})
            if rng.random() < 0.8:
                messages.append(random_assistant(rng, template, added))
    return messages


def with_special_token(rng, messages, specials):
    """The same conversation with a special token's text in one field."""
    message = rng.choice(messages)
    field = "reasoning_content" if "reasoning_content" in message else "content"
    text = message[field]
    cut = rng.randint(0, len(text))
    message[field] = text[:cut] + rng.choice(specials) + text[cut:]
    return messages


# ----------------------------------------------------------------------------
# The comparison
# ----------------------------------------------------------------------------


def hf_tokenizer(path, template, bos_token=None):
    from transformers import PreTrainedTokenizerFast
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(path),
                                        bos_token=bos_token)
    tokenizer.chat_template = template
    return tokenizer


def expected_reply(real, marked, request, specials):
    """What tokenize_check must answer, from transformers: the template's
    own error when it raises (Qwen3.5's raise_exception), else the text, and
    without a generation prompt the ids and the mask."""
    messages = request["messages"]
    generation_prompt = request["add_generation_prompt"]
    # enable_thinking as the request has it: true, false, or undefined.
    kwargs = {k: request[k] for k in ("enable_thinking",) if k in request}
    try:
        text = real.apply_chat_template(messages, tokenize=False,
                                        add_generation_prompt=generation_prompt, **kwargs)
    except Exception as e:  # jinja2's TemplateError
        return {"raises": str(e)}
    assert marked.apply_chat_template(messages, tokenize=False,
                                      add_generation_prompt=generation_prompt, **kwargs) == text
    if generation_prompt:
        return {"text": text}
    # Special-token text in a message is plain text (special_token_chats.py):
    # the ids are compared; the mask is the unit tests' (chat_template_test).
    if any(t in message.get(field, "") for message in messages
           for field in ("content", "reasoning_content") for t in specials):
        plain = Tokenizer.from_str(real.backend_tokenizer.to_str())
        plain.encode_special_tokens = True
        return {"text": text, "plain_ids": plain_chat_ids(real, plain, messages, specials,
                                                          **kwargs)}
    ids = real.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    out = marked.apply_chat_template(messages, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True, **kwargs)
    assert out["input_ids"] == ids
    mask = out["assistant_masks"] if request["train_on"] == "assistant" else [1] * len(ids)
    return {"text": text, "ids": ids, "supervised": mask}


def agrees(want, got):
    if "raises" in want:
        return want["raises"] in got.get("error", "")
    if "plain_ids" in want:
        return got.get("text") == want["text"] and got.get("ids") == want["plain_ids"]
    return got == want


def compare(path, name, real, marked, specials, added):
    """Draws CONVERSATIONS requests and asserts that tokenize_check --chat
    NAME (with the tokenizer at `path`) answers each as transformers does
    with `real` and `marked`; returns transformers' replies."""
    seed = time.time_ns() % 2**32
    rng = random.Random(seed)
    requests = []
    for _ in range(CONVERSATIONS):
        messages = random_conversation(rng, name, added)
        if rng.random() < 0.03:
            messages = with_special_token(rng, messages, specials)
        request = {"messages": messages,
                   "train_on": "all" if rng.random() < 0.2 else "assistant",
                   "add_generation_prompt": rng.random() < 0.2}
        roll = rng.random()
        if name.startswith("qwen3") and roll < 0.6:
            request["enable_thinking"] = roll < 0.3
        requests.append(request)
    expected = [expected_reply(real, marked, r, specials) for r in requests]
    replies = run_tool(path, requests, ("--chat", name))
    wrong = [(r, w, g) for r, w, g in zip(requests, expected, replies) if not agrees(w, g)]
    assert not wrong, (f"seed {seed}: {len(wrong)} of {len(requests)} {name} chats differ; "
                       "first:\n" + "\n".join(f"{r!r}\n  transformers {w!r}\n  ours {g!r}"
                                              for r, w, g in wrong[:2]))
    # The draw reaches what it is meant to: masks with holes, special-token text.
    assert sum("plain_ids" in w for w in expected) > 0
    # About half the draws have a hole (492 of 1000 in one run), so the bound
    # is well below that: it says the holes are reached, not how often.
    assert sum(0 in w.get("supervised", [1]) for w in expected) > CONVERSATIONS // 4
    return expected


def check_template(path, name, specials, added, bos_token=None):
    real = hf_tokenizer(path, TEMPLATES[name][0], bos_token)
    marked = hf_tokenizer(path, TEMPLATES[name][1], bos_token)
    compare(path, name, real, marked, specials, added)


def added_contents(path):
    """The tokenizer's special added tokens, and its other added tokens."""
    with open(path) as f:
        added = json.load(f)["added_tokens"]
    return ([t["content"] for t in added if t["special"]],
            [t["content"] for t in added if not t["special"]])


@pytest.mark.parametrize("name", ["qwen3", "chatml"])
def test_qwen_templates_match_transformers(tmp_path, name):
    path = str(tmp_path / "tokenizer.json")
    qwen_style(path)
    check_template(path, name, *added_contents(path))


def test_llama3_template_matches_transformers(tmp_path):
    path = str(tmp_path / "tokenizer.json")
    llama3_style(path)
    check_template(path, "llama3", *added_contents(path), bos_token="<|begin_of_text|>")
