"""Options of the panel: optimiser, schedule, batch, precision, trainer arguments."""

from __future__ import annotations

from posttrainllm.config.checks import (
    DPO_LOSS_TYPES,
    OFFLINE_DATA,
    ONLINE_RL,
    POST_TRAINING,
    PRECISIONS,
    REPORT_TO,
    SCHEDULERS,
    TRAINING,
    fraction_below_one,
    non_negative,
    one_of,
    positive,
    positive_int,
    seed_range,
    steps,
)
from posttrainllm.config.opt import Opt

OPTIMISATION: tuple[Opt, ...] = (
    Opt(
        "lr",
        float,
        None,
        "Base learning rate (top block, head). Default: 2e-5 sft/finetune, 5e-7 dpo/kto, 1e-5 reward, "
        "1e-6 grpo/rloo, 5e-4 pretrain.",
        TRAINING,
        positive,
        "FLOAT",
    ),
    Opt(
        "weight_decay",
        float,
        0.0,
        "AdamW weight decay (matrices only; biases and norms get 0).",
        TRAINING,
        non_negative,
        "FLOAT",
    ),
    Opt(
        "optim",
        str,
        "adamw_torch_fused",
        "Optimizer name as in transformers (--optim); must accept parameter groups. The default, torch's fused "
        "AdamW (also TRL's), stepped 5x faster than adamw_torch on a 2-core CPU (docs/performance.md §1).",
        TRAINING,
        metavar="NAME",
    ),
    Opt(
        "lr_scheduler",
        str,
        "linear",
        "LR schedule (applied to every group, keeping the per-block ratios).",
        TRAINING,
        one_of(SCHEDULERS),
        "NAME",
    ),
    Opt(
        "warmup_ratio",
        float,
        0.0,
        "Fraction of steps used for linear warmup.",
        TRAINING,
        fraction_below_one,
        "FRACTION",
    ),
    Opt("max_steps", int, -1, "Number of optimizer steps (-1: train for --epochs).", TRAINING, steps, "N"),
    Opt(
        "epochs",
        float,
        1.0,
        "Number of passes over the data (ignored when --max-steps is set).",
        TRAINING,
        positive,
        "FLOAT",
    ),
    Opt("batch_size", int, 8, "Per-device batch size.", TRAINING, positive_int, "N"),
    Opt("grad_accum", int, 1, "Gradient accumulation steps.", TRAINING, positive_int, "N"),
    Opt(
        "max_length",
        int,
        None,
        "Maximum sequence length in tokens (default 512; pretrain 256).",
        OFFLINE_DATA + ("eval",),
        positive_int,
        "N",
    ),
    Opt("seed", int, 42, "Random seed (0 to 2**32 - 1).", TRAINING + ("generate",), seed_range, "N"),
    Opt(
        "beta",
        float,
        None,
        "β, the strength of the KL penalty to the reference model. Default: 0.1 dpo/kto; 0 grpo (no reference "
        "model is kept); 0.05 rloo (TRL's defaults). distill: the divergence, from 0 (forward KL) through 0.5 "
        "(JSD) to 1 (reverse KL, the default).",
        ("dpo", "kto") + ONLINE_RL + ("distill",),
        non_negative,
        "FLOAT",
    ),
    Opt(
        "loss_type",
        list,
        ["sigmoid"],
        "DPO loss (TRL's loss_type): sigmoid (DPO), ipo, hinge, robust (label smoothing: --trainer-arg "
        "label_smoothing=0.1), apo_zero, sppo_hard, ... Several (repeatable or comma-separated, e.g. sigmoid,sft) "
        "are summed, weighted by --loss-weights.",
        ("dpo",),
        one_of(DPO_LOSS_TYPES),
        "NAME",
        split=True,
    ),
    Opt(
        "loss_weights",
        list,
        None,
        "Weights of the --loss-type losses, one per loss in the same order (e.g. 0.8,0.2; default: 1 each).",
        ("dpo",),
        non_negative,
        "FLOAT",
        item=float,
        split=True,
    ),
    Opt(
        "precision",
        str,
        "auto",
        "auto (bf16 on GPUs that support it, else fp16 on GPU; on CPU bf16 autocast where the CPU has "
        "AVX512-BF16/AMX, else fp32), fp32, bf16 (on CPU: autocast, fp32 weights) or fp16 (GPU).",
        TRAINING,
        one_of(PRECISIONS),
        "NAME",
    ),
    Opt("gradient_checkpointing", bool, False, "Trade compute for memory.", TRAINING),
    Opt(
        "packing",
        bool,
        False,
        "Pack several examples into each row of --max-length tokens (TRL's best-fit-decreasing packing, "
        "padding-free): no pad tokens, each example attends only to itself (per-example position ids), the loss "
        "mask kept. An example longer than --max-length is truncated, as without packing. On a CPU use "
        "--batch-size 1 --grad-accum B: a batch of packed rows is one flattened sequence, whose attention costs "
        "more than the padding saved (docs/performance.md §7).",
        ("sft",),
    ),
    Opt(
        "report_to",
        str,
        "none",
        "Experiment tracking: none, tensorboard, wandb, trackio or all (per-block LRs are logged as lr/block_i).",
        TRAINING,
        one_of(REPORT_TO),
        "NAME",
        panel="Run",
    ),
    Opt(
        "ddp_timeout",
        int,
        1800,
        "Seconds a distributed rank waits for the others before failing (transformers' default: 1800).",
        TRAINING,
        positive_int,
        "SECONDS",
        panel="Run",
    ),
    Opt(
        "trainer_args",
        dict,
        {},
        "Any other SFTConfig / DPOConfig / TrainingArguments field, checked "
        "against the installed version (repeatable, e.g. --trainer-arg "
        "neftune_noise_alpha=5; recipe key trainer_args: a mapping).",
        TRAINING,
        metavar="KEY=VALUE",
        flag="--trainer-arg",
        item=object,
    ),
    Opt(
        "model_args",
        dict,
        {},
        "Keyword argument for from_pretrained (repeatable, e.g. --model-arg "
        "attn_implementation=sdpa; recipe key model_args: a mapping).",
        POST_TRAINING,
        metavar="KEY=VALUE",
        flag="--model-arg",
        item=object,
        panel="Inputs",
    ),
)
