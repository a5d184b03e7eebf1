"""Image-text rows against --max-length, before the model loads (docs/vlm.md).

TRL's vision collators cut a processed row at --max-length from its end: the image tokens come first, so a row whose
image and prompt tokens fill the limit keeps them and loses its whole answer (a loss on nothing: 0.0, no weight
moves), and a limit inside the image tokens fails inside the model once training has started. Each row is measured
as the collator builds it: the prompt (the conversation up to its first assistant turn, with the generation prompt)
tokenized as text, plus what the processor adds for the row's images, then the answer (dpo: each of the two). The
images are not decoded: what the processor adds depends on their sizes, read from the headers, and is measured once
per distinct sizes on blank images of those sizes. A row whose answer would be cut entirely is a UsageError naming
the row and the length the whole row needs."""

from __future__ import annotations

import io
from typing import Any

from posttrainllm.errors import DataError, UsageError

BATCH = 256  # rows read at a time (file references, not pixels)


def _plain(messages: list[dict]) -> list[dict]:
    """The rows' messages as a chat template takes them: an image part is {"type": "image"}."""
    return [{**m, "content": [p if p["type"] == "text" else {"type": "image"} for p in m["content"]]} for m in messages]


def _render(processor, messages: list[dict], prompt: bool) -> str:
    return processor.apply_chat_template(_plain(messages), tokenize=False, add_generation_prompt=prompt)


def _size(ref: dict, where: str) -> tuple[int, int]:
    """An image's (width, height) from its header; a decompression bomb is a DataError naming the row."""
    from PIL import Image, UnidentifiedImageError

    name = ref.get("path") or "(bytes in the dataset)"
    try:
        with Image.open(io.BytesIO(ref["bytes"]) if ref.get("bytes") else ref["path"]) as image:
            return image.size
    except Image.DecompressionBombError as e:
        raise DataError(f"{where}: image {name} {too_many_pixels()}") from e
    except (OSError, UnidentifiedImageError) as e:
        raise UsageError(f"{where}: image {name} is not an image PIL can open ({e.__class__.__name__})") from e


def too_many_pixels() -> str:
    """Why PIL refuses an image it takes for a decompression bomb (more than twice Image.MAX_IMAGE_PIXELS)."""
    from PIL import Image

    limit = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 0
    return (
        f"declares more than {limit:,} pixels, which PIL refuses to decode (a decompression bomb); resize the image "
        "or drop the row"
    )


class _Measure:
    """Tokens of a row up to its answer, and in all, as the collator would build it."""

    def __init__(self, processor):
        self.processor, self.tokenizer = processor, processor.tokenizer
        self.added: dict[tuple, int] = {}  # image sizes -> the tokens the processor adds for them

    def text_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def image_tokens(self, sizes: tuple, text: str, where: str) -> int:
        """What the processor adds to `text`'s tokens for images of `sizes` (measured once per sizes)."""
        if not sizes:
            return 0
        if sizes not in self.added:
            from PIL import Image

            blanks = [Image.new("RGB", size, "white") for size in sizes]
            try:
                out = self.processor(images=blanks, text=[text], add_special_tokens=False)
            except (ValueError, TypeError, KeyError, IndexError) as e:
                raise UsageError(f"{where}: the processor cannot process this row's images ({e})") from e
            self.added[sizes] = len(out["input_ids"][0]) - self.text_tokens(text)
        return self.added[sizes]

    def row(self, messages: list[dict], images: list[dict], where: str) -> tuple[int, int]:
        """(tokens before the first assistant turn's answer, tokens of the whole row)."""
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        prompt = _render(self.processor, messages[:first], prompt=True)
        shown = sum(1 for m in messages[:first] for p in m["content"] if p["type"] == "image")
        sizes = tuple(_size(ref, where) for ref in images[:shown])
        before = self.text_tokens(prompt) + self.image_tokens(sizes, prompt, where)
        full = _render(self.processor, messages, prompt=False)
        rest = full[len(prompt) :] if full.startswith(prompt) else full
        after = self.text_tokens(rest) - (0 if full.startswith(prompt) else self.text_tokens(prompt))
        return before, before + max(after, 1)


def check(rows, processor, max_length: int | None, source: str, flag: str = "--dataset") -> None:
    """Every row of `rows` (vision/data.py's: messages, prompt/completion or prompt/chosen/rejected, and image
    references) keeps part of its answer under `max_length`; else a UsageError naming the first row that would not
    (and how many do not)."""
    if not max_length:
        return
    from datasets import Image, List

    refs = rows.cast_column("images", List(Image(decode=False)))
    measure = _Measure(processor)
    cut: list[tuple[int, int, int]] = []  # (row, tokens before the answer, tokens of the row)
    for start in range(0, refs.num_rows, BATCH):
        batch: dict[str, Any] = refs[start : start + BATCH]
        for k, images in enumerate(batch["images"]):
            i = start + k + 1
            if "messages" in batch:
                answers = [batch["messages"][k]]
            else:  # sft's prompt/completion, or dpo's prompt and both answers
                answers = [batch["prompt"][k] + batch[c][k] for c in ("completion", "chosen", "rejected") if c in batch]
            sizes = [measure.row(m, images or [], f"{source}: row {i}") for m in answers]
            before, whole = sizes[0][0], max(w for _, w in sizes)
            if before >= max_length:
                cut.append((i, before, whole))
    if cut:
        i, before, whole = cut[0]
        more = f" (and {len(cut) - 1} more of the {refs.num_rows} rows)" if len(cut) > 1 else ""
        raise UsageError(
            f"{flag} {source}: row {i}{more}: its image and prompt tokens ({before}) fill --max-length {max_length}, "
            f"so truncation would cut its whole answer; give --max-length {whole} or more (the "
            "whole row), or smaller images or a shorter prompt"
        )
