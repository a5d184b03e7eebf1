"""The data sequence of a training run: prepare (read → convert → tokenize) → replay → loss mask, from the run's
config. One function per command shape; each returns the `Prepared` data the trainer takes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from posttrainllm.data import self_replay
from posttrainllm.spec import load

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import DataShape


def _stream_rows(cfg: RunConfig) -> int | None:
    """Rows (or blocks) one streamed run reads: what --eval-split's fraction is taken of, from the head."""
    if not cfg.streaming or cfg.max_steps <= 0:
        return None
    return cfg.max_steps * cfg.batch_size * cfg.grad_accum * int(os.environ.get("WORLD_SIZE", "1"))


def data_options(cfg: RunConfig) -> dict:
    """The options every data preparation takes from the run's config."""
    return dict(
        eval_split=cfg.eval_split,
        eval_source=cfg.eval_dataset,
        seed=cfg.seed,
        split_seed=cfg.eval_split_seed,
        max_samples=cfg.max_samples,
        num_proc=cfg.dataset_num_proc,
        streaming=cfg.streaming,
        stream_rows=_stream_rows(cfg),
    )


def prepare(
    cfg: RunConfig,
    tokenizer,
    shape: DataShape,
    starting_model: Callable[[], Any] | None = None,
    model_identity=None,
    *,
    reader: str | None = None,
):
    """A post-training command's data, of its spec's `shape` (posttrainllm/spec.py: sft rows, preference
    pairs, unpaired labelled completions, prompts, or raw text; or, read by `reader`, its spec's `prepare`, a shape
    of the command's own), replay mixed in (--replay-dataset, or --self-replay's samples of `starting_model()`, a
    loader of the model training starts from), then (sft) the loss mask."""
    from posttrainllm import data

    common = data_options(cfg)
    if reader is not None:
        prepared = load(reader)(cfg, tokenizer, common)
    elif shape == "sft":
        prepared = data.prepare_sft(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    elif shape == "preference":
        prepared = data.prepare_dpo(cfg.dataset, tokenizer, **common)
    elif shape == "unpaired":
        prepared = data.prepare_kto(cfg.dataset, tokenizer, **common)
    elif shape == "prompts":
        prepared = data.prepare_prompts(cfg.dataset, tokenizer, **common)
    else:
        prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    if getattr(cfg, "self_replay", 0) and not cfg.streaming:  # before the sampling model loads
        self_replay.check_pool(cfg, prepared.n_train, blocks=shape == "text")
    if _self_replay_on(cfg):
        sr = self_replay.obtain(
            cfg, tokenizer, chat=shape == "sft" and prepared.conversational, model_identity=model_identity,
            load_model=starting_model, echo=banner_echo,
        )  # fmt: skip
        replay = self_replay.replay_pool(sr, tokenizer, blocks=shape == "text", max_length=cfg.max_length)
        prepared.train = data.mix_replay(prepared.train, replay, cfg.replay_ratio, cfg.seed)
        prepared.self_replay = sr
        if not cfg.streaming:
            prepared.n_train = len(prepared.train)
    elif cfg.replay_dataset:
        if shape == "sft":  # replay rows take the SFT rows' shape, with the loss on the replayed text
            replay = data.load_texts(cfg.replay_dataset, streaming=cfg.streaming)
        else:  # finetune: replay token blocks of the same length beside the training blocks
            replay = data.prepare_text(
                cfg.replay_dataset,
                tokenizer,
                max_length=cfg.max_length,
                seed=cfg.seed,
                num_proc=cfg.dataset_num_proc,
                streaming=cfg.streaming,
            ).train
        prepared.train = data.mix_replay(prepared.train, replay, cfg.replay_ratio, cfg.seed)
        if not cfg.streaming:
            prepared.n_train = len(prepared.train)
    if shape == "sft":  # after replay: replay rows are masked like the others (their text is all trained)
        prepared.loss = data.apply_loss_mask(
            prepared, tokenizer, train_on_prompt=cfg.train_on_prompt, num_proc=cfg.dataset_num_proc
        )
    return prepared


def _self_replay_on(cfg: RunConfig) -> bool:
    """--self-replay N > 0 on a run that trains (a dry run samples nothing: its banner says what would be)."""
    return bool(getattr(cfg, "self_replay", 0)) and not cfg.dry_run


def banner_echo(line: str) -> None:
    from posttrainllm.reporting import banner

    banner.console.print(line)


def replay_row(cfg: RunConfig, prepared) -> str | None:
    """The banner's replay row: where the replay rows come from and their share of the rows."""
    if getattr(cfg, "self_replay", 0):
        sr = getattr(prepared, "self_replay", None)
        what = sr.row() if sr is not None else f"{cfg.self_replay} samples of the starting model (not drawn: dry run)"
        return f"{cfg.replay_ratio:.0%} of rows from self-replay: {what}"
    return f"{cfg.replay_ratio:.0%} of rows from {cfg.replay_dataset}" if cfg.replay_dataset else None
