"""Reward functions for `grpo` and `rloo`, in the form TRL's GRPOTrainer / RLOOTrainer call them:
``reward(prompts=..., completions=..., completion_ids=..., **columns) -> list[float | None]``, one value per completion
(``columns`` are the dataset's other columns, one value per completion).

Built in, needing no code:

* ``--reward-regex PATTERN``: 1.0 when the completion matches PATTERN (``re.search``, ``re.DOTALL``; anchor with
  ``^...$`` for a whole-format check), else 0.0.
* ``--reward-match COLUMN``: exact match, for verifiable answers: 1.0 when the completion's answer equals the row's
  COLUMN value (both trimmed), else 0.0. The answer is the whole completion, or with ``--answer-pattern REGEX`` the
  last match of REGEX in it (its first group when it has one).

The user's own: ``--reward-fn module:function`` or ``--reward-fn path/to/file.py:function``. Only what the user names
is imported: it is their code. Imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrainllm.errors import UsageError, one_line, shorten

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def completion_text(completion: Any) -> str:
    """A completion as text: a string as it is; a conversational one (a list of messages) as its last message's
    content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        last = completion[-1]
        return str(last.get("content") or "") if isinstance(last, dict) else str(last)
    return "" if completion is None else str(completion)


class RegexReward:
    """1.0 for a completion that matches `pattern` (re.search with re.DOTALL), else 0.0.

    E.g. ``RegexReward(r"^<answer>\\d+</answer>$")(completions=["<answer>42</answer>", "42"])`` → ``[1.0, 0.0]``."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._re = re.compile(pattern, re.DOTALL)
        self.__name__ = "regex"  # TRL logs rewards/<name>/mean

    def __call__(self, completions, **_: Any) -> list[float]:
        return [1.0 if self._re.search(completion_text(c)) else 0.0 for c in completions]


class MatchReward:
    """1.0 when the completion's answer equals the row's `column` value (both trimmed), else 0.0. The answer is the
    whole completion, or the last match of `answer_pattern` (its first group when it has one); no match scores 0.

    E.g. ``MatchReward("answer", r"= *(-?\\d+)")(completions=["2+2 = 4", "= 5"], answer=["4", "4"])``
    → ``[1.0, 0.0]``."""

    def __init__(self, column: str, answer_pattern: str | None = None):
        self.column = column
        self.answer_pattern = answer_pattern
        self._re = re.compile(answer_pattern, re.DOTALL) if answer_pattern else None
        self.__name__ = f"match_{column}"

    def answer(self, completion: Any) -> str | None:
        text = completion_text(completion)
        if self._re is None:
            return text.strip()
        found = list(self._re.finditer(text))
        if not found:
            return None
        last = found[-1]
        return (last.group(1) if last.re.groups else last.group(0)).strip()

    def __call__(self, completions, **columns: Any) -> list[float]:
        if self.column not in columns:
            raise UsageError(
                f"--reward-match {self.column}: the dataset has no column {self.column!r}; "
                f"its columns: {', '.join(sorted(k for k in columns if k != 'completion_ids')) or 'none'}"
            )
        expected = columns[self.column]
        out = []
        for completion, want in zip(completions, expected):
            got = self.answer(completion)
            out.append(1.0 if got is not None and want is not None and got == str(want).strip() else 0.0)
        return out


def spec_problem(spec: str) -> str | None:
    """What is wrong with a --reward-fn spec's form (None when fine); checked with the other options, before anything
    is imported."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        return "must be module:function or path/to/file.py:function"
    if not name.isidentifier():
        return f"{name!r} is not a function name"
    if module.endswith(".py") and not Path(module).expanduser().is_file():
        return f"file {shorten(module)} does not exist"
    return None


def load_reward_fn(spec: str) -> Callable:
    """The callable a --reward-fn spec names: ``path/to/file.py:function`` (that file, imported as a module) or
    ``package.module:function`` (importable from the current directory or the installed packages). Every failure is
    a UsageError naming the spec (exit 2)."""
    problem = spec_problem(spec)
    if problem:
        raise UsageError(f"--reward-fn {shorten(spec, 80)}: {problem}")
    module_ref, _, name = spec.rpartition(":")
    try:
        module = _import_file(module_ref) if module_ref.endswith(".py") else _import_module(module_ref)
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: say where and what
        raise UsageError(
            f"--reward-fn {shorten(spec, 80)}: importing {module_ref} failed: {type(e).__name__}: {one_line(e, 160)}"
        ) from None
    fn = getattr(module, name, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise UsageError(
            f"--reward-fn {shorten(spec, 80)}: {module_ref} has no {name!r}"
            + (f"; its functions: {', '.join(public[:10])}" if public else "")
        )
    if not callable(fn):
        raise UsageError(f"--reward-fn {shorten(spec, 80)}: {name!r} is a {type(fn).__name__}, not a function")
    return fn


def _import_module(name: str):
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # `mymod:fn` from the directory the command runs in, as `python -m` does
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise UsageError(
                f"--reward-fn {name}: no module named {e.name!r} (give path/to/file.py:function for a file, or run "
                "from the directory that holds the module)"
            ) from None
        raise


def _import_file(path: str):
    file = Path(path).expanduser().resolve()
    name = f"posttrainllm_reward_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"--reward-fn {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a multiprocess map or a pickled reward finds it again
    spec.loader.exec_module(module)
    return module


def build_rewards(cfg: RunConfig) -> list[Callable]:
    """The run's reward functions, in the order --reward-weights follows: the regexes, the exact match, then the
    user's functions."""
    rewards: list[Callable] = [RegexReward(p) for p in cfg.reward_regex or []]
    if cfg.reward_match:
        rewards.append(MatchReward(cfg.reward_match, cfg.answer_pattern))
    rewards += [load_reward_fn(spec) for spec in cfg.reward_fn or []]
    return rewards


def describe(cfg: RunConfig) -> str:
    """The banner's rewards, in --reward-weights' order: ``regex /^a/ + 0.5×exact match with column 'answer'``."""
    names = [f"regex /{shorten(p, 40)}/" for p in cfg.reward_regex or []]
    if cfg.reward_match:
        how = f" (answer: last /{shorten(cfg.answer_pattern, 30)}/)" if cfg.answer_pattern else ""
        names.append(f"exact match with column {cfg.reward_match!r}{how}")
    names += list(cfg.reward_fn or [])
    if not cfg.reward_weights:
        return " + ".join(names)
    return " + ".join(f"{w:g}×{n}" for w, n in zip(cfg.reward_weights, names))
