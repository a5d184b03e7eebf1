"""Options of the panel: online RL (grpo, rloo): the rewards; and the sampling of completions (grpo, rloo,
distill)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    at_least_two,
    non_negative,
    positive_int,
    reward_fn_spec,
    reward_pattern,
)
from posttrainllm.config.opt import CODE, Opt
from posttrainllm.spec import ONLINE_RL, SAMPLING

ONLINE: tuple[Opt, ...] = (
    Opt(
        name="reward_regex",
        type=list,
        default=None,
        help="Reward 1 when the completion matches this regular expression (re.search; anchor with ^...$ for a "
        "whole-format check), else 0. Repeatable.",
        commands=ONLINE_RL,
        check=reward_pattern,
        metavar="REGEX",
        panel="Rewards",
    ),
    Opt(
        name="reward_match",
        type=str,
        default=None,
        help="Exact-match reward for verifiable answers: 1 when the completion's answer equals this dataset column "
        "(both trimmed), else 0.",
        commands=ONLINE_RL,
        metavar="COLUMN",
        panel="Rewards",
    ),
    Opt(
        name="answer_pattern",
        type=str,
        default=None,
        help="With --reward-match: the answer is the last match of this regex in the completion (its first group if it "
        "has one; default: the whole completion).",
        commands=ONLINE_RL,
        check=reward_pattern,
        metavar="REGEX",
        panel="Rewards",
    ),
    Opt(
        name="reward_fn",
        type=list,
        default=None,
        help="Your own reward, module:function or path/to/file.py:function, called as TRL calls reward functions "
        "(prompts, completions, completion_ids, **columns) -> list of floats. Repeatable; only what you name is "
        "imported.",
        commands=ONLINE_RL,
        check=reward_fn_spec,
        metavar="SPEC",
        panel="Rewards",
        input=CODE,
    ),
    Opt(
        name="trust_reward_code",
        type=bool,
        default=False,
        help="Let the recipe's reward_fn entries run: they name Python code, which a recipe alone never imports (read "
        "it first). Command line only; --reward-fn given on the command line needs no flag.",
        commands=ONLINE_RL,
        recipe=False,
        panel="Rewards",
    ),
    Opt(
        name="reward_weights",
        type=list,
        default=None,
        help="Weights of the rewards, in the order regexes, match, functions (default: 1 each).",
        commands=ONLINE_RL,
        check=non_negative,
        metavar="FLOAT",
        panel="Rewards",
        item=float,
        split=True,
    ),
    Opt(
        name="num_generations",
        type=int,
        default=4,
        help="Completions sampled per prompt: the group whose rewards are compared (batch × accum must be a multiple).",
        commands=ONLINE_RL,
        check=at_least_two,
        metavar="N",
        panel="Rewards",
    ),
    Opt(
        name="max_completion_length",
        type=int,
        default=128,
        help="Most tokens sampled per completion.",
        commands=SAMPLING,
        check=positive_int,
        metavar="N",
        panel="Rewards",
    ),
)

PANEL, ORDER = ONLINE, 40  # this panel's options, and its place in the help (config/panels/__init__.py)
