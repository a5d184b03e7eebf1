"""eval's progress on stderr: a rich bar on a terminal, plain lines otherwise (a log file), nothing when off.

A text's total is its size (bytes of a file, characters of a string) and its progress the part read so far, since
the number of windows is only known at its end; the SFT set counts examples.
"""

from __future__ import annotations

import sys

PROGRESS_EVERY = 30.0  # seconds between two plain progress lines (stderr not a terminal)


def _size(n: float, unit: str) -> str:
    if unit != "bytes":
        return f"{int(n)} {unit}"
    for name, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{int(n)} B"


class _Meter:
    """One text (or the SFT set) at a time: ``start``, ``advance(n, position=None)`` after each batch (n windows
    and the input position of a text; n examples of the SFT set), ``finish``. This base shows nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def start(self, name: str, total, unit: str) -> None:
        self.name, self.total, self.unit = name, total, unit
        self.count, self.position = 0, 0

    def advance(self, n: int, position=None) -> None:
        self.count += n
        self.position = self.count if position is None else position
        self.show(False)

    def finish(self) -> None:
        if self.total is not None:
            self.position = self.total  # a file's BOM is read but never counted
        self.show(True)

    def show(self, final: bool) -> None:
        pass

    def text(self) -> str:
        if self.unit == "examples":
            return f"{self.count}/{self.total} examples" if self.total is not None else f"{self.count} examples"
        pct = 100 * self.position // self.total if self.total else 100
        return f"{self.count} windows, {pct}% of {_size(self.total, self.unit)} read"


class _Lines(_Meter):
    """`eval: NAME: 120 windows, 45% of 60.0 MB read` when a text starts, at most every PROGRESS_EVERY seconds
    while it runs, and when it is done."""

    def start(self, name: str, total, unit: str) -> None:
        import time

        super().start(name, total, unit)
        self.last = time.monotonic()
        self.line()

    def show(self, final: bool) -> None:
        import time

        now = time.monotonic()
        if final or now - self.last >= PROGRESS_EVERY:
            self.last = now
            self.line()

    def line(self) -> None:
        print(f"eval: {self.name}: {self.text()}", file=sys.stderr, flush=True)


class _Bar(_Meter):
    """A transient rich bar per text on stderr."""

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(
            TextColumn("{task.description}", style="bold", markup=False),  # a file name is text, not markup
            BarColumn(),
            TextColumn("{task.fields[info]}", markup=False),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def start(self, name: str, total, unit: str) -> None:
        super().start(name, total, unit)
        self.task = self.bar.add_task(name, total=total, info=self.text())

    def show(self, final: bool) -> None:
        self.bar.update(self.task, completed=self.position, info=self.text())


def progress_meter(on: bool) -> _Meter:
    """The meter for ``evaluate_files(progress=...)``: a bar when on and stderr is a terminal, lines when on and
    it is not, else silent (use it as a context manager)."""
    if not on:
        return _Meter()
    return _Bar() if sys.stderr.isatty() else _Lines()
