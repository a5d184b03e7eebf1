"""SIGTERM, then --resume, reproduces the uninterrupted run's losses for the preference, reward-model, online-RL and
distillation commands (kto, reward, grpo, rloo, distill, sdft): the same steps, the same losses (and rewards) from the
resumed checkpoint on, across an epoch boundary, and the per-block LR groups of the plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REWARD = """
def low_ids(completions, completion_ids, **kwargs):
    return [sum(i < 64 for i in ids) / max(1, len(ids)) for ids in completion_ids]
"""


def _command(kind, model_dir, data, out, reward, *extra, teacher=None):
    base = [sys.executable, "-m", "posttrainllm", kind, "--model", str(model_dir), "--dataset", str(data)]
    base += ["--output-dir", str(out), "--max-steps", "8", "--save-steps", "3", "--logging-steps", "1"]
    base += ["--lr", "1e-3", "--llrd", "0.8", "--seed", "7"]
    if kind in ("kto", "reward"):
        base += ["--batch-size", "4", "--max-length", "64"]
    elif kind == "distill":
        base += ["--batch-size", "4", "--teacher", str(teacher), "--max-completion-length", "8"]
    elif kind == "sdft":  # its moving-average teacher at the checkpoint's step is what the resumed run must go on from
        base += ["--batch-size", "4", "--max-completion-length", "8", "--teacher-update-rate", "0.5"]
    else:
        base += ["--batch-size", "8", "--reward-fn", f"{reward}:low_ids", "--max-completion-length", "8"]
        base += ["--num-generations", "2"]  # 16 prompts × 2 / 8 = 4 steps per epoch: the run crosses into epoch 2
    return base + list(extra)


def _logged(out: Path, key: str) -> dict[int, float]:
    state = json.loads((out / "trainer_state.json").read_text())
    return {h["step"]: h[key] for h in state["log_history"] if key in h}


@pytest.mark.smoke
# One command per mechanism, for CI's time: preference pairs (kto; reward and dpo resume the same way), sampling with
# rewards (grpo; rloo shares its sampler and mixins) and sampling with a teacher that trains along (sdft: its moving
# teacher is part of the checkpoint). reward and rloo passed this same test when it was written (2026-12-02), distill
# (sampling with a frozen teacher: grpo's sampler and mixins) on 2026-12-04; put them back in the list to check them.
@pytest.mark.parametrize("kind", ["kto", "grpo", "sdft"])
def test_sigterm_then_resume_reproduces_the_losses(
    kind, tiny_model_dir, teacher_model_dir, unpaired_file, preference_file, prompts_file, alpaca_file, tmp_path
):
    reward = tmp_path / "toy_reward.py"
    reward.write_text(REWARD)
    data = {"kto": unpaired_file, "reward": preference_file, "sdft": alpaca_file}.get(kind, prompts_file)
    teacher = teacher_model_dir
    env = dict(os.environ)
    ref = tmp_path / "ref"
    done = subprocess.run(
        _command(kind, tiny_model_dir, data, ref, reward, teacher=teacher), capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    out = tmp_path / "run"
    argv = _command(kind, tiny_model_dir, data, out, reward, teacher=teacher)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    deadline = time.time() + 300
    while not (out / "checkpoint-3" / "COMPLETE").exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.time() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, output[-3000:]
    assert not (out / "training_complete.json").exists()
    saved = sorted(int(d.name.split("-")[1]) for d in out.glob("checkpoint-*") if (d / "COMPLETE").exists())
    assert saved and saved[-1] < 8

    resumed = subprocess.run(
        _command(kind, tiny_model_dir, data, out, reward, "--resume", teacher=teacher),
        capture_output=True,
        text=True,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    # GRPO's loss is near 0 by construction (advantages are centred): its rewards, which depend on what the resumed
    # model samples with the restored RNG, are compared too
    tolerance = {"abs": 1e-5}
    for key in ("loss", "reward") if kind in ("grpo", "rloo") else ("loss",):
        want, got = _logged(ref, key), _logged(out, key)
        assert max(got) == 8
        for step in range(saved[-1] + 1, 9):
            assert got[step] == pytest.approx(want[step], **tolerance), (key, step, got, want)
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    assert groups["block_0"] == pytest.approx(1e-3 * 0.8**3)
