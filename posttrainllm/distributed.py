"""Runs under torchrun / accelerate launch: the process group's timeout, decisions the ranks take together, and
another rank's failure as one message.

- **Timeout.** transformers passes `--ddp-timeout` to the process group only on GPUs: on CPU it creates the gloo
  group with torch's default (30 minutes) whatever the option says. So on CPU posttrainllm creates the gloo group
  itself, before transformers, with `--ddp-timeout` as its timeout; every collective and barrier then gives up
  after that many seconds instead of waiting.
- **A worker never outlives its launcher.** torchrun starts each worker in a session of its own, so a launcher
  killed alone leaves its workers training as orphans (the other nodes never notice). Under torchrun/accelerate
  launch a worker asks the kernel (Linux) for SIGTERM when its launcher dies: it then stops as on any SIGTERM, and
  every rank checkpoints at the same step and exits (posttrainllm/rundir/signals.py).
- **Ranks decide together.** Whether to stop for a signal, whether the loss diverged and whether the weights hold
  NaN/inf are decided by all ranks at once (`max_over_ranks`, one all-reduce of a CPU scalar): a rank that decided
  alone would leave the others waiting in the next collective.
- **A rank that stopped.** When another rank (or a whole node) dies, the surviving ranks get an error from the
  collective they were in: a closed connection at once, or a timeout after `--ddp-timeout` seconds. That error
  becomes one line naming the cause and the way back (`--resume` on every node), exit 1.
"""

from __future__ import annotations

import os
import re
import sys

from posttrainllm.errors import TrainingError
from posttrainllm.rundir.layout import newest_good_checkpoint, world_size

__all__ = ["world_size"]  # re-exported: the rank helpers live in the leaf posttrainllm/rundir/layout.py


def on_cpu() -> bool:
    """Whether the ranks run on CPU: no CUDA device, or the launcher asked for CPU (accelerate's `use_cpu: true`)."""
    import torch

    return not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in (
        "true",
        "1",
        "yes",
    )


def init_process_group(timeout_s: int) -> bool:
    """Create the CPU (gloo) process group with `timeout_s` under a multi-process launch on CPU (on GPUs transformers
    creates it with that timeout). True when this call created it."""
    if world_size() <= 1:
        return False
    import torch.distributed as dist

    if not on_cpu() or not dist.is_available() or dist.is_initialized():
        return False
    from datetime import timedelta

    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return True


def exit_process(code) -> None:
    """End a rank of a multi-process launch now, with `code` (SystemExit's), once its process group is torn down,
    its exit handlers ran and its output is flushed; returns when not under one. A rank left to the interpreter's
    normal shutdown can die there with SIGABRT ("terminate called without an active exception": a C++ thread of
    gloo / torch.distributed.checkpoint destroyed while still joinable), after a run that succeeded: the launcher
    then fails the whole launch. Measured with torch 2.13 on CPU (FSDP2 + a distributed checkpoint, 2 ranks): 6 of
    10 launches aborted that way, 0 of 15 with this exit."""
    if world_size() <= 1 or "torch.distributed" not in sys.modules:
        return
    import atexit

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # best effort, at exit
            pass
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # trackers (wandb, trackio) and logging finish as on a normal exit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_CPU_GROUP: list = []  # the process group used for CPU scalars (the default one unless it is NCCL-only)


def max_over_ranks(value: int) -> int:
    """`value`'s maximum over all ranks, through a CPU (gloo) group: no device sync; `value` itself when not
    distributed."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    if not _CPU_GROUP:
        backend = str(dist.get_backend())
        _CPU_GROUP.append(None if "gloo" in backend or backend == "mpi" else dist.new_group(backend="gloo"))
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_CPU_GROUP[0])
    return int(t.item())


def stop_with_launcher() -> bool:
    """SIGTERM to this process when its launcher dies (Linux prctl PR_SET_PDEATHSIG), under torchrun/accelerate
    launch only. True when set."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no libc prctl
        return False


# A lost rank is told by the exception's type: torch.distributed's network and store errors always mean a peer (or
# the store) is gone; a backend error only in its connection-lost / timeout cases (NCCL's "unhandled cuda error"
# is a DistBackendError too, and is this rank's own failure); gloo's transport raises plain RuntimeErrors, shaped
# "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer ..." (measured with torch 2.13, 2 ranks: a killed
# peer, and a peer that stopped answering for longer than the timeout).
_PEER_GONE = re.compile(
    r"connection (closed|reset) by peer|broken pipe|timed out|timeout|socket closed|connection refused"
    r"|no route to host|remote process exited|network error|communicator was aborted|ncclRemoteError",
    re.IGNORECASE,
)
_GLOO_TRANSPORT = re.compile(r"^\[[^\]]*gloo/transport/[^\]]*\]")


def is_lost_rank(exc: BaseException) -> bool:
    """Whether `exc` says another rank (or the rendezvous store) stopped or did not answer, by its type (module
    comment above); never for an error of this rank's own (a CUDA error, a bug) that happens to mention NCCL."""
    import torch.distributed as dist

    text = str(exc)
    if isinstance(exc, (dist.DistNetworkError, dist.DistStoreError)):
        return True
    if isinstance(exc, dist.DistBackendError):
        return bool(_PEER_GONE.search(text))
    return type(exc) is RuntimeError and bool(_GLOO_TRANSPORT.match(text)) and bool(_PEER_GONE.search(text))


def lost_rank_error(exc: BaseException, timeout_s: int, output_dir: str) -> TrainingError | None:
    """The TrainingError to raise for `exc` when it means another rank stopped or did not answer; None otherwise."""
    if world_size() <= 1 or not is_lost_rank(exc):
        return None
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    good = newest_good_checkpoint(output_dir)
    resume = (
        f"the newest complete checkpoint is {good}: start every node again with --resume"
        if good
        else "no complete checkpoint was saved yet"
    )
    return TrainingError(
        f"lost contact with another rank (rank {os.environ.get('RANK', '?')} of {world_size()}): a process or node "
        f"stopped, or did not answer within --ddp-timeout {timeout_s} s ({first[:200]}); {resume}"
    )
