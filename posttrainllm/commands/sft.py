"""`posttrainllm sft`: Supervised fine-tuning with TRL's SFTTrainer.

The setup the post-training commands share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrainllm.commands.spec import CommandSpec, num_proc

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _fields(cfg: RunConfig) -> dict[str, Any]:
    fields: dict[str, Any] = dict(max_length=cfg.max_length, packing=cfg.packing, dataset_num_proc=num_proc(cfg))
    fields["loss_type"] = cfg.sft_loss_type  # nll or dft (TRL's loss; --kl-to-base adds its term on top)
    if cfg.packing:  # best-fit decreasing, padding-free: per-example position ids keep the examples apart
        fields.update(packing_strategy="bfd", padding_free=True)
    return fields


def max_length_steps(cfg: RunConfig, n_train: int | None) -> str:
    """The steps row of a command that trains on rows of at most --max-length tokens."""
    from posttrainllm.training.builder import steps_row

    return steps_row(cfg, n_train, f"max length {cfg.max_length}")


_DFT_ROW = "DFT: each loss token's NLL × its own probability (detached), mean over the loss tokens (--loss-type dft)"


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    loss = {"loss": _DFT_ROW if cfg.sft_loss_type == "dft" else None}
    if not cfg.packing:
        return {"packing": None, **loss}
    row = "best-fit decreasing into rows of --max-length, padding-free (each example attends only to itself)"
    return {
        "packing": row + ("; the steps above count examples, packed rows are fewer" if cfg.max_steps <= 0 else ""),
        **loss,
    }


SPEC = CommandSpec(
    name="sft",
    help="Supervised fine-tuning with TRL's SFTTrainer (Alpaca, messages, ShareGPT, prompt/completion or text data).",
    trainer="trl:SFTTrainer",
    trainer_config="trl:SFTConfig",
    trainer_fields=_fields,
    owned_fields={"packing": "--packing", "padding_free": "--packing", "loss_type": "--loss-type"},
    data="sft",
    vision=True,
    lr=2e-5,
    max_length=512,
    rows=_rows,
    steps=max_length_steps,
)


def main(cfg: RunConfig) -> None:
    from posttrainllm import lifecycle
    from posttrainllm.commands import post_training

    lifecycle.run(cfg, SPEC, post_training.setup)
