"""The data sequence of a training run: prepare (read → convert → tokenize) → replay → loss mask, from the run's
config. One function per command shape; each returns the `Prepared` data the trainer takes."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrainllm.commands.spec import DataShape
    from posttrainllm.config.runconfig import RunConfig


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
        max_samples=cfg.max_samples,
        num_proc=cfg.dataset_num_proc,
        streaming=cfg.streaming,
        stream_rows=_stream_rows(cfg),
    )


def prepare(cfg: RunConfig, tokenizer, shape: DataShape):
    """A post-training command's data, of its spec's `shape` (posttrainllm/commands/spec.py: sft rows, preference
    pairs, unpaired labelled completions, prompts, or raw text), replay mixed in, then (sft) the loss mask."""
    from posttrainllm import data

    common = data_options(cfg)
    if shape == "sft":
        prepared = data.prepare_sft(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    elif shape == "preference":
        prepared = data.prepare_dpo(cfg.dataset, tokenizer, **common)
    elif shape == "unpaired":
        prepared = data.prepare_kto(cfg.dataset, tokenizer, **common)
    elif shape == "prompts":
        prepared = data.prepare_prompts(cfg.dataset, tokenizer, **common)
    else:
        prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    if cfg.replay_dataset:
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
