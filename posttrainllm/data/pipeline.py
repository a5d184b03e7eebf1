"""The data sequence of a training run: prepare (read → convert → tokenize) → replay → loss mask, from the run's
config. One function per command shape; each returns the `Prepared` data the trainer takes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from posttrainllm.data import self_replay


def _stream_rows(cfg) -> int | None:
    """Rows (or blocks) one streamed run reads: what --eval-split's fraction is taken of, from the head."""
    if not cfg.streaming or cfg.max_steps <= 0:
        return None
    return cfg.max_steps * cfg.batch_size * cfg.grad_accum * int(os.environ.get("WORLD_SIZE", "1"))


def data_options(cfg) -> dict:
    """The options every data preparation takes from the run's config."""
    return dict(
        eval_split=cfg.eval_split,
        eval_source=cfg.eval_dataset,
        seed=cfg.seed,
        max_samples=cfg.max_samples,
        num_proc=cfg.dataset_num_proc,
        streaming=cfg.streaming,
        stream_rows=_stream_rows(cfg),
    )


def prepare(cfg, tokenizer, starting_model: Callable[[], Any] | None = None, model_identity=None):
    """sft / dpo / kto / reward / grpo / rloo / finetune data: the command's shape, replay mixed in (--replay-dataset,
    or --self-replay's samples of `starting_model()`, a loader of the model training starts from), then (sft) the loss
    mask."""
    from posttrainllm import data

    common = data_options(cfg)
    if cfg.command == "sft":
        prepared = data.prepare_sft(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    elif cfg.command in ("dpo", "reward"):  # a reward model learns from the same preference pairs
        prepared = data.prepare_dpo(cfg.dataset, tokenizer, **common)
    elif cfg.command == "kto":
        prepared = data.prepare_kto(cfg.dataset, tokenizer, **common)
    elif cfg.command in ("grpo", "rloo", "distill"):
        prepared = data.prepare_prompts(cfg.dataset, tokenizer, **common)
    else:
        prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    if _self_replay_on(cfg):
        sr = self_replay.obtain(
            cfg, tokenizer, chat=cfg.command == "sft" and prepared.conversational, model_identity=model_identity,
            load_model=starting_model, echo=banner_echo,
        )  # fmt: skip
        replay = self_replay.replay_pool(sr, tokenizer, blocks=cfg.command == "finetune", max_length=cfg.max_length)
        prepared.train = data.mix_replay(prepared.train, replay, cfg.replay_ratio, cfg.seed)
        prepared.self_replay = sr
        if not cfg.streaming:
            prepared.n_train = len(prepared.train)
    elif cfg.replay_dataset:
        if cfg.command == "sft":  # replay rows take the SFT rows' shape, with the loss on the replayed text
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
    if cfg.command == "sft":  # after replay: replay rows are masked like the others (their text is all trained)
        prepared.loss = data.apply_loss_mask(
            prepared, tokenizer, train_on_prompt=cfg.train_on_prompt, num_proc=cfg.dataset_num_proc
        )
    return prepared


def _self_replay_on(cfg) -> bool:
    """--self-replay N > 0 on a run that trains (a dry run samples nothing: its banner says what would be)."""
    return bool(getattr(cfg, "self_replay", 0)) and not cfg.dry_run


def banner_echo(line: str) -> None:
    from posttrainllm import banner

    banner.console.print(line)


def replay_row(cfg, prepared) -> str | None:
    """The banner's replay row: where the replay rows come from and their share of the rows."""
    if getattr(cfg, "self_replay", 0):
        sr = getattr(prepared, "self_replay", None)
        what = sr.row() if sr is not None else f"{cfg.self_replay} samples of the starting model (not drawn: dry run)"
        return f"{cfg.replay_ratio:.0%} of rows from self-replay: {what}"
    return f"{cfg.replay_ratio:.0%} of rows from {cfg.replay_dataset}" if cfg.replay_dataset else None
