"""Chat templates: the default one put on tokenizers that have none, and what a template leaves of a conversation
at a given --max-length (all chat-template logic lives here)."""

from __future__ import annotations

import re
from typing import Any

from ..errors import DataError

# ChatML layout (as used by Qwen/OpenAI): every message is
#     <|im_start|>{role}\n{content}<|im_end|>\n
# and `add_generation_prompt=True` appends `<|im_start|>assistant\n`. Differences from plain ChatML:
#   * an assistant turn is followed by the tokenizer's eos token (when it has one) right after `<|im_end|>`, so a
#     model trained on it learns to stop with the default generation settings (the ChatML markers are ordinary
#     text for a tokenizer that does not have them as special tokens, so `<|im_end|>` alone would not stop it);
#   * `{% generation %}` markers around what the assistant says (its content, `<|im_end|>` and eos), so that the
#     loss can fall on the assistant's words only (TRL's assistant_only_loss); the header `<|im_start|>assistant\n`
#     and every other turn are prompt;
#   * no default system prompt, no tool-call rendering, no BOS token.
# The prompt rendered with `add_generation_prompt=True` is a prefix of the full conversation rendered without it,
# which is what TRL's prompt/completion and preference tokenisation relies on.
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- generation -%}"
    "{{- message['content'] + '<|im_end|>' -}}"
    "{%- if eos_token is defined and eos_token -%}{{- eos_token -}}{%- endif -%}"
    "{%- endgeneration -%}"
    "{{- '\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")


def has_generation_markers(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template marks the assistant's words with `{% generation %}`."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return bool(template) and _GENERATION_MARKER.search(template) is not None


class AssistantSpans:
    """Token ids and the assistant mask of conversations, for any chat template, from the template itself.

    The conversation is rendered prefix by prefix, the way LLaMA-Factory finds its targets: for every assistant
    message k, the tokens of `messages[:k]` with the generation prompt mark where it starts, and the tokens of
    `messages[:k + 1]` where it ends; both must be prefixes of the whole conversation's tokens. Everything in
    between (the assistant's words and the template's end-of-turn tokens) gets mask 1; system, user and tool turns
    and the role headers get 0. A template for which a prefix does not tokenize as a prefix (it rewrites earlier
    turns, or a token spans a turn boundary) cannot be masked this way: DataError, never a silent fallback.

    Done a batch at a time (`batch`): every text of the batch (each conversation, and the prefix before each
    assistant turn and through each assistant turn but the last, which is the conversation itself) is rendered in
    one batched `apply_chat_template` call per kind and tokenized in one batched call of the Rust tokenizer, so a
    one-turn conversation costs two renders and one tokenization of its text plus one of its prompt.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        # Before an assistant message that opens the conversation: the generation prompt of no messages where it is
        # a prefix of the conversation, else the top (a template that adds a default system prompt to a
        # conversation that has none; one that cannot render no messages).
        try:
            self.opening = self._render([[]], True)[0]
        except Exception:  # noqa: BLE001 - jinja raises what the template raises
            self.opening = ""

    def _render(self, conversations: list[list[dict]], generation: bool) -> list[str]:
        if not conversations:
            return []
        return list(self.tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=generation))

    def __call__(self, messages: list[dict], where: str = "a conversation") -> tuple[list[int], list[int]]:
        ids, masks = self.batch([messages], [where])
        return ids[0], masks[0]

    def batch(self, conversations: list[list[dict]], wheres: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        """(token ids, assistant mask) of each conversation; `wheres` name them in errors."""
        from .text import encode_batch

        starts, ends = [], []  # (conversation, position in its list of assistant turns) -> prefix to render
        turns: list[list[tuple[int, int | None, int | None]]] = []  # per conversation: (message, start, end)
        for messages in conversations:
            own = []
            for k, message in enumerate(messages):
                if message["role"] != "assistant":
                    continue
                start = None if k == 0 else len(starts)
                if k:
                    starts.append(messages[:k])
                end = None if k + 1 == len(messages) else len(ends)
                if end is not None:
                    ends.append(messages[: k + 1])
                own.append((k, start, end))
            turns.append(own)
        full_texts = self._render(conversations, False)
        start_texts, end_texts = self._render(starts, True), self._render(ends, False)
        opening = [self.opening] if any(s is None for own in turns for _, s, _ in own) else []
        ids = encode_batch(self.tokenizer, full_texts + start_texts + end_texts + opening)
        full_ids = ids[: len(full_texts)]
        start_ids = ids[len(full_texts) : len(full_texts) + len(start_texts)]
        end_ids = ids[len(full_texts) + len(start_texts) : len(ids) - len(opening)]
        opening_ids = ids[-1] if opening else []
        masks = []
        for c, own in enumerate(turns):
            full = list(full_ids[c])
            mask = [0] * len(full)
            for k, start, end in own:
                if start is None:
                    a = opening_ids if full[: len(opening_ids)] == list(opening_ids) else []
                else:
                    a = start_ids[start]
                b = full if end is None else end_ids[end]
                for part, what in ((a, "up to the assistant's turn"), (b, "through the assistant's turn")):
                    if full[: len(part)] != list(part):
                        raise DataError(
                            f"{wheres[c]}: the chat template renders message {k + 1} in a way that makes the "
                            f"assistant's tokens impossible to locate (the conversation {what} does not tokenize "
                            "as a prefix of the whole conversation), so the loss cannot be limited to the "
                            "assistant's words; use a chat template with {% generation %} markers, or pass "
                            "--train-on-prompt to train on every token"
                        )
                mask[len(a) : len(b)] = [1] * (len(b) - len(a))
            full_ids[c] = full
            masks.append(mask)
        return full_ids, masks


def ensure_chat_template(tokenizer: Any) -> str | None:
    """Put DEFAULT_CHAT_TEMPLATE on a tokenizer that has no chat template; return a note saying so (else None).
    A tokenizer that puts a BOS before every text (Gemma, Llama 3: ``special_affixes``) gets the template with
    ``{{ bos_token }}`` first: a conversation is rendered without the tokenizer's own special tokens, so it starts
    with the BOS the model expects only if the template writes it."""
    from .text import special_affixes

    if tokenizer is None or getattr(tokenizer, "chat_template", None):
        return None
    bos = getattr(tokenizer, "bos_token_id", None)
    writes_bos = bos is not None and special_affixes(tokenizer)[0] == [bos]
    tokenizer.chat_template = ("{{- bos_token -}}" if writes_bos else "") + DEFAULT_CHAT_TEMPLATE
    return (
        "no chat template in tokenizer: applied the default ChatML template (posttrainllm.data.DEFAULT_CHAT_TEMPLATE)"
        + (", after the tokenizer's BOS" if writes_bos else "")
    )


def prompt_part(row: dict) -> list[dict] | None:
    """The messages rendered before the first trained completion token of a conversational SFT row: the prompt of
    a prompt/completion row, or the messages before the first assistant message with content (None: there is no
    such message)."""
    if "messages" in row:
        for i, m in enumerate(row["messages"]):
            if m["role"] == "assistant" and m["content"].strip():
                return row["messages"][:i]
        return None
    return row["prompt"]


class CompletionBudget:
    """Does a conversational SFT row keep at least one completion token once truncated to `max_length`?

    TRL truncates every tokenized conversation to max_length; a row whose prompt part (see `prompt_part`) already
    fills it trains on prompt tokens only. Deciding that for every row by rendering the template and tokenizing
    would cost as much as TRL's own tokenization, so it goes in three steps:

    1. a token covers at least one byte: a prompt part whose contents have fewer bytes than max_length, plus the
       template's own text (measured with empty contents) and 16, fits. Most rows stop here.
    2. the other rows' contents are tokenized in one batched call: a sum of content tokens that stays below (or
       reaches) max_length with a margin for the template's tokens and for merges at its boundaries (4 tokens a
       message, 16 more for special tokens) decides the row;
    3. rows within that margin are rendered with the chat template and tokenized: exact.

    A prompt part above 256 KiB with max_length whitespace-separated words or more never fits (a token never spans
    two words): decided without tokenizing it.
    """

    SLACK = 16  # special tokens a template or tokenizer may add around the text
    MARGIN = 4  # tokens per message: merges and splits where a content meets the template's text
    WORDS_ABOVE = 256 << 10

    def __init__(self, tokenizer: Any, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.base, self.per_message, self.base_tokens, self.per_message_tokens = self._template_sizes()
        self.unclear = 0  # rows the byte bound could not clear (for measurements)

    def _render(self, messages: list[dict], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    def _count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        from .text import encode_batch

        return [len(x) for x in encode_batch(self.tokenizer, texts)]

    def _template_sizes(self) -> tuple[int, int, int, int]:
        """What the template adds, in bytes and in tokens: at most `base` for the first message plus the generation
        prompt, and at most `per_message` for each further message (measured with empty contents, every role)."""
        sizes = [0, 0, 0, 0]
        for role in ("system", "user", "assistant", "tool"):
            try:
                one = [{"role": role, "content": ""}]
                first, more = self._render(one, True), self._render(one, False)
            except Exception:  # noqa: BLE001 - a template may refuse a role on its own; the others still count
                continue
            counts = self._count([first, more])
            for k, v in enumerate((len(first.encode()), len(more.encode()), counts[0], counts[1])):
                sizes[k] = max(sizes[k], v)
        return sizes[0], sizes[1], sizes[2], sizes[3]

    def template_tokens(self, n_messages: int) -> int:
        return self.base_tokens + max(0, n_messages - 1) * self.per_message_tokens

    def upper_bound(self, content_bytes: int, n_messages: int) -> int:
        """Most tokens a prompt part with these content bytes and messages can have (step 1)."""
        return content_bytes + self.base + max(0, n_messages - 1) * self.per_message + self.SLACK

    def prompt_tokens(self, messages: list[dict], where: str = "") -> int:
        try:
            text = self._render(messages, True)
        except Exception as e:  # noqa: BLE001 - jinja raises TemplateError for data the template rejects
            raise DataError(f"{where}: the chat template cannot render this conversation ({e})") from None
        return len(self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])

    def leaves_no_completion(self, row: dict, where: str = "") -> bool:
        prompt = prompt_part(row)
        if prompt is None:
            return False  # no assistant content: dropped for that reason
        content_bytes = sum(len(m["content"].encode()) for m in prompt)
        if self.upper_bound(content_bytes, len(prompt)) < self.max_length:
            return False
        return self.decide([prompt], [content_bytes], [where])[0]

    def decide(self, prompts: list[list[dict]], content_bytes: list[int], wheres: list[str]) -> list[bool]:
        """Steps 2 and 3 for prompt parts that step 1 could not clear: True where no completion token survives."""
        L = self.max_length
        out: list[bool | None] = [None] * len(prompts)
        texts, owners = [], []
        for i, (prompt, nbytes) in enumerate(zip(prompts, content_bytes)):
            if nbytes > self.WORDS_ABOVE and sum(len(m["content"].split()) for m in prompt) >= L:
                out[i] = True
                continue
            for m in prompt:
                texts.append(m["content"])
                owners.append(i)
        tokens = [0] * len(prompts)
        for owner, n in zip(owners, self._count(texts)):
            tokens[owner] += n
        for i, prompt in enumerate(prompts):
            if out[i] is not None:
                continue
            n = len(prompt)
            if tokens[i] - self.MARGIN * n >= L:
                out[i] = True
            elif tokens[i] + self.template_tokens(n) + self.MARGIN * n + self.SLACK < L:
                out[i] = False
            else:
                out[i] = self.prompt_tokens(prompt, wheres[i]) >= L
        return [bool(x) for x in out]
