"""Options of the panel: measuring and limiting forgetting."""

from __future__ import annotations

from posttrainllm.config.checks import (
    fraction_below_one,
    non_negative,
    non_negative_int,
    positive_int,
)
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import LANGUAGE_MODELS, LIKELIHOOD, OFFLINE_LM, own

FORGETTING: tuple[Opt, ...] = (
    Opt(
        name="ood_eval",
        type=list,
        default=[],
        help="Text file whose perplexity is measured before and after training (repeatable).",
        commands=LANGUAGE_MODELS,
        metavar="FILE",
        panel="Forgetting",
        input=PATH,
    ),
    Opt(
        name="eval_cache",
        type=str,
        default=None,
        help="Folder where the base's held-out evaluation (--ood-eval) is kept and reused: the base is scored once "
        "per text and window, and every later run from the same base takes its perplexity from there and computes "
        "its KL in one forward (the base's top 256 tokens per position exactly, the rest estimated from 64 tokens "
        "drawn from the base's distribution over it: unbiased, within 0.1% of the exact KL on SmolLM2 and Gemma 3; "
        "exact for a vocabulary of at most 256 tokens). Never inside --model or a data set's folder. posttrainllm "
        "sweep sets it for its cells and merges. One process only (several ranks score the base themselves).",
        commands=LANGUAGE_MODELS,
        metavar="DIR",
        panel="Forgetting",
    ),
    Opt(
        name="forgetting_probe",
        type=int,
        default=8,
        help="Without --ood-eval: sample N texts (at most 64 tokens) from the starting model before training and "
        "report KL(start ‖ tuned) per token on them after it, how far the run moved on the model's own text (kept "
        "in OUT/forgetting_probe.jsonl, reused by --resume). 0 = off. About 10 s on SmolLM2-135M on one CPU core.",
        commands=LANGUAGE_MODELS,
        check=non_negative_int,
        metavar="N",
        panel="Forgetting",
    ),
    Opt(
        name="max_forgetting",
        type=float,
        default=None,
        help="Forgetting budget in percent: after training, the run's output becomes the largest uniform merge "
        "toward the starting model (α in [0, 1], found by bisection to 1/128) whose mean --ood-eval perplexity "
        "change is at most PCT; the trained model is kept in OUT/unmerged/, and the α, every α tried and the share "
        "of the in-domain gain kept go to eval_results.json and the model card. α = 1 when the trained model "
        "meets it. Exit code 3 when only the starting model meets it (for CI gates). Without --ood-eval, the "
        "budget is on the forgetting probe: the perplexity change of the starting model's own samples, "
        "100 (exp(KL) - 1), i.e. KL(start ‖ tuned) ≤ ln(1 + PCT/100) per token. Not with --lora-r (merge the "
        "adapter with posttrainllm merge --max-forgetting). merge: the α of its one merged model, in place of "
        "--alpha (there --ood-eval is needed).",
        commands=LANGUAGE_MODELS | own("merge"),
        check=non_negative,
        metavar="PCT",
        panel="Forgetting",
    ),
    Opt(
        name="train_on_prompt",
        type=bool,
        default=False,
        help="Put the SFT loss on every token: system and user turns and role "
        "headers of conversations, the prompt of prompt/completion rows "
        "(default: the assistant's words only).",
        commands=own("sft"),
    ),
    Opt(
        name="replay_dataset",
        type=str,
        default=None,
        help="Pre-training-style text mixed into the training data against forgetting.",
        commands=LIKELIHOOD,
        metavar="FILE",
        panel="Forgetting",
        input=PATH,
    ),
    Opt(
        name="replay_ratio",
        type=float,
        default=0.0,
        help="Fraction of training rows taken from --replay-dataset or --self-replay's samples.",
        commands=LIKELIHOOD,
        check=fraction_below_one,
        metavar="FRACTION",
        panel="Forgetting",
    ),
    Opt(
        name="self_replay",
        type=int,
        default=0,
        help="Sample N texts from the starting model before training and mix them in at --replay-ratio, against "
        "forgetting without replay data (0 = off). Temperature 1, at most --max-length tokens, from BOS (or, for "
        "conversational sft data, as the answer to an empty user turn). Kept in OUT/self_replay.jsonl (settings "
        "in self_replay.json): the same --seed gives the same file, --resume reuses it and refuses a changed N. "
        "N is at most what the run trains on (--max-steps × --batch-size × --grad-accum × --replay-ratio replay "
        "rows; exit 2 above, naming the maximum). "
        "Not with --replay-dataset (pass an earlier run's self_replay.jsonl there to mix both). sft and finetune "
        "only (dpo and kto exit 2: a sample has no preference to learn). Cost on SmolLM2-135M at --max-length "
        "192: about 2 s per sample on one CPU core, so N = 256 takes about 9 min on a 2-core CPU's one thread "
        "(measured at N = 32 and extrapolated; docs/performance.md).",
        commands=OFFLINE_LM,
        check=non_negative_int,
        metavar="N",
        panel="Forgetting",
    ),
    Opt(
        name="self_replay_batch_size",
        type=int,
        default=16,
        help="Samples generated together by --self-replay (one model.generate call, KV cache on). Part of what the "
        "samples are: another batch size draws other samples from the same --seed.",
        commands=LIKELIHOOD,
        check=positive_int,
        metavar="N",
        panel="Forgetting",
    ),
    Opt(
        name="kl_to_base",
        type=float,
        default=0.0,
        help="KL anchor to the starting model: loss = the LM loss + β × the mean per-token KL(base ‖ model) over the "
        "tokens the loss is on; logged as kl_to_base. The base is a frozen copy of the model (its weights once "
        "more in memory), or with --lora-r the model with its adapters off (no copy); either way one extra "
        "forward per step. 0 (default): off. sft and finetune only (dpo's and kto's --beta already anchor to "
        "their reference).",
        commands=LIKELIHOOD,
        check=non_negative,
        metavar="BETA",
        panel="Forgetting",
    ),
)

PANEL, ORDER = FORGETTING, 60  # this panel's options, and its place in the help (config/panels/__init__.py)
