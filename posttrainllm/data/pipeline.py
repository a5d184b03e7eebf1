"""The data sequence of a training run: prepare (read → convert → tokenize) → replay → loss mask, from the run's
config. One function per command shape; each returns the `Prepared` data the trainer takes."""

from __future__ import annotations

import os


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


def prepare(cfg, tokenizer):
    """sft / dpo / kto / reward / grpo / rloo / finetune data: the command's shape, replay mixed in, then (sft) the loss
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
    if cfg.replay_dataset:
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
