"""Reliability: interrupt + resume reproduces the uninterrupted run, partial checkpoints are skipped, finished
output dirs are protected, and bad input of every kind exits 1 or 2 with one clear line and writes no model."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import cli_args, run_args, torchrun
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()
MODEL_FILES = ("model.safetensors", "pytorch_model.bin", "config.json", "training_complete.json")


def _cmd(model_dir, text_file, out, *extra):
    return [
        sys.executable,
        "-m",
        "posttrainllm",
        *run_args("finetune", model_dir, text_file, out, *extra, steps=24, save_steps=8, logging_steps=1, llrd="0.8"),
    ]


def _losses(out):
    state = json.loads((Path(out) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


@pytest.mark.smoke
def test_sigterm_then_resume_matches_uninterrupted_run(tiny_model_dir, text_file, tmp_path):
    env = dict(os.environ)
    ref = tmp_path / "ref"
    subprocess.run(_cmd(tiny_model_dir, text_file, ref), check=True, capture_output=True, env=env)

    out = tmp_path / "run"
    proc = subprocess.Popen(
        _cmd(tiny_model_dir, text_file, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    deadline = time.time() + 300
    while not (out / "checkpoint-8" / "COMPLETE").exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, output
    assert "--resume" in output
    assert "train_runtime" not in output and "run summary" not in output  # no end-of-training metrics when interrupted
    assert not (out / "training_complete.json").exists()
    done = sorted(out.glob("checkpoint-*"))
    assert done and all((d / "COMPLETE").exists() for d in done)

    # a checkpoint whose save was cut short: newer step, files present, no COMPLETE marker -> must be skipped
    half = out / "checkpoint-20"
    shutil.copytree(done[-1], half)
    (half / "COMPLETE").unlink()
    (half / "optimizer.pt").write_bytes(b"truncated")

    resumed = subprocess.run(_cmd(tiny_model_dir, text_file, out, "--resume"), capture_output=True, text=True, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "checkpoint-20" in resumed.stdout  # reported as skipped
    assert "resumed run" in resumed.stdout  # the train loss of a resumed run says which steps it covers
    ref_losses, got = _losses(ref), _losses(out)
    assert max(got) == 24
    for step in range(max(int(d.name.split("-")[1]) for d in done) + 1, 25):
        assert got[step] == pytest.approx(ref_losses[step], abs=1e-4), step


def test_resume_with_other_lr_is_refused(tmp_path):
    out = tmp_path / "o"
    (out / "checkpoint-8").mkdir(parents=True)
    (out / "checkpoint-8" / "COMPLETE").write_text("{}")
    (out / "run_config.json").write_text(json.dumps({"command": "sft", "lr": 1e-4, "llrd": 0.9, "model": "org/m"}))
    r = runner.invoke(
        app,
        cli_args("sft", "org/m", "org/d", out, resume=True, lr="3e-4", llrd="0.9"),
    )
    assert r.exit_code == 2
    assert "lr: 0.0001 → 0.0003" in r.output and "--allow-config-change" in r.output


def test_resume_without_complete_checkpoint_is_refused(tmp_path):
    out = tmp_path / "o"
    (out / "checkpoint-8").mkdir(parents=True)
    (out / "run_config.json").write_text(json.dumps({"command": "sft"}))  # a run of posttrainllm's
    r = runner.invoke(app, cli_args("sft", "org/m", "org/d", out, resume=True))
    assert r.exit_code == 2 and "no complete checkpoint" in r.output and "checkpoint-8" in r.output


def test_a_symlinked_checkpoint_is_reported_as_skipped_with_why(tmp_path):
    from posttrainllm.rundir import checkpoints, layout

    out, elsewhere = tmp_path / "o", tmp_path / "elsewhere" / "checkpoint-9"
    good = out / "checkpoint-2"
    good.mkdir(parents=True)
    (good / "model.safetensors").write_bytes(b"x" * 10)
    layout.write_json(good / layout.MARKER, {"files": {"model.safetensors": 10}})
    shutil.copytree(good, elsewhere)
    (out / "checkpoint-9").symlink_to(elsewhere, target_is_directory=True)
    (out / "run_config.json").write_text(json.dumps({"command": "sft"}))  # a run of posttrainllm's
    found, skipped = checkpoints.resume_checkpoint(out)
    assert found == good
    assert [(d.name, why.split(";")[0]) for d, why in skipped] == [("checkpoint-9", f"a symbolic link to {elsewhere}")]
    os.remove(good / layout.MARKER)
    r = runner.invoke(app, cli_args("sft", "org/m", "org/d", out, resume=True))
    assert r.exit_code == 2 and "checkpoint-9 (a symbolic link" in " ".join(r.output.split())


def _snapshot(d: Path):
    return {p.relative_to(d): (p.stat().st_mtime_ns, p.stat().st_size) for p in d.rglob("*")}


@pytest.mark.smoke
def test_rerun_into_finished_dir_changes_nothing(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "o"
    args = run_args("sft", tiny_model_dir, alpaca_file, out, steps=1, max_length=256, lr=None)
    assert runner.invoke(app, args).exit_code == 0
    before = _snapshot(out)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "--overwrite" in r.output and "--resume" in r.output
    assert _snapshot(out) == before


# ------------------------------------------------------------------------------------------------ bad inputs
def _bad_inputs(root: Path, model: Path, alpaca: Path, prefs: Path):
    """(name, command, args, expected exit code, fragment of the message)."""
    no_config = root / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"")
    no_weights = root / "no-weights"
    no_weights.mkdir()
    shutil.copy(model / "config.json", no_weights / "config.json")
    empty = root / "empty.jsonl"
    empty.write_text("")
    empty_list = root / "empty.json"
    empty_list.write_text("[]")
    binary = root / "blob.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    broken = root / "broken.jsonl"
    broken.write_text(
        '{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d"}\n{"prompt": "e", "completion": \n'
    )
    question = root / "question.jsonl"
    question.write_text('{"question": "why?"}\n')
    not_mapping = root / "list.yaml"
    not_mapping.write_text("- 1\n- 2\n")
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("lr: [1\n")
    unknown_key = root / "unknown.yaml"
    unknown_key.write_text("learning_rate: 1e-4\n")
    a_file = root / "a-file"
    a_file.write_text("x")
    m, d = str(model), str(alpaca)
    ok = ["--model", m, "--dataset", d]
    return [
        ("lr zero", "sft", ok + ["--lr", "0"], 2, "--lr must be > 0"),
        ("lr negative", "sft", ok + ["--lr", "-1e-4"], 2, "--lr must be > 0"),
        ("lr nan", "sft", ok + ["--lr", "nan"], 2, "finite"),
        ("lr inf", "sft", ok + ["--lr", "inf"], 2, "finite"),
        ("lr text", "sft", ok + ["--lr", "fast"], 2, "expected a number"),
        ("steps zero", "sft", ok + ["--max-steps", "0"], 2, "--max-steps"),
        ("steps negative", "sft", ok + ["--max-steps", "-3"], 2, "--max-steps"),
        ("batch zero", "sft", ok + ["--batch-size", "0"], 2, "--batch-size"),
        ("length zero", "sft", ok + ["--max-length", "0"], 2, "--max-length"),
        ("length negative", "dpo", ["--model", m, "--dataset", str(prefs), "--max-length", "-8"], 2, "--max-length"),
        ("grad accum text", "sft", ok + ["--grad-accum", "two"], 2, "--grad-accum"),
        ("llrd above range", "sft", ok + ["--llrd", "1.5"], 2, "[0.5, 1.0]"),
        ("llrd text", "dpo", ["--model", m, "--dataset", str(prefs), "--llrd", "high"], 2, "[0.5, 1.0]"),
        ("missing model dir", "sft", ["--model", str(root / "nope"), "--dataset", d], 2, "does not exist"),
        ("model dir without config", "sft", ["--model", str(no_config), "--dataset", d], 2, "config.json"),
        ("model dir without weights", "sft", ["--model", str(no_weights), "--dataset", d], 2, "no weights"),
        ("model is a file", "sft", ["--model", str(a_file), "--dataset", d], 2, "is a file"),
        ("missing dataset", "sft", ["--model", m, "--dataset", str(root / "none.jsonl")], 2, "does not exist"),
        ("empty dataset", "sft", ["--model", m, "--dataset", str(empty)], 1, "empty"),
        ("empty json list", "sft", ["--model", m, "--dataset", str(empty_list)], 1, "empty"),
        ("binary dataset", "sft", ["--model", m, "--dataset", str(binary)], 1, "UTF-8"),
        ("malformed jsonl", "sft", ["--model", m, "--dataset", str(broken)], 1, "line 3"),
        ("unknown columns", "sft", ["--model", m, "--dataset", str(question)], 1, "question"),
        ("dpo on sft data", "dpo", ok, 1, "sft"),
        ("recipe missing", "sft", ok + ["--recipe", str(root / "none.yaml")], 2, "recipe not found"),
        ("recipe not a mapping", "sft", ok + ["--recipe", str(not_mapping)], 2, "mapping"),
        ("recipe invalid yaml", "sft", ok + ["--recipe", str(bad_yaml)], 2, "invalid YAML"),
        ("recipe unknown key", "sft", ok + ["--recipe", str(unknown_key)], 2, "learning_rate"),
        ("unknown option", "sft", ok + ["--learning-rate", "1e-4"], 2, "No such option"),
        ("output dir is a file", "sft", ok + ["--output-dir", str(a_file)], 2, "is a file"),
        ("eval split out of range", "sft", ok + ["--eval-split", "1.0"], 2, "--eval-split"),
        ("ood eval file missing", "sft", ok + ["--ood-eval", str(root / "none.txt")], 2, "not found"),
        ("unknown optimizer", "sft", ok + ["--optim", "adamw_magic"], 2, "--optim"),
        ("lora target missing", "sft", ok + ["--lora-r", "4", "--lora-targets", "no_such_proj"], 2, "--lora-targets"),
        ("pretrain bad preset", "pretrain", ["--dataset", d, "--model-config", "huge"], 2, "--model-config"),
        ("replay ratio without data", "sft", ok + ["--replay-ratio", "0.2"], 2, "--replay-dataset"),
    ]


@pytest.fixture(scope="module")
def bad_input_cases(tmp_path_factory, tiny_model_dir):
    import json as _json

    root = tmp_path_factory.mktemp("bad")
    alpaca = root / "alpaca.json"
    alpaca.write_text(_json.dumps([{"instruction": f"Say {i}", "input": "", "output": str(i)} for i in range(8)]))
    prefs = root / "prefs.jsonl"
    prefs.write_text("".join(_json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" for _ in range(8)))
    return _bad_inputs(root, tiny_model_dir, alpaca, prefs)


def test_there_are_at_least_25_bad_inputs(bad_input_cases):
    assert len(bad_input_cases) >= 25


@pytest.mark.parametrize("index", range(36))
def test_bad_input_exits_cleanly_and_writes_no_model(index, bad_input_cases, tmp_path):
    name, cmd, args, code, fragment = bad_input_cases[index]
    out = tmp_path / "out"
    if "--output-dir" not in args:
        args = args + ["--output-dir", str(out)]
    args = args + ["--max-steps", "2"] if "--max-steps" not in args else args
    r = runner.invoke(app, [cmd, *args])
    assert r.exit_code == code, f"{name}: {r.output}"
    assert fragment in r.output, f"{name}: {r.output}"
    assert "Traceback" not in r.output
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 or "Usage:" in r.output, f"{name}: {r.output}"
    if out.exists():
        assert not any((out / f).exists() for f in MODEL_FILES), name


def test_debug_shows_the_traceback(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"question": "x"}\n')
    r = runner.invoke(
        app,
        cli_args("sft", "org/m", tmp_path / "d.jsonl", tmp_path / "o", lr=0, debug=True),
    )
    assert r.exit_code != 0
    assert r.exception is not None  # raised, not swallowed


@pytest.mark.smoke
def test_two_process_cpu_ddp_with_llrd(tiny_model_dir, alpaca_file, tmp_path):
    """torchrun --nproc_per_node 2 (gloo): exits 0, ranks agree on the groups, only rank 0 prints and writes."""
    out = tmp_path / "ddp"
    args = run_args("sft", tiny_model_dir, alpaca_file, out, llrd=0.9, max_length=256, lr=None)
    r = torchrun(None, *args, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("LR layer-decay: γ=0.9") == 1  # banner on rank 0 only
    assert r.stdout.count("run summary") == 1  # the end-of-run table on rank 0 only
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert state["log_history"][-1]["epoch"] == pytest.approx(2 * 2 * 2 / 32)  # 2 ranks × batch 2 × 2 steps of 32 rows
    assert (out / "model.safetensors").is_file()


@pytest.mark.smoke
def test_allow_config_change_applies_the_new_group_lrs_on_resume(tiny_model_dir, text_file, tmp_path):
    out = tmp_path / "o"
    common = cli_args(
        "finetune",
        tiny_model_dir,
        text_file,
        out,
        batch_size=2,
        max_length=64,
        logging_steps=1,
        save_steps=2,
        llrd="0.5",
        lr_scheduler="constant",
    )
    assert runner.invoke(app, common + ["--max-steps", "2", "--lr", "1e-3"]).exit_code == 0
    refused = runner.invoke(app, common + ["--max-steps", "4", "--lr", "2e-3", "--resume"])
    assert refused.exit_code == 2 and "--allow-config-change" in refused.output
    r = runner.invoke(app, common + ["--max-steps", "4", "--lr", "2e-3", "--resume", "--allow-config-change"])
    assert r.exit_code == 0, r.output
    logs = {h["step"]: h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h}
    assert logs[2]["lr_max"] == pytest.approx(1e-3)
    assert logs[3]["lr_max"] == pytest.approx(2e-3) and logs[3]["lr_min"] == pytest.approx(2e-3 * 0.5**3)


def _engine(deepspeed_config=None, fsdp_version=None, use_orig_params=False):
    from types import SimpleNamespace

    state = SimpleNamespace(
        deepspeed_plugin=SimpleNamespace(deepspeed_config=deepspeed_config or {}),
        fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version, use_orig_params=use_orig_params),
    )
    return SimpleNamespace(
        is_deepspeed_enabled=deepspeed_config is not None,
        is_fsdp_enabled=fsdp_version is not None,
        accelerator=SimpleNamespace(state=state),
    )


@pytest.mark.parametrize(
    "trainer,llrd,refused",
    [
        (_engine(deepspeed_config={"optimizer": {"type": "AdamW"}}), True, "DeepSpeed"),
        (_engine(deepspeed_config={"optimizer": {"type": "AdamW"}}), False, None),
        (_engine(deepspeed_config={"zero_optimization": {"stage": 2}}), True, None),
        (_engine(fsdp_version=1, use_orig_params=False), True, "use_orig_params"),
        (_engine(fsdp_version=1, use_orig_params=True), True, None),
        (_engine(fsdp_version=2), True, None),
    ],
)
def test_distributed_engines_that_would_drop_the_groups_are_refused(trainer, llrd, refused):
    from posttrainllm.errors import UsageError
    from posttrainllm.training import check_distributed_engine

    if refused:
        with pytest.raises(UsageError, match=refused):
            check_distributed_engine(trainer, llrd_active=llrd)
    else:
        check_distributed_engine(trainer, llrd_active=llrd)
