"""The tests' one harness for runs: the argument list of a CLI call or of a tiny run, and a torchrun launch on a free
port. conftest.py re-exports it; every test folder imports it (pyproject: pythonpath = ["tests"])."""

import os
import socket
import subprocess
import sys


def cli_args(command, model, data=None, out=None, *extra, **options):
    """`command --model M [--dataset D] [--output-dir O]`, then one flag per keyword (`save_steps=1` →
    `--save-steps 1`; True → the bare flag; None or False → left out), then `extra` as given."""
    args = [command, "--model", str(model)]
    if data is not None:
        args += ["--dataset", str(data)]
    if out is not None:
        args += ["--output-dir", str(out)]
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return [*args, *(str(a) for a in extra)]


def run_args(command, model, data=None, out=None, *extra, steps=2, batch=2, max_length=64, lr="1e-3", **options):
    """A tiny run's arguments: cli_args with `--max-steps`, `--batch-size`, `--max-length` and `--lr` (each left out
    when set to None)."""
    named = {"max_steps": steps, "batch_size": batch, "max_length": max_length, "lr": lr, **options}
    return cli_args(command, model, data, out, *extra, **named)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(target, *args, nproc=2, port=None):
    """`python -m torch.distributed.run --nproc_per_node N --master_port P` of a script, or of `-m posttrainllm` when
    `target` is None; `port` None takes a free one."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    head += ["--master_port", str(port or free_port())]
    return head + ([str(target)] if target else ["-m", "posttrainllm"]) + [str(a) for a in args]


def torchrun(target, *args, nproc=2, port=None, env=None, timeout=None):
    """torchrun_cmd(...) run to its end with one thread per rank: the CompletedProcess, output captured as text."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = torchrun_cmd(target, *args, nproc=nproc, port=port)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
