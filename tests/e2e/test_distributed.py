"""Distributed runs on CPU (gloo), as users launch them.

FSDP2 through `accelerate launch` with the shipped `examples/accelerate/fsdp2_cpu.yaml` (2 processes): sft and dpo
shard the plan's groups (param_groups.json equals what the sharded optimizer holds), the drift follows layer decay,
the saved model loads with from_pretrained and equals a DDP run of the same seed, and SIGTERM + --resume from
sharded checkpoints reproduces the uninterrupted losses. Two nodes on one machine: two `torchrun --nnodes 2` launchers
with a c10d rendezvous over loopback, each in its own directory (a node's local disk); the run completes with only
global rank 0 writing, and a node that dies, hangs or loses its launcher ends the other with exit 1 and a message.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import saved_groups
from harness import cli_args, free_port, torchrun_cmd

ROOT = Path(__file__).resolve().parents[2]
FSDP2_CPU = ROOT / "examples" / "accelerate" / "fsdp2_cpu.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GAMMA = 0.8
# fp32 throughout: FSDP2 and DDP are compared to 1e-5, and `auto` is bf16 autocast on a CPU with bf16 instructions,
# which FSDP2 applies as its own mixed-precision policy (bf16 shards), not as DDP's autocast
FP32 = ["--precision", "fp32"]
SFT = [
    *FP32,
    "--llrd",
    str(GAMMA),
    "--lr",
    "1e-3",
    "--max-steps",
    "12",
    "--save-steps",
    "4",
    "--batch-size",
    "2",
    "--max-length",
    "128",
    "--logging-steps",
    "1",
]
DPO = [
    *FP32,
    "--llrd",
    str(GAMMA),
    "--lr",
    "1e-3",
    "--max-steps",
    "3",
    "--batch-size",
    "2",
    "--max-length",
    "64",
    "--logging-steps",
    "1",
    "--weight-decay",
    "0.1",
]
LIMIT = 420  # seconds any one launch may take on a busy 2-core machine before the test gives up

# Each rank dumps what its optimizer holds once accelerate has prepared (sharded) the model.
SPY = textwrap.dedent("""
    import json, os, sys
    import transformers
    from posttrainllm import cli
    from posttrainllm.llrd import strip_wrappers

    original = transformers.Trainer._prepare_for_training

    def prepare(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        from torch.distributed.tensor import DTensor
        name_of = {id(p): strip_wrappers(n) for n, p in self.model.named_parameters()}
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        ref = getattr(self, "ref_model", None)
        ref_ids = {id(p) for p in ref.parameters()} if ref is not None else set()
        dump = {
            "fsdp": bool(self.is_fsdp_enabled),
            "groups": [{"name": g["name"], "lr": g["lr"], "weight_decay": g["weight_decay"],
                        "params": [name_of[id(p)] for p in g["params"]]} for g in self.optimizer.param_groups],
            "sharded": [isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in params],
            "ref": None if ref is None else {"in_optimizer": sum(id(p) in ref_ids for p in params),
                                             "sharded": all(isinstance(p, DTensor) for p in ref.parameters()),
                                             "trainable": sum(p.requires_grad for p in ref.parameters())},
        }
        with open(os.path.join(os.environ["SPY_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
            json.dump(dump, f)
        return out

    transformers.Trainer._prepare_for_training = prepare
    sys.argv = ["posttrainllm", *sys.argv[1:]]
    cli.main()
""")


def accelerate_fsdp2(target, *args):
    """`accelerate launch --config_file examples/accelerate/fsdp2_cpu.yaml` of a script or of `-m posttrainllm`."""
    head = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(FSDP2_CPU),
        "--main_process_port",
        str(free_port()),
    ]
    return head + ([str(target)] if target else ["-m", "posttrainllm"]) + list(args)


def run(cmd, **env):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **env}, timeout=LIMIT, check=False)
    r.seconds = round(time.time() - t0, 1)
    return r


def losses(out):
    state = json.loads((Path(out) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def drift(out):
    return {r["block"]: r["drift"] for r in json.loads((Path(out) / "drift.json").read_text())["depths"]}


def max_weight_difference(a, b):
    import torch
    from transformers import AutoModelForCausalLM

    ma, mb = AutoModelForCausalLM.from_pretrained(str(a)), AutoModelForCausalLM.from_pretrained(str(b))
    sb = mb.state_dict()
    return max(float((t - sb[k]).abs().max()) for k, t in ma.state_dict().items() if torch.is_floating_point(t))


def check(r, what):
    assert r.returncode == 0, f"{what}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist-data")
    rows = [
        {"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"The sum is {2 * i + 1}."} for i in range(32)
    ]
    (d / "alpaca.json").write_text(json.dumps(rows))
    prefs = [{"prompt": f"Say {i}.", "chosen": f"{i}", "rejected": f"no {i + 3} maybe"} for i in range(32)]
    (d / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prefs))
    (d / "spy.py").write_text(SPY)
    return d


def _fsdp_run(tmp_path_factory, command, model, dataset, data, args):
    root = tmp_path_factory.mktemp(f"fsdp-{command}")
    spy = root / "spy"
    spy.mkdir()
    r = run(
        accelerate_fsdp2(data / "spy.py", *cli_args(command, model, dataset, root / "out", *args)),
        SPY_DIR=str(spy),
    )
    check(r, f"FSDP2 {command}")
    return root / "out", {rank: json.loads((spy / f"rank{rank}.json").read_text()) for rank in (0, 1)}, r


def _ddp_run(tmp_path_factory, command, model, dataset, args):
    out = tmp_path_factory.mktemp(f"ddp-{command}") / "out"
    r = run(torchrun_cmd(None, *cli_args(command, model, dataset, out, *args)))
    check(r, f"DDP {command}")
    return out


@pytest.fixture(scope="module")
def fsdp_sft(tmp_path_factory, tiny_model_dir, data):
    return _fsdp_run(tmp_path_factory, "sft", tiny_model_dir, data / "alpaca.json", data, SFT)


@pytest.fixture(scope="module")
def ddp_sft(tmp_path_factory, tiny_model_dir, data):
    return _ddp_run(tmp_path_factory, "sft", tiny_model_dir, data / "alpaca.json", SFT)


# ------------------------------------------------------------------------------------------------------ banner
def test_the_step_count_divides_the_rows_among_the_ranks():
    from types import SimpleNamespace

    from posttrainllm.training import steps_row, total_steps

    cfg = SimpleNamespace(max_steps=-1, epochs=1.0, batch_size=4, grad_accum=1)
    assert (total_steps(cfg, 32, 1), total_steps(cfg, 32, 2)) == (8, 4)
    cfg.grad_accum = 3  # 5 batches per rank: 2 steps per epoch, the last one short (transformers rounds up)
    assert total_steps(cfg, 40, 2) == 2 and total_steps(SimpleNamespace(**{**vars(cfg), "epochs": 1.5}), 40, 2) == 3
    cfg.grad_accum = 2
    assert steps_row(cfg, 32, "max length 64", world_size=2) == (
        "2 (batch 4 per rank × 2 ranks × accum 2 = 16 rows per step, max length 64)"
    )
    assert steps_row(cfg, 32, "max length 64", world_size=1) == "4 (batch 4 × accum 2 = 8 rows per step, max length 64)"
    cfg.max_steps = 7
    assert total_steps(cfg, 32, 2) == 7


@pytest.mark.smoke
def test_the_banner_of_a_two_rank_epoch_run_shows_the_steps_it_trains(tmp_path, tiny_model_dir, data):
    out = tmp_path / "out"
    r = run(
        torchrun_cmd(
            None,
            *cli_args(
                "sft", tiny_model_dir, data / "alpaca.json", out, epochs=1, batch_size=4, max_length=128, save_steps=100
            ),
        ),
        COLUMNS="200",  # the banner row on one line
    )
    check(r, "DDP sft for one epoch")
    # 32 rows, batch 4 on each of 2 ranks: 4 steps (8 on one rank)
    assert "4 (batch 4 per rank × 2 ranks × accum 1 = 8 rows per step, max length 128)" in r.stdout, r.stdout[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


# ------------------------------------------------------------------------------------------------------ FSDP2
@pytest.mark.smoke
def test_fsdp2_sft_shards_the_planned_groups_and_saves_the_model_a_ddp_run_saves(fsdp_sft, ddp_sft):
    out, spy, r = fsdp_sft
    want = saved_groups(out)
    for rank in (0, 1):
        assert spy[rank]["fsdp"], rank
        assert spy[rank]["groups"] == want, rank  # param_groups.json == the sharded optimizer's groups, on every rank
        assert spy[rank]["sharded"] and all(spy[rank]["sharded"]), rank  # every tensor is a DTensor shard
    assert r.stdout.count("parameter groups: identical on all 2 ranks (fingerprint") == 1
    assert r.stdout.count("LR layer-decay: γ=0.8") == 1
    # sharded checkpoints, every shard listed in the COMPLETE marker
    from posttrainllm.rundir.layout import verify_checkpoint

    ckpt = out / "checkpoint-12"
    listed = json.loads((ckpt / "COMPLETE").read_text())["files"]
    for shard in ("optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp"):
        assert listed[shard] == (ckpt / shard).stat().st_size
    assert verify_checkpoint(ckpt) is None
    # the final model is whole (gathered), loads, and equals the DDP run's
    assert (out / "model.safetensors").is_file() and "model.safetensors" in json.loads(
        (out / "training_complete.json").read_text()
    )["files"]
    diff = max_weight_difference(out, ddp_sft)
    print(f"FSDP2 vs DDP sft: max |weight difference| {diff:.2e}")
    assert diff < 1e-5
    fsdp_losses, ddp_losses = losses(out), losses(ddp_sft)
    assert sorted(fsdp_losses) == list(range(1, 13))
    assert all(fsdp_losses[s] == pytest.approx(ddp_losses[s], abs=1e-5) for s in fsdp_losses)


@pytest.mark.smoke
def test_fsdp2_drift_per_block_follows_layer_decay(fsdp_sft, ddp_sft):
    out, spy, _ = fsdp_sft
    assert spy[0]["fsdp"] and all(spy[0]["sharded"])  # the weights really were sharded while they drifted
    d, ref = drift(out), drift(ddp_sft)
    top = d["block_3"]
    print(
        "drift ratios block_i/block_3:",
        {i: round(d[f"block_{i}"] / top, 4) for i in range(3)},
        "γ^(3-i):",
        {i: GAMMA ** (3 - i) for i in range(3)},
    )
    for i in range(3):  # Adam moves each block in proportion to its LR: block_i / block_3 ≈ γ^(3-i)
        assert d[f"block_{i}"] / top == pytest.approx(GAMMA ** (3 - i), rel=0.15), i
    assert d["block_0"] < d["block_1"] < d["block_2"] < d["block_3"]
    assert all(d[k] == pytest.approx(ref[k], rel=1e-3) for k in d)


@pytest.mark.smoke
def test_fsdp2_dpo_shards_the_policy_groups_and_keeps_the_reference_out_of_the_optimizer(
    tmp_path_factory, tiny_model_dir, data
):
    out, spy, _ = _fsdp_run(tmp_path_factory, "dpo", tiny_model_dir, data / "prefs.jsonl", data, DPO)
    want = saved_groups(out)
    assert any(g["name"].endswith(".no_decay") for g in want)
    for rank in (0, 1):
        assert spy[rank]["fsdp"] and spy[rank]["groups"] == want and all(spy[rank]["sharded"]), rank
        assert spy[rank]["ref"] == {"in_optimizer": 0, "sharded": True, "trainable": 0}, rank
    ddp = _ddp_run(tmp_path_factory, "dpo", tiny_model_dir, data / "prefs.jsonl", DPO)
    diff = max_weight_difference(out, ddp)
    d = drift(out)
    print(
        f"FSDP2 vs DDP dpo: max |weight difference| {diff:.2e}; drift ratios",
        {i: round(d[f"block_{i}"] / d["block_3"], 4) for i in range(3)},
    )
    assert diff < 1e-5
    assert d["block_0"] < d["block_1"] < d["block_2"] < d["block_3"]


@pytest.mark.smoke
def test_fsdp2_sigterm_then_resume_from_sharded_checkpoints_reproduces_the_losses(
    fsdp_sft, tiny_model_dir, data, tmp_path
):
    reference, _, _ = fsdp_sft
    out = tmp_path / "out"
    cmd = accelerate_fsdp2(None, *cli_args("sft", tiny_model_dir, data / "alpaca.json", out, *SFT))
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True
    )
    try:
        deadline = time.time() + LIMIT
        while not (out / "checkpoint-4" / "COMPLETE").exists():
            assert proc.poll() is None and time.time() < deadline, (
                proc.stdout.read() if proc.poll() is not None else "no checkpoint"
            )
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # to the launcher: it passes SIGTERM on to both ranks
        output, _ = proc.communicate(timeout=LIMIT)
    finally:
        _kill_tree(proc)
    assert proc.returncode != 0
    assert "interrupted at step" in output and "--resume" in output
    assert not (out / "training_complete.json").exists()
    done = sorted(
        (d for d in out.glob("checkpoint-*") if (d / "COMPLETE").exists()), key=lambda d: int(d.name.split("-")[1])
    )
    assert done and int(done[-1].name.split("-")[1]) < 12
    assert (
        "optimizer_0/__1_0.distcp" in json.loads((done[-1] / "COMPLETE").read_text())["files"]
    )  # a sharded checkpoint
    # a newer checkpoint whose marker lists a rank's optimizer shard that is gone: --resume must skip it
    from shutil import copytree

    broken = out / "checkpoint-11"
    copytree(done[-1], broken)
    (broken / "optimizer_0" / "__1_0.distcp").unlink()
    r = run(cmd + ["--resume"])
    check(r, "resume")
    assert "checkpoint-11 (optimizer_0/__1_0.distcp is missing)" in r.stdout
    got, want = losses(out), losses(reference)
    resumed = range(int(done[-1].name.split("-")[1]) + 1, 13)
    print(
        f"resumed from {done[-1].name}: max |loss difference| "
        f"{max(abs(got[s] - want[s]) for s in resumed):.2e} over steps {list(resumed)}"
    )
    assert list(resumed) and all(got[s] == pytest.approx(want[s], abs=1e-4) for s in resumed)


def test_fsdp1_on_cpu_is_refused_instead_of_running_as_ddp(monkeypatch):
    from types import SimpleNamespace

    from posttrainllm.errors import UsageError
    from posttrainllm.training import EngineMixin

    class Base:
        def create_accelerator_and_postprocess(self):
            self.created = True

    class Trainer(EngineMixin, Base):
        is_fsdp_enabled = True  # as if accelerate had already built the FSDP state

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    t = Trainer()
    t.args = SimpleNamespace(fsdp_plugin_args=None, use_cpu=True)
    with pytest.raises(UsageError, match="FSDP version 1 needs GPUs.*fsdp_version: 2"):
        t.create_accelerator_and_postprocess()
    monkeypatch.setenv("FSDP_VERSION", "2")
    t.create_accelerator_and_postprocess()
    assert t.created


@pytest.mark.parametrize(("argv", "code"), [(["--version"], 0), (["sft", "--llrd", "7"], 2)])
def test_a_rank_of_a_launch_ends_with_the_commands_exit_code_after_its_exit_handlers(argv, code):
    """A rank's process ends through os._exit once its exit handlers ran: the interpreter's own shutdown can abort a
    rank of a successful FSDP2 run (gloo / distributed-checkpoint threads destroyed while joinable)."""
    script = textwrap.dedent(f"""
        import atexit, sys
        import torch.distributed
        import posttrainllm.distributed
        atexit.register(lambda: print("exit handlers ran", flush=True))
        class Finalized:
            def __del__(self):
                print("interpreter finalization", flush=True)
        kept = Finalized()
        sys.argv = ["posttrainllm", *{argv!r}]
        from posttrainllm.cli import main
        main()
        print("not reached")
    """)
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**ENV, "WORLD_SIZE": "2"}, timeout=120
    )
    assert r.returncode == code, r.stderr
    assert "exit handlers ran" in r.stdout and "not reached" not in r.stdout
    assert "interpreter finalization" not in r.stdout  # skipped: where the abort happens
    single = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=120)
    assert single.returncode == code and "interpreter finalization" in single.stdout  # single process: a normal exit


# ------------------------------------------------------------------------------------------------ two nodes
def _kill_tree(proc, extra=()):
    """SIGKILL a launcher, its workers and any worker recorded earlier (a stopped one is continued first)."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for pid in extra:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                break
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


class Nodes:
    """Two torchrun launchers (`--nnodes 2 --nproc-per-node 1`, c10d rendezvous on 127.0.0.1), each in its own
    directory, so that each node writes `--output-dir out` to its own disk. Node A starts first and hosts the
    rendezvous store."""

    def __init__(self, root: Path, model, dataset, *args):
        self.port = free_port()
        self.dirs = {n: root / f"node{n}" for n in "AB"}
        self.logs = {n: root / f"node{n}.log" for n in "AB"}
        self.procs, self.workers = {}, []
        for n in "AB":
            self.dirs[n].mkdir()
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{self.port}",
                "--rdzv-id",
                f"two-nodes-{self.port}",
                "-m",
                "posttrainllm",
                *cli_args("sft", model, dataset, "out", *args, llrd="0.9"),
            ]
            self.procs[n] = subprocess.Popen(
                cmd,
                cwd=self.dirs[n],
                stdout=self.logs[n].open("w"),
                stderr=subprocess.STDOUT,
                env=ENV,
                start_new_session=True,
            )
            if n == "A":
                self._wait_for_store()

    def _wait_for_store(self):
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.procs["A"].poll() is None, self.log("A")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise AssertionError("the first launcher never opened the rendezvous store")

    def log(self, n):
        return self.logs[n].read_text(errors="replace")

    def wait_for_step(self, step):
        deadline = time.time() + LIMIT
        while not any(f"step {step}/" in self.log(n) for n in "AB"):
            assert all(p.poll() is None for p in self.procs.values()), self.log("A") + self.log("B")
            assert time.time() < deadline, "training did not start"
            time.sleep(0.1)

    def workers_of(self, n):
        import psutil

        kids = [p.pid for p in psutil.Process(self.procs[n].pid).children(recursive=True)]
        self.workers += kids
        return kids

    def wait(self, n, limit):
        t0 = time.time()
        try:
            code = self.procs[n].wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
        return code, round(time.time() - t0, 1)

    def rank0_node(self):
        return next(n for n in "AB" if "LR layer-decay" in self.log(n))

    def close(self):
        for p in self.procs.values():
            _kill_tree(p, self.workers)


@pytest.fixture
def nodes(tmp_path, tiny_model_dir, alpaca_file):
    started = []

    def start(*args):
        started.append(Nodes(tmp_path, tiny_model_dir, alpaca_file, *args))
        return started[-1]

    yield start
    for n in started:
        n.close()


@pytest.mark.smoke
def test_two_node_rendezvous_trains_with_llrd_and_only_global_rank0_writes(nodes):
    two = nodes("--max-steps", "3", "--save-steps", "2", "--batch-size", "2", "--max-length", "128")
    codes = {n: two.wait(n, LIMIT)[0] for n in "AB"}
    assert codes == {"A": 0, "B": 0}, two.log("A")[-3000:] + two.log("B")[-3000:]
    main = two.rank0_node()
    other = "B" if main == "A" else "A"
    logs = two.log("A") + two.log("B")
    assert logs.count("LR layer-decay: γ=0.9") == 1 and logs.count("run summary") == 1
    assert logs.count("parameter groups: identical on all 2 ranks (fingerprint") == 1  # the ranks compared their groups
    out = two.dirs[main] / "out"
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    assert (out / "model.safetensors").is_file() and (out / "training_complete.json").is_file()
    # the other node's disk: nothing but rank 1's RNG state inside the checkpoints (which resuming needs there)
    written = sorted(p.relative_to(two.dirs[other]).as_posix() for p in two.dirs[other].rglob("*") if p.is_file())
    assert written and all(w.startswith("out/checkpoint-") and w.endswith("/rng_state_1.pth") for w in written), written


def until_stopped(ddp_timeout: int) -> list[str]:
    """Options of a two-node run that trains until a test stops it, logging every step."""
    return ["--max-steps", "100000", "--save-steps", "100000", "--batch-size", "2", "--max-length", "128",
            "--logging-steps", "1", "--ddp-timeout", str(ddp_timeout)]  # fmt: skip


@pytest.mark.smoke
def test_when_one_node_dies_the_other_exits_1_with_a_message_at_once(nodes):
    two = nodes(*until_stopped(ddp_timeout=120))
    two.wait_for_step(3)
    for pid in [two.procs["B"].pid, *two.workers_of("B")]:  # node B is gone: its launcher and its worker
        os.kill(pid, signal.SIGKILL)
    code, seconds = two.wait("A", 100)
    log = two.log("A")
    print(f"node A exited {code} {seconds} s after node B was killed")
    assert code == 1, log[-3000:]
    assert seconds < 100  # well before --ddp-timeout: a closed connection is noticed at once
    assert "error: lost contact with another rank" in log and "a process or node stopped" in log


@pytest.mark.smoke
def test_a_hung_node_is_given_up_after_ddp_timeout(nodes):
    two = nodes(*until_stopped(ddp_timeout=10))
    two.wait_for_step(3)
    for pid in [two.procs["B"].pid, *two.workers_of("B")]:  # node B stops answering (its sockets stay open)
        os.kill(pid, signal.SIGSTOP)
    code, seconds = two.wait("A", 120)  # torch's default would be 30 minutes
    log = two.log("A")
    print(f"node A exited {code} {seconds} s after node B stopped answering (--ddp-timeout 10)")
    assert code == 1, log[-3000:]
    assert 8 <= seconds < 120
    assert "error: lost contact with another rank" in log and "--ddp-timeout 10 s" in log and "Timed out" in log


@pytest.mark.smoke
def test_killing_one_launcher_stops_both_nodes_at_one_checkpoint(nodes):
    two = nodes(*until_stopped(ddp_timeout=120))
    two.wait_for_step(3)
    worker = two.workers_of("B")
    os.kill(two.procs["B"].pid, signal.SIGKILL)  # the launcher alone: its worker must not train on as an orphan
    code, seconds = two.wait("A", 100)
    print(f"node A exited {code} {seconds} s after node B's launcher was killed")
    assert code == 1, two.log("A")[-3000:]
    assert "(another rank received SIGTERM)" in two.log("A"), two.log("A")[-6000:] + "\n=====B\n" + two.log("B")[-3000:]
    import psutil

    deadline = time.time() + 60
    while any(psutil.pid_exists(w) and psutil.Process(w).status() != psutil.STATUS_ZOMBIE for w in worker):
        assert time.time() < deadline, "node B's worker is still running without its launcher"
        time.sleep(0.2)
    out = two.dirs[two.rank0_node()] / "out"
    done = [d for d in out.glob("checkpoint-*") if (d / "COMPLETE").exists()]
    assert done, "no checkpoint written at the stop"


# ------------------------------------------------------------------------------- a lost rank, told by its type
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:27324. This is typically caused by a remote worker crashing."
)  # measured, torch 2.13: the error a surviving gloo rank gets when its peer is killed (a plain RuntimeError)
GLOO_TIMEOUT = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms"
)


def _lost(exc, tmp_path):
    from posttrainllm.distributed import lost_rank_error

    return lost_rank_error(exc, 60, str(tmp_path))


def test_a_cuda_error_raised_through_nccl_is_not_reported_as_a_lost_rank(monkeypatch, tmp_path):
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    cuda = RuntimeError(
        "CUDA error: an illegal memory access was encountered (in NCCL all_reduce; CUDA kernel errors might be "
        "asynchronously reported at some other API call)"
    )
    assert _lost(cuda, tmp_path) is None
    nccl = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5")
    assert _lost(nccl, tmp_path) is None
    assert _lost(ValueError("gloo timeout"), tmp_path) is None  # words alone say nothing
    assert _lost(RuntimeError("timeout while reading the dataset"), tmp_path) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda dist: RuntimeError(GLOO_CLOSED),
        lambda dist: RuntimeError(GLOO_TIMEOUT),
        lambda dist: dist.DistNetworkError("failed to recv, got 0 bytes"),
        lambda dist: dist.DistStoreError("Timed out after 901 seconds waiting for clients. 1/2 clients joined."),
        lambda dist: dist.DistBackendError("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(...)"),
    ],
    ids=["gloo-closed", "gloo-timeout", "network", "store", "nccl-watchdog"],
)
def test_a_peer_that_is_gone_or_silent_is_a_lost_rank_naming_the_newest_good_checkpoint(make, monkeypatch, tmp_path):
    import torch.distributed as dist

    from posttrainllm.rundir.layout import MARKER, file_sizes, write_json

    monkeypatch.setenv("WORLD_SIZE", "2")
    for step, complete in ((2, True), (4, False)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 8)
        if complete:
            write_json(d / MARKER, {"step": step, "files": file_sizes(d)})
    err = _lost(make(dist), tmp_path)
    assert err is not None and "lost contact with another rank" in str(err)
    assert f"the newest complete checkpoint is {tmp_path / 'checkpoint-2'}" in str(err)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _lost(make(dist), tmp_path) is None  # a single process has no other rank to lose
