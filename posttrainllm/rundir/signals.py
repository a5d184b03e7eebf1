"""SIGTERM/SIGINT during training → checkpoint and stop, and the COMPLETE marker written after each save.

- The first SIGTERM/SIGINT lets the current step finish, a checkpoint is saved, and the run exits with 143 (SIGTERM)
  or 130 (SIGINT) after printing the resume command. A second signal stops at once with the same exit code (the
  checkpoint it cut short has no marker). Under torch.distributed every rank stops at the same step.
- After every checkpoint save (and a barrier), rank 0 writes `checkpoint-N/COMPLETE` listing each file and its size.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

from posttrainllm.distributed import max_over_ranks
from posttrainllm.rundir.layout import MARKER, file_sizes, write_json

EXIT_SIGTERM, EXIT_SIGINT = 143, 130


@contextlib.contextmanager
def stop_on_signal(what: str):
    """SIGTERM/SIGINT during `what`, a step before training (e.g. sampling the starting model): stop at once with
    exit 143 / 130 (errors.Interrupted), the run's cleanup (the output directory's lock, replaced contents) running
    as for any error; there is nothing to checkpoint yet. Outside the main thread, signals stay as they are."""
    from posttrainllm.errors import Interrupted

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        code = EXIT_SIGTERM if signum == signal.SIGTERM else EXIT_SIGINT
        raise Interrupted(f"{signal.Signals(signum).name} during {what}, before training: nothing was trained", code)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


class InterruptGuard:
    """Context manager: the first SIGTERM/SIGINT asks the trainer to checkpoint and stop; a second one aborts.

    SIGTERM repeated within `REPEAT_S` seconds of the first is the same request delivered twice, not a second one:
    a scheduler signals every process while the launcher passes the signal on too, and the kernel sends a worker
    its parent-death signal once per exiting thread of a killed launcher."""

    REPEAT_S = 2.0

    def __init__(self):
        self.signum: int | None = None
        self.from_other_rank = False  # the signal reached another rank, and this one stops with it
        self._first_at = 0.0
        self._old = {}

    def _handle(self, signum, frame):
        import time

        if self.from_other_rank:  # already stopping with another rank: this rank's own (first) signal changes nothing
            self.from_other_rank, self._first_at = False, time.monotonic()
            return
        if self.signum == signal.SIGTERM == signum and time.monotonic() - self._first_at < self.REPEAT_S:
            return
        if self.signum is not None:  # a second signal: stop now (the checkpoint being written gets no marker)
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            import sys

            sys.stderr.write(
                "error: stopped by a second SIGTERM; a checkpoint cut short has no "
                "COMPLETE marker and --resume skips it\n"
            )
            raise SystemExit(EXIT_SIGTERM)
        self.signum, self._first_at = signum, time.monotonic()

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False

    @property
    def exit_code(self) -> int:
        return EXIT_SIGINT if self.signum == signal.SIGINT else EXIT_SIGTERM


def make_callback(guard: InterruptGuard):
    """A TrainerCallback that checkpoints+stops on a signal and marks checkpoints complete after each save."""
    from transformers import TrainerCallback

    class SafetyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            # under torch.distributed the ranks stop at the same step, even when the signal reached them on either
            # side of a step boundary (or reached only some of them): one all-reduce of a CPU scalar per step
            signum = max_over_ranks(guard.signum or 0)
            if signum:
                if guard.signum is None:
                    guard.signum, guard.from_other_rank = signum, True
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            _barrier()  # every rank has written its files (rng_state_<rank>.pth, shards) before they are listed
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    write_json(ckpt / MARKER, {"step": state.global_step, "files": file_sizes(ckpt)})
            return control

    return SafetyCallback()


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
