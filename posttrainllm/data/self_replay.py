"""Self-replay (`--self-replay N`): texts sampled from the starting model before training, mixed into the training
rows at `--replay-ratio` through the replay path (posttrainllm/data/replay.py), against forgetting without any data
from the user.

What is sampled: N texts at temperature 1 (no top-k, no top-p, no other logits processor), each at most
`--max-length` tokens with its prompt. The prompt is the shape the replay rows are trained in:

* conversational sft rows (message lists): the chat template's generation prompt after an empty user turn, so a
  sample is the model's answer to an empty user message, and its replay row is exactly that exchange;
* any other rows (prompt/completion strings, text, finetune's token blocks): the BOS token alone (the EOS token when
  the tokenizer has no BOS), so a sample is the model's unconditioned text.

How: `torch.manual_seed(--seed)`, then `model.generate` on consecutive batches of `--self-replay-batch-size` copies
of the prompt (one prompt for all rows: no padding, the KV cache on), exactly what a bare `generate` loop does, so
the same seed (and batch size, model and torch build) gives the same file. A text ends at the model's EOS.

Where: `OUT/self_replay.jsonl` (one {"text": ...} per line: a plain text dataset, usable as `--replay-dataset` by
another run) and `OUT/self_replay.json` (the sampling settings: the model's identity, N, temperature, max length,
seed, batch size, the prompt, and the file's SHA-256). A later run into the same directory with the same settings
reuses the file instead of sampling again; `--resume` always reuses it and refuses (exit 2) when the settings differ
(a changed N) or the file changed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DataError, UsageError
from ..rundir.layout import (
    RUN_CONFIG,
    SELF_REPLAY,
    SELF_REPLAY_SETTINGS,
    is_rank0,
    sha256,
    world_size,
    write_json,
)
from .replay import replay_rows

TEMPERATURE = 1.0
RECORD = "self_replay_samples"  # run_config.json's record of the samples (their settings and SHA-256)
PROGRESS_EVERY = 10.0  # seconds between two progress lines while sampling
# the settings that make the file what it is: another value means other samples
KEYS = ("model", "n", "temperature", "max_length", "seed", "batch_size", "prompt_ids")
MEASURED = ("seconds", "samples_per_s", "generated_tokens")  # what sampling measured, kept when the file is reused

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


@dataclass
class SelfReplay:
    """The samples of a run and how they were drawn (`settings`, as `self_replay.json` holds them)."""

    texts: list[str]
    settings: dict
    reused: bool = False
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # what sampling measured: samples/s, tokens

    def content(self) -> bytes:
        """What `self_replay.jsonl` holds: one {"text": ...} JSON line per sample."""
        return "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in self.texts).encode("utf-8")

    def write(self, out) -> None:
        """`self_replay.jsonl` then `self_replay.json` into `out` (a path or the run's RunDir), each atomically
        (rank 0); both names are posttrainllm's own records (posttrainllm/rundir/layout.py)."""
        if not is_rank0():
            return
        out = Path(getattr(out, "path", out))
        path = out / SELF_REPLAY
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.content())
        os.replace(tmp, path)
        write_json(out / SELF_REPLAY_SETTINGS, self.record())

    def record(self) -> dict:
        """self_replay.json (and run_config.json's record): the settings, the count, the timing and the SHA-256."""
        digest = hashlib.sha256(self.content()).hexdigest()
        return {**self.settings, "samples": len(self.texts), **self.extra, "sha256": digest}

    def row(self) -> str:
        """The banner's words for the samples."""
        how = "reused from " + SELF_REPLAY if self.reused else f"sampled in {self.seconds:.0f} s"
        prompt = "after an empty user turn" if self.settings.get("prompt") == "chat" else "from BOS"
        return (
            f"{len(self.texts)} samples of the starting model ({prompt}, temperature {TEMPERATURE:g}, at most "
            f"{self.settings['max_length']} tokens; {how})"
        )


# --------------------------------------------------------------------------------- how many samples a run uses
def _per_row(blocks: bool, packing: bool, max_length: int | None) -> tuple[int, str]:
    """Samples one replay row can hold, and the words for it: one (an sft row is one chunk of one sample); a token
    block (finetune's text) or a packed sft row holds at most --max-length of them (a sample is at least one token)."""
    if (blocks or packing) and max_length:
        what = "blocks" if blocks else "packed rows"
        return max_length, f"replay {what} of --max-length {max_length} tokens (a sample is at least one token)"
    return 1, "replay rows (one sample each)"


def count_problems(v: dict, *, blocks: bool) -> list[str]:
    """--self-replay N above the most samples the run can train on (one line each), from what is known before any
    data or model is read: --max-steps × --batch-size × --grad-accum (× the processes) × --replay-ratio replay rows;
    under --epochs, where the step count is not known yet, --max-samples bounds the sft rows (the rest is checked
    once the data is read: `check_pool`). `blocks`: the run trains on token blocks of raw text (else on rows). The
    one check the training commands and the sweep's cells both run."""
    n, ratio = v.get("self_replay") or 0, v.get("replay_ratio") or 0.0
    if n <= 0 or not 0.0 < ratio < 1.0:
        return []
    per_row, what = _per_row(blocks, bool(v.get("packing")), v.get("max_length"))
    steps, batch, accum = v.get("max_steps") or -1, v.get("batch_size") or 1, v.get("grad_accum") or 1
    if steps > 0:
        world = world_size()
        procs = f" × {world} processes" if world > 1 else ""
        rows = math.ceil(round(steps * batch * accum * world * ratio, 6))
        how = f"--max-steps {steps} × --batch-size {batch} × --grad-accum {accum}{procs} × --replay-ratio {ratio:g}"
        fix = "raise --max-steps or --replay-ratio"
    elif not blocks and v.get("max_samples"):
        rows = replay_rows(v["max_samples"], ratio)
        how = (f"--epochs: the step count is known once the data is read; --max-samples {v['max_samples']} rows "
               f"at --replay-ratio {ratio:g}")  # fmt: skip
        fix = "raise --max-samples or --replay-ratio"
    else:
        return []
    most = rows * per_row
    if n <= most:
        return []
    return [f"--self-replay {n}: this run trains on at most {most} samples ({how} = {rows} {what}); give "
            f"--self-replay {most} or fewer, or {fix}"]  # fmt: skip


def check_pool(cfg: RunConfig, n_train: int | None, *, blocks: bool) -> None:
    """--self-replay N above what the replay mix can hold, once the training rows are counted (before any model
    loads): `n_train` rows at --replay-ratio take replay_rows(n, ratio) replay rows (posttrainllm/data/replay.py),
    the same rows again each epoch, so no more samples than those rows hold are ever trained on. A UsageError."""
    if not cfg.self_replay or n_train is None:
        return
    rows = replay_rows(n_train, cfg.replay_ratio)
    per_row, what = _per_row(blocks, cfg.packing and not blocks, cfg.max_length)
    most = rows * per_row
    if cfg.self_replay > most:
        raise UsageError(
            f"--self-replay {cfg.self_replay}: this run trains on at most {most} samples ({n_train} training "
            f"{'blocks' if blocks else 'rows'} at "
            f"--replay-ratio {cfg.replay_ratio:g} take {rows} {what}, the same ones every epoch); give "
            f"--self-replay {most} or fewer, or raise --replay-ratio"
        )


def prompt_ids(tokenizer, chat: bool) -> list[int]:
    """The prompt every sample continues: the chat template's generation prompt after an empty user turn (`chat`),
    else [BOS] (or [EOS] when the tokenizer has no BOS). E.g. [1] for a tokenizer whose BOS id is 1."""
    if chat:
        empty_turn = [{"role": "user", "content": ""}]
        ids = tokenizer.apply_chat_template(empty_turn, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return [int(i) for i in ids]
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise DataError("--self-replay: the tokenizer has neither a BOS nor an EOS token to start a sample from")
    return [int(start)]


def generate_kwargs(tokenizer, max_new_tokens: int) -> dict:
    """model.generate's arguments for pure sampling at temperature 1: no top-k, no top-p, no repetition penalty and
    no minimum length, whatever the model's generation_config says; a text ends at EOS."""
    return dict(
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        min_p=None,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        min_new_tokens=0,
        max_new_tokens=max_new_tokens,
        num_beams=1,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def draw(model, tokenizer, prompt: list[int], *, n: int, max_length: int, seed: int, batch_size: int, progress=None):
    """N samples of `model` after `prompt`, as (texts, generated token counts).

    Exactly `torch.manual_seed(seed)` followed by ``model.generate(prompt × b, **generate_kwargs(...))`` for
    consecutive batches of b = min(batch_size, what is left) rows, each text decoded up to its first EOS with the
    special tokens left out. `max_length` counts the prompt too: max_new_tokens = max_length - len(prompt).
    `progress(done, n, seconds)` is called after each batch. E.g. n=5, batch_size=2: batches of 2, 2 and 1 rows."""
    import torch

    if n <= 0:
        return [], []
    max_new = _room(prompt, max_length)
    device = next(model.parameters()).device
    kwargs = generate_kwargs(tokenizer, max_new)
    eos = {int(e) for e in ([kwargs["eos_token_id"]] if kwargs["eos_token_id"] is not None else [])}
    texts: list[str] = []
    lengths: list[int] = []
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:  # the run's own random state is left as it was: training draws the same numbers with or without samples
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(seed)
            while len(texts) < n:
                b = min(batch_size, n - len(texts))
                ids = torch.tensor([prompt] * b, dtype=torch.long, device=device)
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
                for row in out[:, len(prompt) :].tolist():
                    cut = next((i for i, t in enumerate(row) if t in eos), len(row))
                    lengths.append(cut)
                    texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
                if progress is not None:
                    progress(len(texts), n, time.perf_counter() - t0)
    finally:
        model.train(was_training)
    return texts, lengths


def _room(prompt: list[int], max_length: int) -> int:
    """Tokens a sample may have after its prompt; a UsageError when the prompt leaves none."""
    if max_length - len(prompt) < 1:
        raise UsageError(
            f"--self-replay: the prompt is {len(prompt)} tokens, which leaves no room under --max-length "
            f"{max_length}; raise --max-length"
        )
    return max_length - len(prompt)


class Progress:
    """`self-replay: 64/256 samples, 3.1 samples/s` at most every PROGRESS_EVERY seconds while sampling, and at the
    end (rank 0; plain lines, so a log file reads them too)."""

    def __init__(self, echo: Callable[[str], None], every: float = PROGRESS_EVERY):
        self.echo, self.every, self.last = echo, every, 0.0

    def __call__(self, done: int, n: int, seconds: float) -> None:
        if done < n and seconds - self.last < self.every:
            return
        self.last = seconds
        rate = done / seconds if seconds > 0 else float("inf")
        self.echo(f"self-replay: {done}/{n} samples, {rate:.2f} samples/s, {seconds:.0f} s")


def settings(cfg: RunConfig, model_identity, prompt: list[int], chat: bool) -> dict:
    """What makes the file what it is (`KEYS`), plus the prompt's form."""
    return {
        "model": model_identity,
        "model_ref": cfg.model,
        "n": cfg.self_replay,
        "temperature": TEMPERATURE,
        "max_length": cfg.max_length,
        "seed": cfg.seed,
        "batch_size": cfg.self_replay_batch_size,
        "prompt": "chat" if chat else "bos",
        "prompt_ids": prompt,
    }


def _saved(out: Path) -> tuple[dict | None, list[str] | None, str | None]:
    """(settings, texts, why not usable) of the samples in `out`; (None, None, None) when there are none."""
    spath, tpath = out / SELF_REPLAY_SETTINGS, out / SELF_REPLAY
    if not spath.is_file() and not tpath.is_file():
        return None, None, None
    try:
        saved = json.loads(spath.read_text())
        digest = sha256(tpath)
        lines = tpath.read_text(encoding="utf-8").split("\n")  # not splitlines: a text may hold U+2028 or U+0085
        texts = [json.loads(line)["text"] for line in lines if line.strip()]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, None, f"{SELF_REPLAY} or {SELF_REPLAY_SETTINGS} cannot be read ({e})"
    if not isinstance(saved, dict) or saved.get("sha256") != digest:
        return saved if isinstance(saved, dict) else None, None, f"{SELF_REPLAY} changed since it was written"
    recorded = _run_config_digest(out)
    if recorded and recorded != digest:
        return saved, None, f"{SELF_REPLAY} is not the file run_config.json records"
    return saved, texts, None


def _run_config_digest(out: Path) -> str | None:
    try:
        rec = json.loads((out / RUN_CONFIG).read_text()).get(RECORD, {})
    except (OSError, ValueError, AttributeError):
        return None
    return rec.get("sha256") if isinstance(rec, dict) else None


def _mismatch(saved: dict, current: dict) -> list[str]:
    return [f"{k}: {saved.get(k)!r} → {current[k]!r}" for k in KEYS if saved.get(k) != current[k]]


def obtain(cfg: RunConfig, tokenizer, *, chat: bool, model_identity, load_model: Callable, echo=print) -> SelfReplay:
    """The run's samples: reused from the output directory when they were drawn with the same settings (always
    on --resume, which refuses other settings or a changed file with a UsageError, before any model loads), else
    drawn from `load_model()` (the starting model, loaded for this and released after)."""
    out = Path(cfg.output_dir).expanduser()
    prompt = prompt_ids(tokenizer, chat)
    current = settings(cfg, model_identity, prompt, chat)
    saved, texts, problem = _saved(out)
    if cfg.resume:
        if saved is None and problem is None:
            raise UsageError(
                f"--resume: {cfg.output_dir} holds no {SELF_REPLAY}: the run being resumed was not trained with "
                f"--self-replay {cfg.self_replay}; resume it without --self-replay, or start a new run"
            )
        diffs = _mismatch(saved or {}, current) if saved else []
        if problem or diffs:
            why = problem or "; ".join(diffs)
            raise UsageError(
                f"--resume: the self-replay samples in {cfg.output_dir} do not match this run ({why}); resume with "
                f"the original --self-replay {(saved or {}).get('n', '?')} and settings, or start a new run "
                "(--overwrite or another --output-dir)"
            )
    if texts is not None and not _mismatch(saved, current):
        measured = {k: saved[k] for k in MEASURED if k in saved}
        return SelfReplay(texts, current, reused=True, extra=measured)
    _room(prompt, cfg.max_length)  # before the model loads
    if is_rank0():
        echo(
            f"self-replay: sampling {cfg.self_replay} texts from the starting model (batches of "
            f"{cfg.self_replay_batch_size}, at most {cfg.max_length} tokens each)"
        )
    model = load_model()
    t0 = time.perf_counter()
    texts, lengths = draw(
        model, tokenizer, prompt, n=cfg.self_replay, max_length=cfg.max_length, seed=cfg.seed,
        batch_size=cfg.self_replay_batch_size, progress=Progress(echo) if is_rank0() else None,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    del model  # the sampling copy goes before the model to train loads
    _free_memory()
    rate = round(len(texts) / max(seconds, 1e-9), 3)
    extra = dict(zip(MEASURED, (round(seconds, 2), rate, sum(lengths))))
    return SelfReplay(texts, current, seconds=seconds, extra=extra)


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def replay_pool(sr: SelfReplay, tokenizer, *, blocks: bool, max_length: int):
    """The samples as the replay path takes them: a {"text"} dataset (sft), or token blocks of `max_length` cut
    from the samples joined with EOS (finetune; posttrainllm/data/text.py, as --replay-dataset is)."""
    import datasets

    from . import text

    ds = datasets.Dataset.from_dict({"text": sr.texts})
    if not blocks:
        return ds
    tokenized = text.tokenize(ds, tokenizer, SELF_REPLAY)
    n_tokens = text.count_tokens(tokenized)
    out = text.group(tokenized, max_length, n_tokens)
    if out.num_rows == 0:
        raise DataError(
            f"--self-replay {sr.settings['n']}: the samples hold {n_tokens} tokens, fewer than one block of "
            f"--max-length {max_length}; raise --self-replay"
        )
    return out
