"""Options of the panel: online RL (grpo, rloo): the rewards; and the sampling of completions (grpo, rloo,
distill)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    ONLINE_RL,
    SAMPLING,
    at_least_two,
    non_negative,
    positive_int,
    reward_fn_spec,
    reward_pattern,
)
from posttrainllm.config.opt import Opt

ONLINE: tuple[Opt, ...] = (
    Opt(
        "reward_regex",
        list,
        None,
        "Reward 1 when the completion matches this regular expression (re.search; anchor with ^...$ for a "
        "whole-format check), else 0. Repeatable.",
        ONLINE_RL,
        reward_pattern,
        "REGEX",
        panel="Rewards",
    ),
    Opt(
        "reward_match",
        str,
        None,
        "Exact-match reward for verifiable answers: 1 when the completion's answer equals this dataset column "
        "(both trimmed), else 0.",
        ONLINE_RL,
        metavar="COLUMN",
        panel="Rewards",
    ),
    Opt(
        "answer_pattern",
        str,
        None,
        "With --reward-match: the answer is the last match of this regex in the completion (its first group if it "
        "has one; default: the whole completion).",
        ONLINE_RL,
        reward_pattern,
        "REGEX",
        panel="Rewards",
    ),
    Opt(
        "reward_fn",
        list,
        None,
        "Your own reward, module:function or path/to/file.py:function, called as TRL calls reward functions "
        "(prompts, completions, completion_ids, **columns) -> list of floats. Repeatable; only what you name is "
        "imported.",
        ONLINE_RL,
        reward_fn_spec,
        "SPEC",
        panel="Rewards",
    ),
    Opt(
        "trust_reward_code",
        bool,
        False,
        "Let the recipe's reward_fn entries run: they name Python code, which a recipe alone never imports (read "
        "it first). Command line only; --reward-fn given on the command line needs no flag.",
        ONLINE_RL,
        recipe=False,
        panel="Rewards",
    ),
    Opt(
        "reward_weights",
        list,
        None,
        "Weights of the rewards, in the order regexes, match, functions (default: 1 each).",
        ONLINE_RL,
        non_negative,
        "FLOAT",
        panel="Rewards",
        item=float,
        split=True,
    ),
    Opt(
        "num_generations",
        int,
        4,
        "Completions sampled per prompt: the group whose rewards are compared (batch × accum must be a multiple).",
        ONLINE_RL,
        at_least_two,
        "N",
        panel="Rewards",
    ),
    Opt(
        "max_completion_length",
        int,
        128,
        "Most tokens sampled per completion.",
        SAMPLING,
        positive_int,
        "N",
        panel="Rewards",
    ),
)
