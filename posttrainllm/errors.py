"""The project's error types. They are raised deep down and turned into exit codes in one place (cli.py).

Exit codes: 2 = usage error (bad option, recipe, path), 1 = runtime failure (data, model, training),
130/143 = interrupted by SIGINT/SIGTERM (after a checkpoint was saved, or before training started), 3 = only the
starting model meets --max-forgetting.
"""

from __future__ import annotations

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class PosttrainError(Exception):
    """Base class: a failure with a message meant for people. Exit code 1."""

    exit_code = 1


class UsageError(PosttrainError):
    """The command line or recipe is wrong (bad value, unknown key, missing path). Exit code 2."""

    exit_code = 2


class ConfigErrors(UsageError):
    """Several validation problems, reported together."""

    def __init__(self, problems: list[str], hint: str | None = None):
        self.problems = list(problems)
        self.hint = hint
        text = "; ".join(self.problems) if len(self.problems) == 1 else "\n".join(f"  - {p}" for p in self.problems)
        if len(self.problems) > 1:
            text = f"{len(self.problems)} problems:\n{text}"
        if hint:
            text = f"{text}\n{hint}"
        super().__init__(text)


class BudgetNotMet(PosttrainError):
    """--max-forgetting: only the starting model meets the forgetting budget (the run's records are written). Exit
    code 3, apart from other failures, for CI gates (merging/budget.py)."""

    exit_code = 3


class Interrupted(PosttrainError):
    """SIGTERM/SIGINT before training started (rundir/signals.py `stop_on_signal`): nothing to checkpoint, the run
    stops at once. Exit code 143 (SIGTERM) or 130 (SIGINT), as an interrupt during training."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def error_in(error: BaseException, kind: type[E]) -> E | None:
    """The first exception of type `kind` along an exception chain (libraries wrap what was raised inside them:
    datasets a generator's error, transformers a lazy import's), if any."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def interruption_in(error: BaseException) -> Interrupted | None:
    """An Interrupted inside an exception chain (a signal's stop raised inside an import), if any."""
    return error_in(error, Interrupted)


class DataError(PosttrainError):
    """The dataset cannot be read or has the wrong shape. Exit code 1."""


class TrainingError(PosttrainError):
    """Training itself failed (e.g. the loss diverged to NaN/inf). Exit code 1."""


class ModelError(PosttrainError):
    """The model cannot be loaded, or its structure is not understood. Exit code 1."""


class ModelStructureError(ModelError):
    """The decoder block list (or embeddings/head) of a model could not be resolved. Exit code 1."""


# -- messages for people are one line and short -------------------------------------------------------------------
def one_line(error: BaseException | str, limit: int = 300) -> str:
    """An exception's text (or any text) on one line, at most `limit` characters; the type name when it is empty."""
    text = " ".join(str(error).split()) or (type(error).__name__ if isinstance(error, BaseException) else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shorten(text, limit: int = 120) -> str:
    """A path, name or value for an error message, cut to a prefix when it is long (an 80 MB line quotes 120 chars)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} characters)"
