"""Reward functions for `grpo` and `rloo`, in the form TRL's GRPOTrainer / RLOOTrainer call them:
``reward(prompts=..., completions=..., completion_ids=..., **columns) -> list[float | None]``, one value per completion
(``columns`` are the dataset's other columns, one value per completion).

Built in, needing no code:

* ``--reward-regex PATTERN``: 1.0 when the completion matches PATTERN (``search``, DOTALL; anchor with ``^...$`` for
  a whole-format check), else 0.0.
* ``--reward-match COLUMN``: exact match, for verifiable answers: 1.0 when the completion's answer equals the row's
  COLUMN value (both trimmed; a list value holds the accepted answers: any of them matches), else 0.0. The answer is
  the whole completion, or with ``--answer-pattern REGEX`` the last match of REGEX in it (its first group when it has
  one).

Patterns run on the `regex` package with a time limit per completion (REGEX_TIMEOUT_S): a pattern that backtracks
catastrophically stops the run with a line naming it, instead of hanging.

The user's own: ``--reward-fn module:function`` or ``--reward-fn path/to/file.py:function``. Only what the user names
is imported: it is their code, loaded from its file by explicit path (nothing is put on ``sys.path``, so no file in
the working directory shadows an installed package).

Every reward is wrapped in CheckedReward: one finite number (or None: "does not apply") per completion, and a
completion scored by at least one reward; anything else, or an exception, stops the run naming the reward. Imports no
torch.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrainllm.errors import TrainingError, UsageError, one_line, shorten

REGEX_TIMEOUT_S = 2.0  # one completion's match: a sane pattern takes microseconds on a completion


MAX_PATTERN_SIZE = 100_000  # the pattern with its counted repeats written out: a{3}(bc){2} is 7


def compile_pattern(pattern: str):
    """`pattern` compiled with the `regex` package (DOTALL), which can bound a search's time; a UsageError for what
    pattern_problem refuses (the regex package writes counted repeats out when it compiles, so
    ``(?:a{65535}){65535}`` would take gigabytes before any search)."""
    import regex

    problem = pattern_problem(pattern)
    if problem:
        raise UsageError(f"pattern {shorten(pattern, 60)!r} {problem}")
    return regex.compile(pattern, regex.DOTALL | regex.VERSION0)


def pattern_problem(pattern: str) -> str | None:
    """What is wrong with a reward pattern (None when fine), checked with the other options: it must be a valid
    Python regular expression (`re`, as documented) whose counted repeats, written out, stay under MAX_PATTERN_SIZE
    items. Nothing is compiled by the `regex` package here."""
    import re

    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse
    try:
        parsed = sre_parse.parse(pattern, re.DOTALL)
    except (re.error, ValueError, OverflowError, RecursionError) as e:
        return f"is not a valid regular expression ({one_line(e, 120)})"
    size = _written_out(parsed.data if hasattr(parsed, "data") else list(parsed))
    if size > MAX_PATTERN_SIZE:
        return (
            f"has counted repeats that write out to about {size:,} items (at most {MAX_PATTERN_SIZE:,}); use smaller "
            "counts, or + and * instead of {n} for long runs"
        )
    return None


def _written_out(items) -> int:
    """The size of a parsed pattern with every counted repeat written out (an open repeat counts its minimum + 1)."""
    try:
        from re import _constants as c  # type: ignore[attr-defined]  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_constants as c

    total = 0
    for op, av in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            low, high, sub = av
            total += max(1, high if high != c.MAXREPEAT else low + 1) * _written_out(sub)
        elif op is c.SUBPATTERN:
            total += _written_out(av[-1])
        elif op is c.BRANCH:
            total += sum(_written_out(b) for b in av[1])
        elif op in (c.ASSERT, c.ASSERT_NOT):
            total += _written_out(av[1])
        elif op is getattr(c, "ATOMIC_GROUP", None):
            total += _written_out(av)
        elif op is c.GROUPREF_EXISTS:
            total += _written_out(av[1]) + (_written_out(av[2]) if av[2] else 0)
        else:
            total += 1
        if total > MAX_PATTERN_SIZE:
            return total  # large enough to refuse; the rest need not be counted
    return total


def _bounded(compiled, text: str, flag: str, find_all: bool = False):
    """`compiled`'s search (or every match, `find_all`) in `text` within REGEX_TIMEOUT_S; a UsageError naming the
    pattern when it trips."""
    try:
        if find_all:
            return list(compiled.finditer(text, timeout=REGEX_TIMEOUT_S))
        return compiled.search(text, timeout=REGEX_TIMEOUT_S)
    except TimeoutError:
        raise UsageError(
            f"{flag} '{shorten(compiled.pattern, 60)}': matching one completion of {len(text)} characters took over "
            f"{REGEX_TIMEOUT_S:g} s (catastrophic backtracking); simplify the pattern, e.g. no nested repeats like "
            "(a+)+"
        ) from None


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
    """1.0 for a completion that matches `pattern` (search with DOTALL, time-bounded), else 0.0.

    E.g. ``RegexReward(r"^<answer>\\d+</answer>$")(completions=["<answer>42</answer>", "42"])`` → ``[1.0, 0.0]``."""

    def __init__(self, pattern: str):
        self.pattern = pattern
        self._re = compile_pattern(pattern)
        self.__name__ = "regex"  # TRL logs rewards/<name>/mean

    def __call__(self, completions, **_: Any) -> list[float]:
        return [1.0 if _bounded(self._re, completion_text(c), "--reward-regex") else 0.0 for c in completions]


class MatchReward:
    """1.0 when the completion's answer equals the row's `column` value (both trimmed; a list value holds the accepted
    answers), else 0.0. The answer is the whole completion, or the last match of `answer_pattern` (its first group
    when it has one); no match scores 0.

    E.g. ``MatchReward("answer", r"= *(-?\\d+)")(completions=["2+2 = 4", "= 5"], answer=["4", ["5", "five"]])``
    → ``[1.0, 1.0]``."""

    def __init__(self, column: str, answer_pattern: str | None = None):
        self.column = column
        self.answer_pattern = answer_pattern
        self._re = compile_pattern(answer_pattern) if answer_pattern else None
        self.__name__ = f"match_{column}"

    def answer(self, completion: Any) -> str | None:
        text = completion_text(completion)
        if self._re is None:
            return text.strip()
        found = _bounded(self._re, text, "--answer-pattern", find_all=True)
        if not found:
            return None
        last = found[-1]
        if not last.re.groups:
            return last.group(0).strip()
        if last.group(1) is None:
            raise UsageError(
                f"--answer-pattern '{shorten(self.answer_pattern, 60)}': its first group took no part in the match "
                f"{shorten(last.group(0), 40)!r} (an optional group), so there is no answer to compare; make the "
                "group required, e.g. (\\d+) instead of (\\d+)?, or turn other groups into (?:...)"
            )
        return last.group(1).strip()

    def _accepted(self, want: Any) -> list[str]:
        """The row's accepted answers, trimmed: a scalar is one, a list (or tuple) holds several."""
        values = list(want) if isinstance(want, (list, tuple)) else [want]
        for v in values:
            if isinstance(v, (dict, list, tuple, set)):
                raise UsageError(
                    f"--reward-match {self.column}: a row holds {type(v).__name__} {shorten(repr(v), 60)}; the column "
                    "must hold an answer (a string or number) or a list of accepted answers"
                )
        return [_answer_text(v) for v in values if v is not None]

    def __call__(self, completions, **columns: Any) -> list[float]:
        if self.column not in columns:
            raise UsageError(
                f"--reward-match {self.column}: the dataset has no column {self.column!r}; "
                f"its columns: {', '.join(sorted(k for k in columns if k != 'completion_ids')) or 'none'}"
            )
        out = []
        for completion, want in zip(completions, columns[self.column]):
            got = self.answer(completion)
            out.append(1.0 if got is not None and got in self._accepted(want) else 0.0)
        return out


def _answer_text(value: Any) -> str:
    """A column's answer as text, trimmed; an integral float as its integer (4.0 → "4"), as a JSON number reads."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


class _Round:
    """The completions being scored now, and which of them no reward has scored yet (all None so far)."""

    def __init__(self, size: int):
        self.size, self.completions, self.seen = size, None, 0
        self.unscored: list[int] = []


class CheckedReward:
    """A reward as TRL calls it, checked: the function's exception, a value that is no number (a string, a list),
    a number that is NaN or infinite, a count that is not one per completion, or a completion that no reward scores
    (every reward returned None) stops the run with a TrainingError naming the reward (exit 1). Logged under the
    function's own name."""

    def __init__(self, fn: Callable, label: str, round_: _Round | None = None):
        self.fn, self.label = fn, label
        self.round = round_ if round_ is not None else _Round(1)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
        where = self._where(kwargs)
        try:
            out = self.fn(*args, **kwargs)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's reward failed: name it and what it raised
            raise self._raised(where, e) from e
        return self._checked(out, kwargs.get("completions", args[0] if args else []), where)

    def _where(self, kwargs: dict) -> str:
        step = getattr(kwargs.get("trainer_state"), "global_step", None)
        return f"reward {self.label}" + (f" (step {step + 1})" if step is not None else "")

    @staticmethod
    def _raised(where: str, e: Exception) -> TrainingError:
        return TrainingError(
            f"{where} raised {type(e).__name__}: {one_line(e, 160)}; fix the function (--debug shows the traceback)"
        )

    def _checked(self, out: Any, completions, where: str) -> list[float | None]:
        values = _checked_values(out, len(completions), where)
        self._note_unscored(completions, values, where)
        return values

    def _note_unscored(self, completions, values: list, where: str) -> None:
        r = self.round
        if r.completions is not completions:  # the first reward of a new batch
            r.completions, r.unscored, r.seen = completions, [True] * len(values), 0
        r.unscored = [u and v is None for u, v in zip(r.unscored, values)]
        r.seen += 1
        if r.seen >= r.size and any(r.unscored):
            i = r.unscored.index(True)
            raise TrainingError(
                f"{where}: no reward scored completion {i + 1} of {len(values)} (every reward returned None, which "
                "means 'does not apply'); return a number for every completion, e.g. 0.0 for 'no reward'"
            )


class CheckedAsyncReward(CheckedReward):
    """CheckedReward for an async reward function (TRL awaits the rewards that are coroutines together)."""

    async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:  # type: ignore[override]
        where = self._where(kwargs)
        try:
            out = await self.fn(*args, **kwargs)
        except UsageError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's reward failed: name it and what it raised
            raise self._raised(where, e) from e
        return self._checked(out, kwargs.get("completions", args[0] if args else []), where)


def checked(fn: Callable, label: str, round_: _Round) -> CheckedReward:
    """`fn` wrapped in CheckedReward, or CheckedAsyncReward when calling it gives a coroutine."""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
    return (CheckedAsyncReward if is_async else CheckedReward)(fn, label, round_)


def _checked_values(out: Any, n: int, where: str) -> list[float | None]:
    """`out` as one float (or None) per completion; a TrainingError saying what is wrong otherwise."""
    if hasattr(out, "tolist") and not isinstance(out, (str, bytes)):
        out = out.tolist()  # a numpy array or a tensor
    if not isinstance(out, (list, tuple)):
        raise TrainingError(
            f"{where} returned a {type(out).__name__} ({shorten(repr(out), 40)}), not a list of one number per "
            f"completion ({n} here); return e.g. [1.0, 0.0, ...]"
        )
    if len(out) != n:
        raise TrainingError(f"{where} returned {len(out)} values for {n} completions; return one per completion")
    values: list[float | None] = []
    for i, v in enumerate(out):
        if v is not None and (isinstance(v, (str, bytes)) or not isinstance(v, numbers.Real)):
            raise TrainingError(
                f"{where} returned a {type(v).__name__} ({shorten(repr(v), 40)}) for completion {i + 1} of {n}; a "
                "reward is a number (or None when it does not apply)"
            )
        number = None if v is None else _as_float(v)
        if number is not None and not math.isfinite(number):
            raise TrainingError(
                f"{where} returned {shorten(repr(v), 40)} for completion {i + 1} of {n}; a reward must be a finite "
                "number (a NaN or infinite reward teaches nothing); no final model was written"
            )
        values.append(number)
    return values


def _as_float(v: numbers.Real) -> float:
    """A real number as a float; one too large for a float (an int of 400 digits) as infinity."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf  # type: ignore[operator]


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
    """`package.module` from the current directory (its top-level package or module loaded from its file by explicit
    path, as `python -m` would find it, without putting the directory on sys.path), else the installed one."""
    top = name.partition(".")[0]
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())])
        if spec is not None and spec.loader is not None and spec.has_location:  # a file or a package, no bare folder
            _exec(spec, top)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            raise UsageError(
                f"--reward-fn {name}: no module named {e.name!r} (give path/to/file.py:function for a file, or run "
                "from the directory that holds the module)"
            ) from None
        raise


def _exec(spec, name: str):
    """The module of `spec`, registered as `name` (a multiprocess map or a pickled reward finds it again); nothing is
    left registered when its code fails."""
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import_file(path: str):
    file = Path(path).expanduser().resolve()
    name = f"posttrainllm_reward_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"--reward-fn {path}: not a Python file")
    return _exec(spec, name)


def build_rewards(cfg: RunConfig) -> list[Callable]:
    """The run's reward functions, in the order --reward-weights follows: the regexes, the exact match, then the
    user's functions; each wrapped in CheckedReward, sharing one _Round (a completion needs one reward's number)."""
    named: list[tuple[Callable, str]] = [(RegexReward(p), f"--reward-regex '{shorten(p, 60)}'") for p in
                                         cfg.reward_regex or []]  # fmt: skip
    if cfg.reward_match:
        named.append((MatchReward(cfg.reward_match, cfg.answer_pattern), f"--reward-match {cfg.reward_match}"))
    named += [(load_reward_fn(spec), f"--reward-fn {shorten(spec, 80)}") for spec in cfg.reward_fn or []]
    round_ = _Round(len(named))
    return [checked(fn, label, round_) for fn, label in named]


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
