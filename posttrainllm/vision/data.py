"""Image-text data for a vision-language model (docs/vlm.md): the rows TRL's vision collators take.

A record is a conversation and its images, as TRL expects them:

    {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                  {"role": "assistant", "content": "A red square."}],
     "images": ["pics/square.png"]}

(dpo: `prompt`, `chosen`, `rejected` and `images`; an `image` column of one file per row is taken too). Each
`{"type": "image"}` part takes the next image of the row, in order; a row whose contents are all strings gets its
images before the first user message (TRL's rule). Image paths are relative to the dataset's folder.

Every row is checked before the model loads, without decoding an image: the count of images against the count of
image parts, and that each image file exists and is an image PIL can open (its header only). The images themselves
are opened as each batch is built (a `datasets.Image` column, decoded on access): memory follows the batch, not the
dataset. Problems are UsageErrors (exit 2) naming the row and the path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrainllm.data import reading
from posttrainllm.data.loss_mask import LossMask
from posttrainllm.data.prepare import PreparedData, _check_args, _random_split
from posttrainllm.errors import DataError, UsageError, shorten
from posttrainllm.refs import not_a_file
from posttrainllm.vision import lengths
from posttrainllm.vision.lengths import too_many_pixels

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

IMAGE_COLUMNS = ("images", "image")
ROLES = ("system", "user", "assistant")
# the columns of each data shape (besides the images)
SHAPE_COLUMNS = {"sft": ("messages",), "preference": ("prompt", "chosen", "rejected")}
FORMAT = {"sft": "messages+images", "preference": "preference+images"}


def image_column(columns) -> str | None:
    """The dataset's image column (`images`, a list per row, or `image`, one per row), if it has one."""
    return next((c for c in IMAGE_COLUMNS if c in columns), None)


def check_text_model(source: str, model: str, what: str, streaming: bool = False, flag: str = "--dataset") -> None:
    """Image-text data given to a text-only model: a UsageError (exit 2) before the model loads."""
    ds = reading.load(source, streaming=streaming)
    column = image_column(reading.columns(ds, None if not streaming else reading.head(ds, 1)))
    if column is not None:
        raise UsageError(
            f"{flag} {source} has an '{column}' column, but --model {model} is a text-only model ({what}): "
            "use a vision-language model (one whose config has a vision_config), or drop the column"
        )


def _features(shape: str, split_last: bool):
    from datasets import Features, Image, List, Value

    messages = List({"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})})
    names: tuple[str, ...]
    if shape == "preference":
        names = ("prompt", "chosen", "rejected")
    else:
        names = ("prompt", "completion") if split_last else ("messages",)
    return Features({**{n: messages for n in names}, "images": List(Image(decode=False))})


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _parts(content: Any, where: str) -> list[dict]:
    """A message's content as a list of parts: {"type": "text", "text"} and {"type": "image", "text": None}."""
    if isinstance(content, str):
        return [_text(content)]
    if not isinstance(content, list):
        raise UsageError(f"{where}: a message's content must be a string or a list of parts, found {content!r:.80}")
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(_text(part))
        elif isinstance(part, dict) and part.get("type") == "image":
            out.append({"type": "image", "text": None})
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(_text(part["text"]))
        else:
            raise UsageError(
                f'{where}: a content part must be {{"type": "text", "text": ...}} or {{"type": "image"}}, '
                f"found {shorten(part, 80)}"
            )
    return out


def _messages(value: Any, where: str, name: str) -> list[dict]:
    """A column's messages (a string is one message: the user's for a prompt, the assistant's otherwise)."""
    if isinstance(value, str):
        return [{"role": "user" if name == "prompt" else "assistant", "content": [_text(value)]}]
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: '{name}' must be a non-empty list of messages, found {shorten(value, 80)}")
    out = []
    for m in value:
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ROLES:
            raise UsageError(f"{where}: '{name}' has a message whose role is {role!r}; use one of {', '.join(ROLES)}")
        out.append({"role": role, "content": _parts(m.get("content"), where)})
    return out


def _place_images(messages: list[dict], raw: list, n_images: int) -> None:
    """TRL's rule for a row whose contents are all strings: its images go before the first user message's text."""
    if n_images == 0 or any(isinstance(m.get("content"), list) for m in raw if isinstance(m, dict)):
        return
    first = next((m for m in messages if m["role"] == "user"), None)
    if first is not None:
        first["content"] = [{"type": "image", "text": None} for _ in range(n_images)] + first["content"]


class _Rows:
    """One batch of records → checked rows of the shape's columns plus `images` (file references, not decoded)."""

    def __init__(self, shape: str, source: str, column: str, split_last: bool):
        self.shape, self.source, self.column, self.split_last = shape, source, column, split_last
        path = Path(source).expanduser()
        self.base = path if path.is_dir() else path.parent if path.exists() else None

    def __call__(self, batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        names = SHAPE_COLUMNS[self.shape]
        out: dict[str, list] = {}
        for k, i in enumerate(indices):
            row = self.row({n: batch[n][k] for n in names}, batch[self.column][k], f"{self.source}: row {i + 1}")
            for name, value in row.items():
                out.setdefault(name, []).append(value)
        return out

    def row(self, record: dict, images: Any, where: str) -> dict:
        refs = self.images(images, where)
        if self.shape == "preference":
            prompt = _messages(record["prompt"], where, "prompt")
            _place_images(prompt, record["prompt"] if isinstance(record["prompt"], list) else [], len(refs))
            row = {n: _messages(record[n], where, n) for n in ("chosen", "rejected")}
            row["prompt"] = prompt
            placed = prompt
        else:
            messages = _messages(record["messages"], where, "messages")
            _place_images(messages, record["messages"], len(refs))
            if not any(m["role"] == "assistant" for m in messages):
                raise UsageError(f"{where}: the conversation has no assistant message: nothing to learn")
            row = self.split(messages, where) if self.split_last else {"messages": messages}
            placed = messages
        parts = sum(1 for m in placed for p in m["content"] if p["type"] == "image")
        if parts != len(refs):
            raise UsageError(
                f'{where}: {len(refs)} image(s) in \'{self.column}\' but {parts} {{"type": "image"}} part(s) in the '
                "messages; give one image per image part, in order"
            )
        return {**row, "images": refs}

    def split(self, messages: list[dict], where: str) -> dict:
        """prompt/completion: the conversation up to its last message, and that message (the assistant's)."""
        if messages[-1]["role"] != "assistant" or sum(m["role"] == "assistant" for m in messages) > 1:
            raise UsageError(
                f"{where}: the processor's chat template has no {{% generation %}} markers, so the loss can only fall "
                "on a conversation's last message, and this one has several assistant turns (or does not end with "
                "one); use a chat template with the markers, or --train-on-prompt"
            )
        return {"prompt": messages[:-1], "completion": messages[-1:]}

    def images(self, value: Any, where: str) -> list[dict]:
        """The row's images as {"path", "bytes"} references, each file checked (exists, PIL reads its header)."""
        if value is None:
            return []
        items = value if isinstance(value, list) else [value]
        refs = []
        for item in items:
            if isinstance(item, dict) and item.get("bytes"):
                refs.append({"path": item.get("path"), "bytes": item["bytes"]})
                continue
            name = item.get("path") if isinstance(item, dict) else item
            if not isinstance(name, str) or not name.strip():
                raise UsageError(f"{where}: an image must be a file path, found {shorten(item, 80)}")
            refs.append({"path": self.check_file(name, where), "bytes": None})
        return refs

    def check_file(self, name: str, where: str) -> str:
        path = Path(name).expanduser()
        if not path.is_absolute() and self.base is not None:
            path = self.base / path
        if not path.is_file():  # a FIFO is not opened: is_file() reads its mode only
            relative = f" (relative to {self.base})" if self.base is not None and not Path(name).is_absolute() else ""
            raise UsageError(f"{where}: image file {name} {not_a_file(path)}{relative}; give an image file")
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                image.size  # noqa: B018 - the header is read, the pixels are not
        except Image.DecompressionBombError as e:
            raise DataError(f"{where}: image file {name} {too_many_pixels()}") from e
        except (OSError, UnidentifiedImageError) as e:
            raise UsageError(f"{where}: image file {name} is not an image PIL can open ({e.__class__.__name__})") from e
        return os.path.abspath(path)


def _undecoded(ds, column: str):
    """An image column of `datasets.Image` features read as file references (no decoding while rows are checked)."""
    from datasets import Image, List

    feature = ds.features.get(column) if getattr(ds, "features", None) else None
    if isinstance(feature, Image):
        return ds.cast_column(column, Image(decode=False))
    if isinstance(feature, List) and isinstance(feature.feature, Image):
        return ds.cast_column(column, List(Image(decode=False)))
    return ds


def convert(source: str, shape: str, *, split_last: bool, max_samples: int | None, num_proc: int | None):
    """A dataset's records → checked rows with an `images` column of `datasets.Image` (decoded on access)."""
    from datasets import Image, List

    ds = reading.load(source)
    cols = reading.columns(ds)
    column = image_column(cols)
    missing = [c for c in SHAPE_COLUMNS[shape] if c not in cols]
    if missing or column is None:
        need = "/".join(SHAPE_COLUMNS[shape])
        raise UsageError(
            f"{source}: image-text data for a vision-language model needs {need} and an 'images' column "
            f"(found {', '.join(cols)}); see docs/vlm.md"
        )
    if max_samples is not None:
        ds = ds.select(range(min(max_samples, ds.num_rows)))
    ds = _undecoded(ds, column)
    rows = ds.map(
        _Rows(shape, source, column, split_last), batched=True, with_indices=True, remove_columns=ds.column_names,
        features=_features(shape, split_last), num_proc=reading.processes(num_proc), desc="checking the images",
        load_from_cache_file=False,  # the files are checked on every run: one may have gone since the last
    )  # fmt: skip
    return rows.cast_column("images", List(Image()))


def prepare(cfg: RunConfig, processor, shape: str) -> PreparedData:
    """The run's image-text data (sft: conversations; dpo: preference pairs), checked, split, with the loss mask.

    sft's loss falls on the assistant's turns (image tokens and every other turn masked) through TRL's
    `assistant_only_loss` when the processor's chat template has `{% generation %}` markers; without them, each
    conversation ending with its only assistant message becomes prompt/completion (TRL's completion-only loss).
    `--train-on-prompt` puts the loss on every token."""
    from posttrainllm.data.chat import has_generation_markers

    if shape not in SHAPE_COLUMNS:
        raise UsageError(f"{cfg.command} does not take image-text data: sft and dpo do (docs/vlm.md)")
    _check_args(cfg.eval_split, cfg.eval_dataset, cfg.max_samples)
    if not getattr(processor, "chat_template", None):
        raise UsageError(
            f"the processor of --model {cfg.model} has no chat template, and a vision-language model's cannot be "
            "guessed (where its image tokens go is the model's own); add one (chat_template.jinja in the model folder)"
        )
    markers = has_generation_markers(processor)
    split_last = shape == "sft" and not markers and not cfg.train_on_prompt
    _check_processor(cfg, processor, shape, markers, split_last)
    with reading.progress_bars(cfg.dataset, cfg.eval_dataset):
        train = convert(
            cfg.dataset, shape, max_samples=cfg.max_samples, split_last=split_last, num_proc=cfg.dataset_num_proc
        )
        max_length = getattr(cfg, "max_length", None)
        lengths.check(train, processor, max_length, cfg.dataset)  # before the split: rows keep their numbers
        if cfg.eval_dataset:
            eval_ds = convert(
                cfg.eval_dataset, shape, max_samples=None, split_last=split_last, num_proc=cfg.dataset_num_proc
            )
            lengths.check(eval_ds, processor, max_length, cfg.eval_dataset, "--eval-dataset")
        else:
            train, eval_ds = _random_split(train, cfg.eval_split, cfg.eval_split_seed, cfg.dataset)
    prepared = PreparedData(
        train=train, eval=eval_ds, format=FORMAT[shape], n_train=train.num_rows,
        n_eval=eval_ds.num_rows if eval_ds is not None else 0, source=cfg.dataset, eval_source=cfg.eval_dataset,
        conversational=True,
    )  # fmt: skip
    if shape == "sft":
        prepared.loss = _loss(cfg.train_on_prompt, markers)
    return prepared


def _check_processor(cfg: RunConfig, processor, shape: str, markers: bool, split_last: bool) -> None:
    """What TRL's collators will ask of the processor, probed before the model loads (vision/probe.py): a
    UsageError naming what fails and what works instead."""
    from posttrainllm.vision import probe

    mask_checked = shape == "sft" and markers and not cfg.train_on_prompt
    if mask_checked and (problem := probe.assistant_mask_problem(processor)):
        raise UsageError(
            f"--model {cfg.model}: {problem}, so the assistant-only loss would train other tokens; use "
            "--train-on-prompt (the loss on every token), or a processor that keeps the template's text"
        )
    if (split_last or shape == "preference") and (problem := probe.text_alone_problem(processor)):
        fix = "use --train-on-prompt, or a chat template with {% generation %} markers"
        if not split_last:
            fix = f"{cfg.command} cannot train this model with TRL's collator"
        needs = "the completion-only loss" if split_last else cfg.command
        raise UsageError(f"--model {cfg.model}: {problem}, and {needs} processes each completion as text alone; {fix}")


def _loss(train_on_prompt: bool, markers: bool) -> LossMask:
    if train_on_prompt:
        return LossMask(description="every token, image tokens and prompts included (--train-on-prompt)")
    if markers:
        return LossMask(
            assistant_only_loss=True,
            description="assistant turns (masked with the template's generation markers; image tokens, system and "
            "user turns carry no loss)",
        )
    return LossMask(
        completion_only_loss=True,
        description="the last (assistant) message of each conversation (the template has no generation markers: "
        "TRL's completion-only loss; image tokens and the prompt carry no loss)",
    )


# the options that do not work with image-text data yet: field -> flag
UNSUPPORTED = {
    "packing": "--packing",
    "streaming": "--streaming",
    "replay_dataset": "--replay-dataset",
    "self_replay": "--self-replay",
    "ood_eval": "--ood-eval",
    "kl_to_base": "--kl-to-base",
}


def unsupported(cfg: RunConfig) -> list[str]:
    """The options of `cfg` that a vision-language run does not take yet, one problem each."""
    return [
        f"{flag} is not supported for vision-language models yet (docs/vlm.md)"
        for name, flag in UNSUPPORTED.items()
        if getattr(cfg, name, None)
    ]
