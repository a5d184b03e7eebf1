"""`posttrainllm grpo`: Group relative policy optimisation with TRL's GRPOTrainer: online RL from prompts, the
model's own sampled completions and reward functions (built-in regex / exact match, or the user's --reward-fn).

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP, default_reference
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

# trainer fields the sampling options own (grpo, rloo, distill)
SAMPLING_OWNED = {
    "num_generations": "--num-generations",
    "max_completion_length": "--max-completion-length",
    "temperature": "--temperature",
    "reward_weights": "--reward-weights",
    "trust_remote_code": "--trust-remote-code",
}


def online_fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(
        beta=cfg.beta, num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, reward_weights=cfg.reward_weights, trust_remote_code=bool(cfg.trust_remote_code),
    )  # fmt: skip


def online_checks(command: str, v: Mapping[str, Any]) -> list[str]:
    """grpo / rloo: at least one reward, one weight per reward, groups that fit the batch, varied samples."""
    problems = []
    n_rewards = len(v.get("reward_regex") or []) + bool(v.get("reward_match")) + len(v.get("reward_fn") or [])
    if n_rewards == 0:
        problems.append(
            f"{command} needs a reward: --reward-regex REGEX, --reward-match COLUMN and/or --reward-fn "
            "module:function (each repeatable but the match)"
        )
    weights = v.get("reward_weights")
    if weights is not None and n_rewards and len(weights) != n_rewards:
        problems.append(
            f"--reward-weights has {len(weights)} weight(s) for {n_rewards} reward(s): give one per reward, in the "
            "order regexes, match, functions"
        )
    if v.get("answer_pattern") and not v.get("reward_match"):
        problems.append("--answer-pattern goes with --reward-match COLUMN (it finds the answer to compare)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_step, groups = (v.get("batch_size") or 1) * (v.get("grad_accum") or 1) * world, v.get("num_generations") or 2
    if per_step % groups:
        problems.append(
            f"--batch-size × --grad-accum{' × ranks' if world > 1 else ''} = {per_step} completions per step is not a "
            f"multiple of --num-generations {groups}: each prompt's {groups} completions are scored together; "
            f"e.g. --batch-size {groups * max(1, round(per_step / groups))}"
        )
    has_eval = bool(v.get("eval_split") or v.get("eval_dataset"))
    if has_eval and ((v.get("batch_size") or 1) * world) % groups:
        problems.append(
            f"with an eval set, --batch-size{' × ranks' if world > 1 else ''} must be a multiple of "
            f"--num-generations {groups} (the eval batch holds whole groups)"
        )
    if v.get("temperature") is not None and v["temperature"] <= 0:
        problems.append(
            f"--temperature must be > 0 for {command}: greedy decoding samples the same completion {groups} times, "
            "so the group's rewards never differ"
        )
    return problems


def online_row(cfg: RunConfig) -> str:
    """The banner's GRPO / RLOO row: the sampling, the rewards, the reference."""
    from posttrainllm.rewards import describe

    reference = "none (β = 0)" if cfg.beta == 0 else f"β={cfg.beta:g}, {default_reference(cfg)} (out of the optimizer)"
    return (
        f"{cfg.num_generations} completions per prompt, temperature {cfg.temperature:g}, at most "
        f"{cfg.max_completion_length} tokens; rewards: {describe(cfg)}; reference: {reference}"
    )


def completion_steps(cfg: RunConfig, n_train: int | None) -> str:
    """A row of the batch is one completion: each prompt is sampled --num-generations times."""
    from posttrainllm.training.builder import steps_row

    rows = None if n_train is None else n_train * cfg.num_generations
    return steps_row(cfg, rows, "one row = one completion").replace(" rows per step", " completions per step")


SPEC = CommandSpec(
    name="grpo",
    setup=POST_TRAINING_SETUP,
    help="Online RL with TRL's GRPOTrainer: sample completions of your prompts, score them with rewards (regex, "
    "exact match or --reward-fn), learn from each group's relative rewards.",
    trainer="trl:GRPOTrainer",
    trainer_config="trl:GRPOConfig",
    trainer_fields=online_fields,
    owned_fields=SAMPLING_OWNED,
    data="prompts",
    samples=True,
    rewards=True,
    lr=1e-6,
    defaults={"beta": 0.0, "temperature": 1.0},
    checks=(online_checks,),
    rows=lambda cfg: {"GRPO": online_row(cfg)},
    steps=completion_steps,
)
