"""`posttrainllm sft`: Supervised fine-tuning with TRL's SFTTrainer.

The setup the post-training commands share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import num_proc
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.context import Context, Setup


def _fields(cfg: RunConfig) -> dict[str, Any]:
    fields: dict[str, Any] = dict(max_length=cfg.max_length, packing=cfg.packing, dataset_num_proc=num_proc(cfg))
    fields["loss_type"] = cfg.sft_loss_type  # nll or dft (TRL's loss; --kl-to-base adds its term on top)
    if cfg.packing:  # best-fit decreasing, padding-free: per-example position ids keep the examples apart
        fields.update(packing_strategy="bfd", padding_free=True)
    else:  # padding-free where exact for the model (training/padding_free.py decides), else padded
        fields["padding_free"] = cfg.padding_free
    return fields


def max_length_steps(cfg: RunConfig, n_train: int | None) -> str:
    """The steps row of a command that trains on rows of at most --max-length tokens."""
    from posttrainllm.training.builder import steps_row

    return steps_row(cfg, n_train, f"max length {cfg.max_length}")


DFT_ROW = (
    "DFT: each loss token's NLL × its own probability (detached), mean over the loss tokens (--loss-type dft); "
    "eval_loss stays the plain NLL"
)


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    loss = {"loss": DFT_ROW if cfg.sft_loss_type == "dft" else None}
    if not cfg.packing:
        return {"packing": None, **loss}
    row = "best-fit decreasing into rows of --max-length, padding-free (each example attends only to itself)"
    return {
        "packing": row + ("; the steps above count examples, packed rows are fewer" if cfg.max_steps <= 0 else ""),
        **loss,
    }


def _packing_is_padding_free(command: str, v: Mapping[str, Any]) -> list[str]:
    if v.get("packing") and v.get("padding_free") is False:
        return [
            "--no-padding-free with --packing: TRL's best-fit-decreasing packing is always padding-free; drop one of "
            "them (--no-padding-free alone trains on padded batches)"
        ]
    return []


SPEC = CommandSpec(
    name="sft",
    setup="posttrainllm.commands.sft:setup",
    sweep=True,
    help="Supervised fine-tuning with TRL's SFTTrainer (Alpaca, messages, ShareGPT, prompt/completion or text data).",
    trainer="trl:SFTTrainer",
    trainer_config="trl:SFTConfig",
    trainer_fields=_fields,
    owned_fields={"packing": "--packing", "padding_free": "--no-padding-free", "loss_type": "--loss-type"},
    data="sft",
    vision=True,
    lr=2e-5,
    max_length=512,
    rows=_rows,
    steps=max_length_steps,
    checks=(_packing_is_padding_free,),
    # --loss-type dft trains on DFT and evaluates the NLL, as finetune does (a sweep's frontier compares eval losses)
    trainer_mixins=("posttrainllm.training.dft:PlainEvalLossMixin",),
)


def setup(ctx: Context) -> Setup:
    """The post-training setup, then the batches: padding-free where exact for the loaded model (its class and
    attention, posttrainllm/training/padding_free.py), else padded; the banner's "batches" row says which and why,
    and run_config.json records it (`padding_free_used`, and `padded_because`)."""
    from posttrainllm.commands import post_training
    from posttrainllm.training.padding_free import batches_row

    s = post_training.setup(ctx)
    row, record = batches_row(s.cfg, s.model)
    info = {}
    for key, value in s.info.items():
        info[key] = value
        if key == "steps":
            info["batches"] = row
    s.info = info if "batches" in info else {**info, "batches": row}
    s.resolved.update(record)
    return s
