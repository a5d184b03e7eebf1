"""`posttrainllm generate`: a quick look at a trained model (like `trl chat` or `llamafactory-cli chat`, one shot).

The prompt is rendered the way the model was trained: with the tokenizer's chat template when it has one (a
`--system` message first), in the Alpaca template with `--prompt-format alpaca` (what `sft` does with Alpaca
data), or as plain text. `--prompts FILE` reads one prompt per line, or JSON Lines with a "prompt" (string), a
"messages" list, or "instruction"/"input" (Alpaca) per line, and writes one JSON line per completion.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrainllm.config.inputs import local_inputs, output_file_problems
from posttrainllm.config.options import options_for
from posttrainllm.errors import DataError, UsageError
from posttrainllm.refs import not_a_file, special_file
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

PROMPT_FORMATS = ("auto", "chat", "alpaca", "plain")


def _one_source(command: str, v: Mapping[str, Any]) -> list[str]:
    problems = []
    if (v.get("prompt") is None) == (v.get("prompts") is None):
        problems.append("give either --prompt TEXT or --prompts FILE (one of them)")
    if v.get("output") and v.get("prompt") is not None:
        problems.append("--output goes with --prompts FILE (a single --prompt is printed)")
    if v.get("image") and v.get("prompt") is None:
        problems.append("--image goes with --prompt TEXT (the question about the image)")
    for key, what in (("prompts", "a prompts file"), ("image", "an image file")):
        path = v.get(key) and os.path.expanduser(v[key])
        if path and not os.path.isfile(path) and not special_file(path):  # a FIFO or device: resolve says so
            problems.append(f"--{key}: {v[key]} {not_a_file(path)}; give {what}")
    if v.get("output") and v.get("prompt") is None:  # not one of the run's inputs, nor inside one
        inputs = local_inputs(dict(v), options_for(SPEC))
        problems += output_file_problems("--output", v["output"], bool(v.get("overwrite")), inputs)
    return problems


SPEC = CommandSpec(
    name="generate",
    help="Complete prompts with a trained model (chat template when the tokenizer has one): a quick look at a "
    "fine-tune.",
    defaults={"temperature": 0.0},  # greedy
    checks=(_one_source,),
)


def read_prompts(path: str) -> list[Any]:
    """Prompts of a file: strings (one per line of a text file) or JSON Lines records (string or messages)."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read --prompts {path}: {e}") from None
    if p.suffix.lower() not in (".jsonl", ".json"):
        prompts = [line for line in text.splitlines() if line.strip()]
    else:
        prompts = []
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {n} is not valid JSON ({e.msg}); one JSON object per line") from None
            prompts.append(_from_record(rec, f"{path}: line {n}"))
    if not prompts:
        raise DataError(f"--prompts {path} holds no prompt")
    return prompts


def prompt_images(path: str) -> list[list[str]]:
    """The images of each prompt of a JSON Lines --prompts file (an "images" list or an "image" of a record; paths
    relative to the file's folder), in the order of `read_prompts`; a missing file is a UsageError naming its line."""
    p = Path(path).expanduser()
    if p.suffix.lower() not in (".jsonl", ".json"):
        return [[] for line in p.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    out = []
    for n, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        rec = json.loads(line)
        names = (rec.get("images") or rec.get("image") or []) if isinstance(rec, dict) else []
        names = [names] if isinstance(names, str) else names
        files = [p.parent / Path(name).expanduser() for name in names if isinstance(name, str)]
        for name, file in zip(names, files):
            if not file.is_file():  # a FIFO is not opened: is_file() reads its mode only
                raise UsageError(
                    f"--prompts {path}: line {n}: image file {name} {not_a_file(file)} (relative to {p.parent}); "
                    "give an image file"
                )
        out.append([str(f) for f in files])
    return out


def _from_record(rec: Any, where: str) -> Any:
    if isinstance(rec, str):
        return rec
    if isinstance(rec, dict):
        if isinstance(rec.get("messages"), list):
            msgs = [m for m in rec["messages"] if isinstance(m, dict)]
            return msgs[:-1] if msgs and msgs[-1].get("role") == "assistant" else msgs
        if isinstance(rec.get("prompt"), (str, list)):
            return rec["prompt"]
        if isinstance(rec.get("instruction"), str):
            return {"instruction": rec["instruction"], "input": rec.get("input") or ""}
    raise DataError(f"{where}: expected a string, or an object with 'prompt', 'messages' or 'instruction'")


def render(tokenizer, prompt: Any, fmt: str, system: str | None) -> str:
    """The text the model continues: chat template, Alpaca template or the prompt itself."""
    from posttrainllm.data import ALPACA_PROMPT, ALPACA_PROMPT_NO_INPUT

    has_template = bool(getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, dict):  # an Alpaca record
        fmt = "alpaca" if fmt == "auto" else fmt
    if fmt == "auto":
        fmt = "chat" if has_template or isinstance(prompt, list) else "plain"
    if fmt == "chat":
        if not has_template:  # the template sft would have used for conversational data
            from posttrainllm.data import ensure_chat_template

            ensure_chat_template(tokenizer)
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": _as_text(prompt)}]
        if system and not (messages and messages[0].get("role") == "system"):
            messages = [{"role": "system", "content": system}, *messages]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if fmt == "alpaca":
        rec = prompt if isinstance(prompt, dict) else {"instruction": _as_text(prompt), "input": ""}
        template = ALPACA_PROMPT if rec["input"].strip() else ALPACA_PROMPT_NO_INPUT
        text = template.format(instruction=rec["instruction"], input=rec["input"])
        return (system.strip() + "\n\n" + text) if system else text
    return (system + "\n\n" if system else "") + _as_text(prompt)


def _as_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        return prompt["instruction"] + ("\n\n" + prompt["input"] if prompt.get("input") else "")
    return "\n".join(str(m.get("content", "")) for m in prompt)


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def new_token_budget(model, prompt_tokens: int, asked: int) -> tuple[int, str | None]:
    """--max-new-tokens within the model's context (its config's max_position_embeddings or equivalent): the
    positions left after the prompt, with a note when that is less than asked; a UsageError when the prompt alone
    fills the context. Unchanged when the config names no context length."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = next((v for k in _CONTEXT_KEYS if isinstance(v := getattr(config, k, None), int) and v > 0), None)
    if limit is None or prompt_tokens + asked <= limit:
        return asked, None
    room = limit - prompt_tokens
    if room <= 0:
        raise UsageError(
            f"the prompt is {prompt_tokens} tokens and the model's context is {limit} positions: no room to "
            "generate; shorten the prompt (or --system)"
        )
    return room, (
        f"--max-new-tokens {asked} is more than the model's context allows after a {prompt_tokens}-token prompt "
        f"({limit} positions): generating at most {room} tokens"
    )


def _with_images(prompt: Any, n_images: int) -> list[dict]:
    """The prompt as messages of content parts; a prompt without image parts gets its `n_images` images before the
    text of its first user message (TRL's rule); a count that does not match its image parts is a UsageError."""
    if isinstance(prompt, list):
        messages = [{**m, "content": [{"type": "text", "text": m.get("content") or ""}]}
                    if not isinstance(m.get("content"), list) else dict(m) for m in prompt]  # fmt: skip
    else:
        messages = [{"role": "user", "content": [{"type": "text", "text": _as_text(prompt)}]}]
    parts = sum(1 for m in messages for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")
    if parts == 0 and n_images:
        first = next((m for m in messages if m.get("role") == "user"), messages[0])
        first["content"] = [{"type": "image"} for _ in range(n_images)] + first["content"]
    elif parts != n_images:
        raise UsageError(f'a prompt has {parts} {{"type": "image"}} part(s) but {n_images} image(s); give one per part')
    return messages


def complete_image(model, processor, prompt: Any, images: list[str], system: str | None, **sampling) -> str:
    """A vision-language model's answer: the processor's chat template over the prompt (its images, when given,
    before the text of the first user turn unless it places them; a --system message first), the images processed
    with it."""
    from PIL import Image

    messages = _with_images(prompt, len(images))
    if system and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": [{"type": "text", "text": system}]}, *messages]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    pictures = []
    for image in images:
        try:
            with Image.open(Path(image).expanduser()) as opened:
                pictures.append(opened.convert("RGB"))
        except OSError as e:
            raise UsageError(f"image {image}: not an image PIL can open ({e.__class__.__name__})") from None
    enc = processor(images=pictures or None, text=text, return_tensors="pt", add_special_tokens=False)
    return complete(model, processor.tokenizer, text, encoded=enc, **sampling)


def complete(
    model, tokenizer, text: str, *, max_new_tokens: int, temperature: float, top_p: float, note=None, encoded=None
) -> str:
    """The completion of `text` (`encoded`: its model inputs already made, e.g. with an image's pixels);
    `note(message)` is told when --max-new-tokens is clamped to the context."""
    import torch

    device = next(model.parameters()).device
    if encoded is None:
        special = not getattr(tokenizer, "chat_template", None)
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=special)
    enc = encoded.to(device)
    max_new_tokens, clamped = new_token_budget(model, enc["input_ids"].shape[1], max_new_tokens)
    if clamped and note is not None:
        note(clamped)
    sampling = temperature > 0
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=sampling, pad_token_id=tokenizer.pad_token_id)
    if sampling:
        kwargs.update(temperature=temperature, top_p=top_p)
    else:  # greedy: silence the generation config's sampling defaults
        kwargs.update(temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        out = model.generate(**enc, **kwargs)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def write_output(path: str, text: str, *, overwrite: bool) -> None:
    """Write `text` to `path` whole or not at all: into a temporary file beside it, then renamed over it. Without
    `overwrite`, a file that appeared there meanwhile is kept and the run stops (exit 2)."""
    import tempfile

    target = Path(path).expanduser()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=target.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (target.stat().st_mode & 0o7777) if target.is_file() else 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, target)
            return
        try:
            os.link(tmp, target)  # fails if the name exists: nothing of the user's is replaced
        except FileExistsError:
            raise UsageError(
                f"--output {path} appeared while generating: kept as it is; pass --overwrite to replace it"
            ) from None
        except OSError:  # a filesystem without hard links
            if os.path.lexists(target):
                raise UsageError(f"--output {path} appeared while generating: kept as it is") from None
            os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def run(cfg: RunConfig, echo=print) -> None:
    """posttrainllm generate: one --prompt to stdout, or --prompts FILE to JSON Lines (stdout or --output)."""
    from transformers import set_seed

    from posttrainllm import models
    from posttrainllm.config.inputs import output_file_problems  # not at import: config/ reads this module's SPEC
    from posttrainllm.training import quiet_progress_bars
    from posttrainllm.vision.detect import describe_config, is_vlm

    quiet_progress_bars()
    prompts = [cfg.prompt] if cfg.prompt is not None else read_prompts(cfg.prompts)
    model_path, _ = models.resolve_model(cfg.model, trust_remote_code=cfg.trust_remote_code)
    if cfg.output:  # a hub id or GGUF file resolves to a cached directory: never write into the model being used
        problems = output_file_problems("--output", cfg.output, cfg.overwrite, [(f"--model {cfg.model}", model_path)])
        if problems:
            raise UsageError(problems[0])
    vision = is_vlm(model_path, cfg.trust_remote_code)
    if cfg.image and not vision:
        raise UsageError(
            f"--image {cfg.image}: --model {cfg.model} is a text-only model ({describe_config(model_path)}); "
            "give a vision-language model, or leave out --image"
        )
    if cfg.prompt is not None:
        image_lists = [[cfg.image] if cfg.image else []]
    else:
        image_lists = prompt_images(cfg.prompts) if vision else [[] for _ in prompts]
    if vision:
        tokenizer = models.load_processor(model_path, cfg.trust_remote_code)
    else:
        tokenizer = models.load_tokenizer(model_path, cfg.trust_remote_code)
    model = models.load_model(
        model_path, trust_remote_code=cfg.trust_remote_code, precision=models.pick_precision("auto")
    )
    import torch

    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    set_seed(cfg.seed)
    lines, noted = [], set()

    def note(message: str) -> None:  # once per message, on stderr (stdout holds the completions)
        if message not in noted:
            noted.add(message)
            print(f"note: {message}", file=sys.stderr)

    sampling: dict[str, Any] = dict(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, note=note
    )
    for prompt, images in zip(prompts, image_lists):
        if vision:
            completion = complete_image(model, tokenizer, prompt, images, cfg.system, **sampling)
        else:
            text = render(tokenizer, prompt, cfg.prompt_format, cfg.system)
            completion = complete(model, tokenizer, text, **sampling)
        if cfg.prompt is not None:
            echo(completion)
        else:
            record = {"prompt": prompt, **({"images": images} if images else {}), "completion": completion}
            lines.append(json.dumps(record, ensure_ascii=False))
    if cfg.prompt is None:
        if cfg.output:
            write_output(cfg.output, "\n".join(lines) + "\n", overwrite=cfg.overwrite)
            echo(f"{len(lines)} completions written to {cfg.output}")
        else:
            for line in lines:
                echo(line)


def main(cfg: RunConfig) -> None:
    run(cfg)
