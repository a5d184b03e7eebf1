"""Never lose a user's work, never call a broken run a success: the output directory's ownership and lock,
--overwrite that deletes nothing before the new run is complete, divergence, verified resume, bounded input.

Data-loss tests compare every file's bytes and mtime before and after, not only exit codes."""

import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import cli_args, run_args, torchrun
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def snapshot(d: Path) -> dict:
    """Every regular file under d (hidden ones included): bytes digest and mtime."""
    return {
        str(p.relative_to(d)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def finetune_args(model, data, out, *extra):
    return run_args("finetune", model, data, out, *extra, save_steps=1, logging_steps=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from conftest import CORPUS

    p = tmp_path_factory.mktemp("data") / "corpus.txt"
    p.write_text("\n".join(CORPUS * 40))
    return p


@pytest.fixture(scope="module")
def finished_template(tiny_model_dir, corpus, tmp_path_factory):
    """A finished finetune run (2 steps, checkpoints at 1 and 2), copied per test with its mtimes."""
    out = tmp_path_factory.mktemp("finished") / "run"
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out))
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def finished(finished_template, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_template, out)  # copy2: same bytes, same mtimes
    return out


# ----------------------------------------------------------------------------------------------- 1. --overwrite
@pytest.mark.smoke
def test_overwrite_refuses_to_train_a_finished_run_in_place(finished, corpus):
    before = snapshot(finished)
    r = runner.invoke(app, finetune_args(finished, corpus, finished, "--overwrite"))
    assert r.exit_code == 2, r.output
    assert "--model" in r.output and "inside --output-dir" in r.output
    assert snapshot(finished) == before


@pytest.mark.parametrize("key", ["--dataset", "--eval-dataset", "--replay-dataset", "--ref-model", "--ood-eval"])
def test_overwrite_refuses_when_an_input_lives_in_the_output_dir(finished, corpus, tiny_model_dir, key):
    inside = finished / "more.txt"
    inside.write_text(corpus.read_text())
    before = snapshot(finished)
    args = finetune_args(tiny_model_dir, inside if key == "--dataset" else corpus, finished, "--overwrite")
    extra = {
        "--eval-dataset": ["--eval-dataset", str(inside)],
        "--replay-dataset": ["--replay-dataset", str(inside), "--replay-ratio", "0.2"],
        "--ref-model": ["--ref-model", str(finished / "checkpoint-1")],
        "--ood-eval": ["--ood-eval", str(inside)],
    }.get(key, [])
    if key == "--ref-model":
        args[0] = "dpo"
    r = runner.invoke(app, [*args, *extra])
    assert r.exit_code == 2 and key in r.output and "inside --output-dir" in r.output, r.output
    assert snapshot(finished) == before


@pytest.mark.smoke
def test_overwrite_with_a_bad_dataset_leaves_the_finished_run_untouched(finished, tiny_model_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    before = snapshot(finished)
    r = runner.invoke(app, finetune_args(tiny_model_dir, bad, finished, "--overwrite"))
    assert r.exit_code == 1 and "line 2" in r.output, r.output
    assert snapshot(finished) == before


def test_overwrite_refuses_a_directory_holding_files_that_are_not_ours(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "checkpoint-notes.txt").write_text("my notes")  # a FILE named checkpoint-..., not a checkpoint directory
    (out / "thesis.tex").write_text("years of work")
    before = snapshot(out)
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out, "--overwrite"))
    assert r.exit_code == 2, r.output
    assert "checkpoint-notes.txt" in r.output and "did not write" in r.output
    assert snapshot(out) == before


def test_overwrite_refuses_a_finished_run_with_a_user_file_added(finished, tiny_model_dir, corpus):
    (finished / "NOTES.md").write_text("what I learned")
    before = snapshot(finished)
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--overwrite"))
    assert r.exit_code == 2 and "NOTES.md" in r.output, r.output
    assert snapshot(finished) == before


@pytest.mark.smoke
def test_overwrite_failing_before_its_first_checkpoint_puts_the_old_run_back(finished, tiny_model_dir, corpus):
    before = snapshot(finished)
    r = runner.invoke(
        app, finetune_args(tiny_model_dir, corpus, finished, "--overwrite", "--lr", "1e10", "--save-steps", "100")
    )
    assert r.exit_code == 1 and "diverged" in r.output, r.output
    assert "put back" in r.output
    assert snapshot(finished) == before
    assert not (finished / ".posttrainllm" / "replaced-1").exists()


@pytest.mark.smoke
def test_overwrite_keeps_the_old_contents_until_the_new_final_save(finished, tiny_model_dir, corpus, monkeypatch):
    """The final save fails after the new run saved checkpoints: the old run is still there, byte for byte."""
    from posttrainllm.rundir import checkpoints

    before = snapshot(finished)

    def broken_save(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints, "save_final", broken_save)
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--overwrite", "--max-steps", "3"))
    assert r.exit_code == 1, r.output
    slot = finished / ".posttrainllm" / "replaced-1"
    assert "replaced-1" in r.output and "kept" in r.output
    kept = {
        k.removeprefix(".posttrainllm/replaced-1/"): v
        for k, v in snapshot(finished).items()
        if k.startswith(".posttrainllm/replaced-1/")
    }
    old_manifest = before.pop(".posttrainllm/manifest.json")
    assert kept.pop(".posttrainllm-manifest.json") == old_manifest
    assert kept == before
    assert (finished / "checkpoint-3" / "COMPLETE").is_file()  # the new run's own checkpoint, resumable
    monkeypatch.undo()
    # finishing the new run (--resume) completes the replacement: the old contents go only now
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--resume", "--max-steps", "3"))
    assert r.exit_code == 0, r.output
    assert not slot.exists() and (finished / "training_complete.json").is_file()


def test_overwrite_replaces_a_finished_run_and_drops_the_old_one_after_success(finished, tiny_model_dir, corpus):
    old = json.loads((finished / "training_complete.json").read_text())
    r = runner.invoke(
        app, finetune_args(tiny_model_dir, corpus, finished, "--overwrite", "--max-steps", "3", "--save-steps", "5")
    )
    assert r.exit_code == 0, r.output
    assert json.loads((finished / "training_complete.json").read_text())["global_step"] == 3 != old["global_step"]
    assert not (finished / "checkpoint-1").exists()  # the old run's checkpoints went with it
    assert sorted(p.name for p in (finished / ".posttrainllm").iterdir()) == ["manifest.json"]


def test_a_hard_killed_overwrite_is_undone_by_the_next_run(finished, tiny_model_dir, corpus):
    """State after SIGKILL between moving the old run aside and the first checkpoint: the next run restores it."""
    before = snapshot(finished)
    slot = finished / ".posttrainllm" / "replaced-1"
    slot.mkdir(parents=True)
    os.replace(finished / ".posttrainllm" / "manifest.json", slot / ".posttrainllm-manifest.json")
    for p in list(finished.iterdir()):
        if p.name != ".posttrainllm":
            os.replace(p, slot / p.name)
    (finished / "run_config.json").write_text("{}")  # the killed run's records
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished))
    assert r.exit_code == 2 and "restored the previous contents" in r.output and "--resume" in r.output, r.output
    assert snapshot(finished) == before


# ----------------------------------------------------------------------------------------------- 2. the lock
@pytest.mark.smoke
def test_a_second_run_into_a_busy_output_dir_exits_2_naming_the_holder(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "busy"
    cmd = [
        sys.executable,
        "-m",
        "posttrainllm",
        *finetune_args(
            tiny_model_dir, corpus, out, "--max-steps", "5000", "--save-steps", "100000", "--logging-steps", "1000"
        ),
    ]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    try:
        deadline = time.time() + 120
        while not (out / "param_groups.json").exists():
            assert first.poll() is None and time.time() < deadline, (
                first.stdout.read() if first.poll() is not None else "timeout"
            )
            time.sleep(0.05)
        t0 = time.time()
        second = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120, check=False)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"PID {first.pid}" in second.stderr and "in use" in second.stderr
        assert time.time() - t0 < 60
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGTERM)
        output, _ = first.communicate(timeout=300)
    assert first.returncode == 143, output
    assert not (out / ".posttrainllm" / "lock").exists()  # released on exit


def test_the_lock_of_a_dead_process_is_taken_over(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "orphan"
    code = (
        "import sys, time; from pathlib import Path; from posttrainllm.rundir.outdir import Lock; "
        "Lock(Path(sys.argv[1])).acquire('x'); print('locked', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True, env=ENV)
    assert holder.stdout.readline().strip() == "locked"
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out))
    assert r.exit_code == 2 and f"PID {holder.pid}" in r.output, r.output
    holder.kill()
    holder.wait()
    assert (out / ".posttrainllm" / "lock").exists()  # a killed process cannot clean up
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out))
    assert r.exit_code == 0, r.output
    assert "took over the lock" in r.output and f"PID {holder.pid}" in r.output


@pytest.mark.smoke
def test_torchrun_ranks_respect_the_lock_without_hanging(tiny_model_dir, corpus, tmp_path):
    from posttrainllm.rundir.outdir import Lock

    out = tmp_path / "ddp"
    lock = Lock(out)
    lock.acquire(str(out))
    try:
        t0 = time.time()
        r = torchrun(None, *finetune_args(tiny_model_dir, corpus, out), env=ENV, timeout=300)
    finally:
        lock.release()
    assert r.returncode != 0
    assert f"PID {os.getpid()}" in r.stdout + r.stderr
    assert time.time() - t0 < 240


# --------------------------------------------------------------------------------- 3./4. records are not a run
def test_a_retry_after_a_failed_start_proceeds(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "retry"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"command": "finetune", "lr": 1.0}))
    (out / "param_groups.json").write_text("[]")
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out))
    assert r.exit_code == 0, r.output
    assert json.loads((out / "run_config.json").read_text())["lr"] == 1e-3


@pytest.mark.smoke
def test_a_dry_run_then_the_same_command_trains(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "plan"
    args = finetune_args(tiny_model_dir, corpus, out, "--llrd", "0.8")
    r = runner.invoke(app, [*args, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["param_groups.json", "run_config.json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert (out / "training_complete.json").is_file()


def test_a_dry_run_with_overwrite_leaves_a_finished_run_untouched(finished, tiny_model_dir, corpus):
    before = snapshot(finished)
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--overwrite", "--dry-run", "--lr", "5e-4"))
    assert r.exit_code == 0 and "which a dry run leaves as it is" in r.output, r.output
    assert snapshot(finished) == before


# ------------------------------------------------------------------------------------------------ 5. divergence
@pytest.mark.smoke
def test_divergence_exits_1_keeps_the_last_good_checkpoint_and_writes_no_model(tiny_model_dir, corpus, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "nan"
    r = runner.invoke(
        app,
        finetune_args(
            tiny_model_dir, corpus, out, "--lr", "1e10", "--max-steps", "6", "--logging-steps", "50",
            "--precision", "bf16",
        ),
    )  # fmt: skip
    assert r.exit_code == 1, r.output
    # a bf16 run is advised fp32 (an fp32 run is not: tests/cli/test_kl_to_base.py)
    assert "diverged" in r.output and "at step 2" in r.output and "--lr" in r.output and "--precision fp32" in r.output
    assert "checkpoint-1" in r.output
    assert not (out / "training_complete.json").exists() and not (out / "model.safetensors").exists()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert all(t.isfinite().all() for t in load_file(str(out / "checkpoint-1" / "model.safetensors")).values())
    assert "Traceback" not in r.output


def test_divergence_between_logging_steps_is_caught(tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "nan2"
    r = runner.invoke(
        app,
        finetune_args(
            tiny_model_dir,
            corpus,
            out,
            "--lr",
            "1e10",
            "--max-steps",
            "4",
            "--save-steps",
            "100",
            "--logging-steps",
            "3",
        ),
    )
    assert r.exit_code == 1 and "between steps 2 and 3" in r.output and "no checkpoint had been saved" in r.output, (
        r.output
    )
    assert not (out / "training_complete.json").exists() and not list(out.glob("checkpoint-*"))


def test_the_final_save_refuses_nonfinite_weights(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from posttrainllm.errors import TrainingError
    from posttrainllm.rundir.checkpoints import save_final

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(TrainingError, match="layers.1.mlp.up_proj.weight"):
        save_final(model, None, str(out))
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------------------------------------ 6. resume
@pytest.mark.smoke
def test_resuming_a_finished_run_changes_nothing(finished, tiny_model_dir, corpus):
    before = snapshot(finished)
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--resume"))
    assert r.exit_code == 0 and "already complete" in r.output, r.output
    assert snapshot(finished) == before


@pytest.mark.smoke
def test_resuming_from_a_checkpoint_at_max_steps_only_writes_the_final_model(finished, tiny_model_dir, corpus):
    from safetensors.torch import load_file

    for name in (
        "training_complete.json",
        "model.safetensors",
        "config.json",
        "trainer_state.json",
        "eval_results.json",
    ):
        (finished / name).unlink()  # a crash during the final save
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, finished, "--resume"))
    assert r.exit_code == 0, r.output
    assert json.loads((finished / "training_complete.json").read_text())["global_step"] == 2
    assert json.loads((finished / "trainer_state.json").read_text())["global_step"] == 2
    assert not (finished / "checkpoint-3").exists()
    final, ckpt = (
        load_file(str(finished / "model.safetensors")),
        load_file(str(finished / "checkpoint-2" / "model.safetensors")),
    )
    assert all((final[k] == ckpt[k]).all() for k in ckpt)


@pytest.mark.smoke
@pytest.mark.parametrize("damage", ["delete optimizer.pt", "truncate model.safetensors", "delete rng_state.pth"])
def test_resume_skips_a_checkpoint_whose_files_are_not_what_its_marker_lists(damage, tiny_model_dir, corpus, tmp_path):
    out = tmp_path / "o"
    args = finetune_args(tiny_model_dir, corpus, out, "--max-steps", "4", "--save-steps", "2")
    assert runner.invoke(app, args).exit_code == 0
    reference = {
        h["step"]: h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h
    }
    for name in ("training_complete.json", "model.safetensors", "config.json"):
        (out / name).unlink()
    verb, name = damage.split()
    target = out / "checkpoint-4" / name
    if verb == "delete":
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[:100])
    r = runner.invoke(app, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert "skipped" in r.output and "checkpoint-4" in r.output and name in r.output
    got = {
        h["step"]: h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h
    }
    assert got[3] == pytest.approx(reference[3], abs=1e-5) and got[4] == pytest.approx(reference[4], abs=1e-5)


def test_checkpoint_markers_list_files_and_sizes(finished):
    from posttrainllm.rundir.layout import verify_checkpoint

    marker = json.loads((finished / "checkpoint-2" / "COMPLETE").read_text())
    assert marker["files"]["optimizer.pt"] == (finished / "checkpoint-2" / "optimizer.pt").stat().st_size
    assert {"model.safetensors", "scheduler.pt", "trainer_state.json"} <= set(marker["files"])
    assert verify_checkpoint(finished / "checkpoint-2") is None
    with open(finished / "checkpoint-2" / "scheduler.pt", "ab") as fh:
        fh.write(b"\0")
    assert "scheduler.pt has" in verify_checkpoint(finished / "checkpoint-2")


def test_allow_config_change_records_the_new_settings_and_keeps_the_old_as_history(finished, tiny_model_dir, corpus):
    r = runner.invoke(
        app,
        finetune_args(
            tiny_model_dir, corpus, finished, "--resume", "--allow-config-change", "--max-steps", "3", "--lr", "2e-3"
        ),
    )
    assert r.exit_code == 0, r.output
    saved = json.loads((finished / "run_config.json").read_text())
    assert saved["lr"] == 2e-3 and saved["max_steps"] == 3
    assert [h["lr"] for h in saved["history"]] == [1e-3] and saved["history"][0]["max_steps"] == 2
    assert json.loads((finished / "training_complete.json").read_text())["global_step"] == 3


# ------------------------------------------------------------------------------------- 8./9. hostile input
def _with_alarm(seconds, fn):
    def timeout(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_fifos_sockets_and_devices_are_refused_before_they_are_opened(tiny_model_dir, corpus, tmp_path):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.txt"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        r = _with_alarm(
            60,
            lambda: runner.invoke(
                app,
                cli_args(
                    "sft",
                    tiny_model_dir,
                    fifo,
                    tmp_path / "o",
                    eval_dataset="/dev/zero",
                    replay_dataset=fifo,
                    replay_ratio="0.2",
                    ood_eval=sock_path,
                ),
            ),
        )
        assert r.exit_code == 2, r.output
        for fragment in (
            f"--dataset {fifo} is a FIFO",
            "--eval-dataset /dev/zero is a character device",
            f"--replay-dataset {fifo} is a FIFO",
            f"--ood-eval {sock_path} is a socket",
        ):
            assert fragment in r.output, r.output
        r = _with_alarm(
            60,
            lambda: runner.invoke(app, cli_args("eval", tiny_model_dir, text=fifo, sft_dataset="/dev/zero")),
        )
        assert (
            r.exit_code == 2 and "--text" in r.output and "--sft-dataset /dev/zero is a character device" in r.output
        ), r.output
        r = _with_alarm(
            60,
            lambda: runner.invoke(app, cli_args("sft", tiny_model_dir, corpus, recipe=fifo)),
        )
        assert r.exit_code == 2 and "is a FIFO" in r.output, r.output
        r = _with_alarm(
            60,
            lambda: runner.invoke(
                app,
                cli_args("finetune", tiny_model_dir, "/dev/zero", tmp_path / "z"),
            ),
        )
        assert r.exit_code == 2 and "character device" in r.output, r.output
    finally:
        sock.close()
    assert not (tmp_path / "o").exists() and not (tmp_path / "z").exists()


BOMB = (
    "\n".join(
        ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
        + ["lr: *i"]
    )
    + "\n"
)


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_yaml_alias_bomb_recipe_is_refused_quickly_in_bounded_memory(tmp_path):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(BOMB)
    assert len(BOMB) < 600
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "posttrainllm", "sft", "--recipe", str(recipe), "--model", "m/x", "--dataset", "d/x"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "aliases" in r.stderr and "Traceback" not in r.stderr
    assert time.time() - t0 < 30


@pytest.mark.parametrize(
    "text,key,lines",
    [
        ("lr: 1e-4\nllrd: 0.9\nmax_steps: 2\nllrd: 0.5\n", "'llrd'", "line 2 and line 4"),
        ("trainer_args:\n  adam_beta2: 0.9\n  adam_beta2: 0.5\n", "'adam_beta2'", "line 2 and line 3"),
        ("max-length: 8\nmax_length: 16\n", "'max-length' and 'max_length' are the same option", ""),
    ],
)
def test_a_recipe_key_given_twice_is_exit_2_naming_the_key_and_both_lines(tmp_path, text, key, lines):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text(text)
    r = runner.invoke(app, ["sft", "--recipe", str(recipe), "--model", "m/x", "--dataset", "d/x"])
    assert r.exit_code == 2, r.output
    assert key in r.output and lines in r.output and "twice.yaml" in r.output, r.output
    assert "Traceback" not in r.output


def test_a_recipe_may_override_a_key_merged_in_with_yaml_merge_keys(tmp_path):
    from posttrainllm.config.recipe import load_recipe

    recipe = tmp_path / "merge.yaml"
    recipe.write_text("trainer_args:\n  <<: {adam_beta2: 0.9, weight_decay: 0.1}\n  adam_beta2: 0.5\n")
    assert load_recipe(str(recipe)) == {"trainer_args": {"adam_beta2": 0.5, "weight_decay": 0.1}}


def test_recipe_errors_quote_only_a_short_prefix_of_a_huge_value(tmp_path):
    recipe = tmp_path / "long.yaml"
    recipe.write_text(f"lr: {'9' * 500_000}x\nllrd: [{', '.join(['0.9'] * 5_000)}]\n")
    r = runner.invoke(app, ["sft", "--recipe", str(recipe), "--model", "m/x", "--dataset", "d/x"])
    assert r.exit_code == 2 and "lr" in r.output and "llrd" in r.output, r.output[:500]
    assert len(r.output) < 1500
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000)
    r = runner.invoke(app, ["sft", "--recipe", str(big), "--model", "m/x", "--dataset", "d/x"])
    assert r.exit_code == 2 and "larger than" in r.output, r.output


# ------------------------------------------------------------------------------------------------ smaller items
def test_eval_json_is_valid_json_when_the_model_gives_nan(tiny_model_dir, corpus, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    broken = tmp_path / "broken"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(broken)
    r = runner.invoke(app, cli_args("eval", broken, text=corpus, max_length=64, json=True))
    assert r.exit_code == 0, r.output

    def no_constants(name):
        raise ValueError(f"not JSON: {name}")

    data = json.loads(r.stdout, parse_constant=no_constants)
    entry = data[corpus.name]
    assert entry["perplexity"] is None and entry["nll"] is None
    assert "NaN" in entry["not_finite"]["perplexity"] and entry["tokens"] > 0


def test_eval_json_reports_an_infinite_perplexity_as_null_with_a_reason():
    from posttrainllm.evaluate import json_ready

    out = json_ready({"a.txt": {"perplexity": float("inf"), "nll": 800.0, "tokens": 3}})
    assert json.loads(json.dumps(out, allow_nan=False)) == {
        "a.txt": {
            "perplexity": None,
            "nll": 800.0,
            "tokens": 3,
            "not_finite": {"perplexity": "infinite: exp(mean NLL) overflows"},
        }
    }


def test_a_negative_seed_is_a_usage_error(tiny_model_dir, corpus, tmp_path):
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, tmp_path / "o", "--seed", "-1"))
    assert r.exit_code == 2 and "--seed" in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_an_output_dir_that_cannot_be_created_is_exit_2_before_the_model_loads(
    tiny_model_dir, corpus, tmp_path, monkeypatch
):
    from posttrainllm import models

    def not_expected(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", not_expected)
    monkeypatch.setattr(models, "load_tokenizer", not_expected)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, a_file / "run"))
    assert r.exit_code == 2 and "cannot be created" in r.output, r.output
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, a_file / "run", "--dry-run"))
    assert r.exit_code == 2 and "cannot be created" in r.output, r.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_a_read_only_output_dir_is_exit_2(tiny_model_dir, corpus, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, ro / "run"))
        assert r.exit_code == 2, r.output
    finally:
        ro.chmod(0o755)


def test_a_second_sigterm_during_the_checkpoint_save_still_exits_143():
    from posttrainllm.rundir.signals import EXIT_SIGTERM, InterruptGuard

    with (
        pytest.raises(BaseException) as stopped,
        InterruptGuard() as guard,
    ):  # BaseException: the old code raised KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # first: finish the step, save, exit 143
        assert guard.signum == signal.SIGTERM
        time.sleep(guard.REPEAT_S + 0.1)
        os.kill(os.getpid(), signal.SIGTERM)  # second, while "saving": stop now, still 143
        time.sleep(1)
    assert isinstance(stopped.value, SystemExit) and stopped.value.code == EXIT_SIGTERM == 143


def test_sigterm_delivered_twice_at_once_is_one_request():
    """A scheduler signals every process and the launcher passes SIGTERM on too; a killed launcher's threads each
    send the parent-death signal: the copies must not abort the checkpoint that the first one asked for."""
    from posttrainllm.rundir.signals import InterruptGuard

    with InterruptGuard() as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        assert guard.signum == signal.SIGTERM


@pytest.mark.smoke
def test_a_tokenizer_without_pad_or_eos_trains(tiny_model_dir, tmp_path, alpaca_file):
    model = tmp_path / "no-eos"
    shutil.copytree(tiny_model_dir, model)
    conf = json.loads((model / "tokenizer_config.json").read_text())
    for key in ("eos_token", "pad_token", "bos_token"):
        conf.pop(key, None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    r = runner.invoke(
        app,
        run_args("sft", model, alpaca_file, tmp_path / "o", steps=1, max_length=128, lr=None),
    )
    assert r.exit_code == 0, r.output
    assert "no EOS token" in r.output


def test_an_offline_hub_id_that_is_not_cached_is_a_usage_error(corpus, tmp_path):
    r = runner.invoke(app, cli_args("finetune", "owner/name", corpus, tmp_path / "o"))
    assert r.exit_code == 2, r.output
    assert "not a local directory and the Hub is offline (HF_HUB_OFFLINE=1)" in r.output
    assert not (tmp_path / "o").exists()
    r = runner.invoke(app, ["eval", "--model", "owner/name", "--text", str(corpus)])
    assert r.exit_code == 2 and "not a local directory and the Hub is offline (HF_HUB_OFFLINE=1)" in r.output, r.output


def test_a_recipe_whose_model_is_an_earlier_recipes_output_says_which(alpaca_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/shakespeare-base does not exist here
    r = runner.invoke(app, ["sft", "--recipe", "alpaca-sft", "--dataset", str(alpaca_file)])
    assert r.exit_code == 2, r.output
    assert "Hub is offline" in r.output and "recipe shakespeare-pretrain produces" in r.output
    assert "posttrainllm pretrain --recipe shakespeare-pretrain" in r.output


def test_demo_overwrite_refuses_a_directory_holding_files_it_did_not_write(tmp_path):
    out = tmp_path / "demo"
    (out / "base").mkdir(parents=True)
    (out / "base" / "weights.bin").write_text("a previous demo")
    (out / "my-results.csv").write_text("not the demo's")
    before = snapshot(out)
    r = runner.invoke(app, ["demo", "--quick", "--overwrite", "--output-dir", str(out)])
    assert r.exit_code == 2 and "my-results.csv" in r.output, r.output
    assert snapshot(out) == before


@pytest.mark.smoke
@pytest.mark.parametrize("how", ["torch writer", "ENOSPC"])
def test_a_full_disk_during_a_checkpoint_save_says_so_and_keeps_the_last_good_one(
    how, tiny_model_dir, corpus, tmp_path, monkeypatch
):
    """The save of checkpoint-4 fails as on a full disk (torch's writer: a RuntimeError without errno, the disk
    then reports no room; or an OSError ENOSPC): exit 1 with one line, checkpoint-2 intact, no half checkpoint-4."""
    import errno
    import shutil as shutil_module

    import torch

    from posttrainllm.rundir import layout

    real_save, real_usage, failed = torch.save, shutil_module.disk_usage, []

    def save(obj, f, *a, **k):
        if "checkpoint-4" in str(f):
            Path(f).write_bytes(b"partial")
            failed.append(f)
            if how == "ENOSPC":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 512")
        return real_save(obj, f, *a, **k)

    def usage(path):
        u = real_usage(path)
        return u._replace(free=1000) if failed else u

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil_module, "disk_usage", usage)
    out = tmp_path / "o"
    r = runner.invoke(app, finetune_args(tiny_model_dir, corpus, out, "--max-steps", "4", "--save-steps", "2"))
    assert failed and r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "No space left on device while saving checkpoint-4 (needs about" in text
    assert "the last good checkpoint, checkpoint-2, is kept" in text and "inline_container" not in text
    assert layout.verify_checkpoint(out / "checkpoint-2") is None and not (out / "checkpoint-4").exists()
