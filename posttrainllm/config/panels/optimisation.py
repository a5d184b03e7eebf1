"""Options of the panel: optimiser, schedule, batch, precision, trainer arguments."""

from __future__ import annotations

from posttrainllm.config.checks import (
    DPO_LOSS_TYPES,
    PRECISIONS,
    REPORT_TO,
    SCHEDULERS,
    SFT_LOSS_TYPES,
    fraction_below_one,
    non_negative,
    one_of,
    positive,
    positive_int,
    seed_range,
    steps,
)
from posttrainllm.config.opt import Opt
from posttrainllm.spec import BETA, OFFLINE_DATA, POST_TRAINING, TRAINING, own

OPTIMISATION: tuple[Opt, ...] = (
    Opt(
        name="lr",
        type=float,
        default=None,
        help="Base learning rate (top block, head).",
        defaults_from="lr",
        commands=TRAINING,
        check=positive,
        metavar="FLOAT",
    ),
    Opt(
        name="weight_decay",
        type=float,
        default=0.0,
        help="AdamW weight decay (matrices only; biases and norms get 0).",
        commands=TRAINING,
        check=non_negative,
        metavar="FLOAT",
    ),
    Opt(
        name="optim",
        type=str,
        default="adamw_torch_fused",
        help="Optimizer name as in transformers (--optim); must accept parameter groups. The default, torch's fused "
        "AdamW (also TRL's), stepped 5x faster than adamw_torch on a 2-core CPU (docs/performance.md §1).",
        commands=TRAINING,
        metavar="NAME",
    ),
    Opt(
        name="lr_scheduler",
        type=str,
        default="linear",
        help="LR schedule (applied to every group, keeping the per-block ratios).",
        commands=TRAINING,
        check=one_of(SCHEDULERS),
        metavar="NAME",
    ),
    Opt(
        name="warmup_ratio",
        type=float,
        default=0.0,
        help="Fraction of steps used for linear warmup.",
        commands=TRAINING,
        check=fraction_below_one,
        metavar="FRACTION",
    ),
    Opt(
        name="max_steps",
        type=int,
        default=-1,
        help="Number of optimizer steps (-1: train for --epochs).",
        commands=TRAINING,
        check=steps,
        metavar="N",
    ),
    Opt(
        name="epochs",
        type=float,
        default=1.0,
        help="Number of passes over the data (ignored when --max-steps is set).",
        commands=TRAINING,
        check=positive,
        metavar="FLOAT",
    ),
    Opt(
        name="batch_size",
        type=int,
        default=8,
        help="Per-device batch size.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
    ),
    Opt(
        name="grad_accum",
        type=int,
        default=1,
        help="Gradient accumulation steps.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
    ),
    Opt(
        name="max_length",
        type=int,
        default=None,
        help="Maximum sequence length in tokens.",
        defaults_from="max_length",
        commands=OFFLINE_DATA | own("eval"),
        check=positive_int,
        metavar="N",
    ),
    Opt(
        name="seed",
        type=int,
        default=42,
        help="Random seed (0 to 2**32 - 1).",
        commands=TRAINING | own("generate"),
        check=seed_range,
        metavar="N",
    ),
    Opt(
        name="beta",
        type=float,
        default=None,
        help="β, the strength of the KL penalty to the reference model (0: no reference model is kept; the defaults "
        "are TRL's). distill, sdft: the divergence, from 0 (forward KL) through 0.5 (JSD) to 1 (reverse KL).",
        defaults_from="beta",
        commands=BETA,
        check=non_negative,
        metavar="FLOAT",
    ),
    Opt(
        name="loss_type",
        type=list,
        default=["sigmoid"],
        help="DPO loss (TRL's loss_type): sigmoid (DPO), ipo, hinge, robust (label smoothing: --trainer-arg "
        "label_smoothing=0.1), apo_zero, sppo_hard, ... Several (repeatable or comma-separated, e.g. sigmoid,sft) "
        "are summed, weighted by --loss-weights.",
        commands=own("dpo"),
        check=one_of(DPO_LOSS_TYPES),
        metavar="NAME",
        split=True,
    ),
    Opt(
        name="sft_loss_type",
        key="loss_type",
        type=str,
        default="nll",
        help="The training loss: nll, the mean cross-entropy of the loss tokens; or dft, Dynamic Fine-Tuning "
        "(arXiv 2508.05629): each token's NLL weighted by its own probability (detached), mean over the same tokens. "
        "With --kl-to-base β: DFT + β × KL(base ‖ model), the ASFT form. sft: TRL's loss_type; finetune: "
        "posttrainllm's. Only training uses it: the evaluation loss (eval_loss) and --ood-eval's perplexity stay "
        "the plain NLL, so runs of either loss compare.",
        commands=own("sft") | own("finetune"),
        check=one_of(SFT_LOSS_TYPES),
        metavar="NAME",
    ),
    Opt(
        name="loss_weights",
        type=list,
        default=None,
        help="Weights of the --loss-type losses, one per loss in the same order (e.g. 0.8,0.2; default: 1 each).",
        commands=own("dpo"),
        check=non_negative,
        metavar="FLOAT",
        item=float,
        split=True,
    ),
    Opt(
        name="precision",
        type=str,
        default="auto",
        help="auto (bf16 on GPUs that support it, else fp16 on GPU; on CPU bf16 autocast where the CPU has "
        "AVX512-BF16/AMX, else fp32), fp32, bf16 (on CPU: autocast, fp32 weights) or fp16 (GPU). Held-out "
        "evaluation (--ood-eval, eval, merge) scores at the same precision; fp32 gives exact figures where two "
        "models differ very little (bf16 rounds the logits).",
        commands=TRAINING | own("eval") | own("merge"),
        check=one_of(PRECISIONS),
        metavar="NAME",
    ),
    Opt(name="gradient_checkpointing", type=bool, default=False, help="Trade compute for memory.", commands=TRAINING),
    Opt(
        name="packing",
        type=bool,
        default=False,
        help="Pack several examples into each row of --max-length tokens (TRL's best-fit-decreasing packing, "
        "padding-free): no pad tokens, each example attends only to itself (per-example position ids), the loss "
        "mask kept. An example longer than --max-length is truncated, as without packing. On a CPU use "
        "--batch-size 1 --grad-accum B: a batch of packed rows is one flattened sequence, whose attention costs "
        "more than the padding saved (docs/performance.md §7).",
        commands=own("sft"),
    ),
    Opt(
        name="padding_free",
        type=bool,
        default=True,
        flag="--no-padding-free",
        negates=True,
        help="Pad each batch to its longest row instead of training padding-free. By default sft trains "
        "padding-free where that is exact: a batch's examples are concatenated into one row, each with its own "
        "position ids and no attention mask, so each attends only to itself and the loss equals the padded one's "
        "(the same rows and steps, no pad tokens); a batch is flattened only where that computes less than its "
        "padding (one row's attention costs the square of its total length). Where it is not verified exact (an "
        "attention other than sdpa "
        "or eager, a vision-language model, an architecture not tested, remote code), batches are padded and the "
        "banner's batches row says why (docs/performance.md §7). Recipe key: padding_free: false.",
        commands=own("sft"),
    ),
    Opt(
        name="report_to",
        type=str,
        default="none",
        help="Experiment tracking: none, tensorboard, wandb, trackio or all (per-block LRs are logged as lr/block_i).",
        commands=TRAINING,
        check=one_of(REPORT_TO),
        metavar="NAME",
        panel="Run",
    ),
    Opt(
        name="ddp_timeout",
        type=int,
        default=1800,
        help="Seconds a distributed rank waits for the others before failing (transformers' default: 1800).",
        commands=TRAINING,
        check=positive_int,
        metavar="SECONDS",
        panel="Run",
    ),
    Opt(
        name="trainer_args",
        type=dict,
        default={},
        help="Any other SFTConfig / DPOConfig / TrainingArguments field, checked "
        "against the installed version (repeatable, e.g. --trainer-arg "
        "neftune_noise_alpha=5; recipe key trainer_args: a mapping).",
        commands=TRAINING,
        metavar="KEY=VALUE",
        flag="--trainer-arg",
        item=object,
    ),
    Opt(
        name="model_args",
        type=dict,
        default={},
        help="Keyword argument for from_pretrained (repeatable, e.g. --model-arg "
        "attn_implementation=sdpa; recipe key model_args: a mapping).",
        commands=POST_TRAINING,
        metavar="KEY=VALUE",
        flag="--model-arg",
        item=object,
        panel="Inputs",
    ),
)

PANEL, ORDER = OPTIMISATION, 30  # this panel's options, and its place in the help (config/panels/__init__.py)
