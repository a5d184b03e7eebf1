"""Nothing of the user's is lost: no input of a run lies in what its --overwrite replaces (every option the table marks
as an input, for every command), `generate --output` never replaces a file unasked nor any input of the run, and a
run another tool made is neither resumed nor replaced. Every test hashes the files before and after."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.commands.registry import SPECS, options_for
from posttrainllm.config.opt import CODE, PATH

runner = CliRunner()


def snapshot(*roots: Path) -> dict:
    """Every file under the roots (hidden ones included), and every directory: bytes digest and mtime."""
    found = {}
    for root in roots:
        for p in sorted([root, *root.rglob("*")]):
            if p.is_file():
                found[str(p)] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            elif p.is_dir():
                found[str(p)] = "dir"
    return found


def _one_line(output: str) -> str:
    return " ".join(output.split())


# ------------------------------------------------------------------- 1. inputs inside the output dir that is replaced
@pytest.fixture
def previous_run(tiny_model_dir, tmp_path):
    """A finished posttrainllm run: its final model at the top, a complete checkpoint-2 (a model too), its records."""
    out = tmp_path / "prev"
    shutil.copytree(tiny_model_dir, out)
    shutil.copytree(tiny_model_dir, out / "checkpoint-2")
    model_files = sorted(p.name for p in out.iterdir() if p.is_file())
    (out / "checkpoint-2" / "COMPLETE").write_text(json.dumps({"files": {}}))
    (out / "run_config.json").write_text(json.dumps({"command": "distill", "seed": 42}))
    (out / "training_complete.json").write_text(json.dumps({"global_step": 2, "files": {}}))
    (out / ".posttrainllm").mkdir()
    (out / ".posttrainllm" / "manifest.json").write_text(json.dumps({"files": model_files}))
    return out


def _base_args(command: str, model: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Valid inputs outside the output dir, per option name (what each command needs)."""
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b", "text": "c", "chosen": "d", "rejected": "e"}) + "\n")
    args = {"model": ["--model", str(model)], "dataset": ["--dataset", str(data)]}
    if command == "distill":
        args["teacher"] = ["--teacher", str(model)]
    if command in ("grpo", "rloo"):
        args["reward_regex"] = ["--reward-regex", "x"]
    if command == "pretrain":
        del args["model"]
    return args


def _inside_value(opt, run: Path) -> list[str]:
    """A value for `opt` that lies inside the run directory: a model directory for model-like options, a file in a
    checkpoint for the others."""
    ckpt = run / "checkpoint-2"
    if opt.input == CODE:
        (ckpt / "my_reward.py").write_text("def reward(completions, **kw):\n    return [0.0] * len(completions)\n")
        return [opt.cli_flag, str(ckpt / "my_reward.py") + ":reward"]
    if opt.name in ("model", "ref_model", "teacher", "reference"):
        return [opt.cli_flag, str(run)]
    if opt.name == "recipe":
        (ckpt / "recipe.yaml").write_text("seed: 3\n")
        return [opt.cli_flag, str(ckpt / "recipe.yaml")]
    if opt.name == "model_config":
        return [opt.cli_flag, str(ckpt / "config.json")]
    target = ckpt / "inputs.jsonl"
    target.write_text(json.dumps({"prompt": "a", "completion": "b", "text": "c", "chosen": "d", "rejected": "e"}))
    extra = ["--replay-ratio", "0.5"] if opt.name == "replay_dataset" else []
    return [opt.cli_flag, str(target), *extra]


TRAINING = tuple(name for name, s in SPECS.items() if s.trains)


def input_options(command: str) -> list:
    return [o for o in options_for(command) if o.input]


CASES = [(c, o.name) for c in TRAINING for o in input_options(c)]


def test_every_training_command_has_model_and_file_inputs_in_the_table():
    names = {c: {o for cmd, o in CASES if cmd == c} for c in TRAINING}
    assert {"teacher", "model", "dataset", "ood_eval", "recipe"} <= names["distill"]
    assert {"reward_fn", "model", "dataset", "eval_dataset"} <= names["grpo"]
    assert {"ref_model", "model"} <= names["dpo"] and {"replay_dataset"} <= names["sft"]


@pytest.mark.parametrize("command, name", CASES)
@pytest.mark.parametrize("how", ["--overwrite", "--resume"])
def test_no_input_may_lie_in_the_output_dir_a_run_replaces(command, name, how, previous_run, tiny_model_dir, tmp_path):
    """`distill --teacher o/prev --output-dir o/prev --overwrite` and its kind, for every input option of every
    command: exit 2 naming the flag, before anything is moved; every byte stays."""
    opt = next(o for o in input_options(command) if o.name == name)
    args = _base_args(command, tiny_model_dir, tmp_path)
    args[name] = _inside_value(opt, previous_run)
    argv = [command, *(a for v in args.values() for a in v), "--output-dir", str(previous_run), how]
    before = snapshot(previous_run, tiny_model_dir)
    r = runner.invoke(app, argv)
    text = _one_line(r.output)
    assert r.exit_code == 2, r.output
    assert f"{opt.cli_flag} " in text and "inside --output-dir" in text, r.output
    assert snapshot(previous_run, tiny_model_dir) == before


def test_a_teacher_in_a_checkpoint_of_the_output_dir_is_refused(previous_run, tiny_model_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    before = snapshot(previous_run)
    teacher = Path(os.path.relpath(previous_run / "checkpoint-2"))  # relative, and through a link
    link = tmp_path / "teacher-link"
    link.symlink_to(teacher.resolve())
    for given in (teacher, link, f"{previous_run}/../prev/checkpoint-2/"):
        r = runner.invoke(
            app,
            cli_args("distill", tiny_model_dir, data, previous_run, teacher=given, overwrite=True),
        )  # fmt: skip
        assert r.exit_code == 2 and "--teacher" in r.output and "inside --output-dir" in _one_line(r.output), r.output
    assert snapshot(previous_run) == before


def test_a_plain_run_into_a_dry_runs_records_refuses_an_input_among_them(tiny_model_dir, tmp_path):
    """A dry run's directory is one the next plain run writes into: an input inside what it rewrites is refused."""
    out = tmp_path / "o"
    (out / "tokenizer").mkdir(parents=True)
    (out / "run_config.json").write_text(json.dumps({"command": "pretrain"}))
    (out / ".posttrainllm").mkdir()
    (out / ".posttrainllm" / "manifest.json").write_text(json.dumps({"files": ["tokenizer"]}))  # pretrain's own
    (out / "tokenizer" / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 50)
    before = snapshot(out)
    r = runner.invoke(
        app,
        ["pretrain", "--dataset", str(corpus), "--model-config", str(out / "tokenizer" / "config.json"),
         "--output-dir", str(out), "--max-steps", "1"],
    )  # fmt: skip
    assert r.exit_code == 2 and "--model-config" in r.output and "inside --output-dir" in _one_line(r.output), r.output
    assert snapshot(out) == before


def test_an_input_outside_the_replaced_entries_does_not_stop_a_resume(previous_run):
    """On --resume only what a resumed run may rewrite counts (the directory itself, checkpoints, its files): a
    file of the user's next to the run is left alone, so reading it is fine."""
    from posttrainllm.rundir.outdir import _inputs_inside

    (previous_run / "notes").mkdir()
    (previous_run / "notes" / "data.jsonl").write_text("{}\n")

    class Cfg:
        command, resume = "sft", True
        model, dataset, output_dir = str(previous_run / "checkpoint-2"), str(previous_run / "notes" / "data.jsonl"), ""

    found = _inputs_inside(Cfg, previous_run, only_ours=True)
    assert found == [f"--model {previous_run / 'checkpoint-2'}"]
    assert len(_inputs_inside(Cfg, previous_run)) == 2


# ------------------------------------------------------------------------------------ 2. generate --output FILE
@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir, d)
    return d


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "hello world", "id": 7, "keep": "these fields"}) + "\n")
    return p


def _generate(model, prompts, output, *extra):
    return runner.invoke(
        app,
        cli_args("generate", model, None, None, *extra, prompts=prompts, output=output, max_new_tokens=2),
    )  # fmt: skip


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_generate_never_writes_over_its_prompts(model_copy, prompts, tmp_path, overwrite, monkeypatch):
    link = tmp_path / "alias.jsonl"
    link.symlink_to(prompts)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    for output in (prompts, "./p.jsonl", "p.jsonl", link):
        r = _generate(model_copy, "p.jsonl", output, *overwrite)
        assert r.exit_code == 2 and "--prompts p.jsonl, which this run reads" in _one_line(r.output), r.output
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "new.jsonl", "sub/x.jsonl"])
def test_generate_never_writes_into_the_model_it_uses(model_copy, prompts, name):
    before = snapshot(model_copy, prompts.parent)
    (model_copy / "sub").mkdir(exist_ok=True)
    before = snapshot(model_copy, prompts.parent)
    r = _generate(model_copy, prompts, model_copy / name, "--overwrite")
    assert r.exit_code == 2 and f"is inside --model {model_copy}" in _one_line(r.output), r.output
    assert snapshot(model_copy, prompts.parent) == before


def test_generate_never_writes_into_the_directory_a_hub_id_or_gguf_file_resolves_to(
    model_copy, prompts, tmp_path, monkeypatch
):
    """A GGUF file is converted into a cached directory, a hub id read from the hub's cache: --output may not point
    there either, and the check comes before the model loads."""
    from posttrainllm import models

    monkeypatch.setattr(models, "resolve_model", lambda ref, *a, **k: (str(model_copy), None))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    before = snapshot(model_copy, prompts.parent)
    r = _generate(gguf, prompts, model_copy / "generation_config.json", "--overwrite")
    assert r.exit_code == 2 and f"is inside --model {gguf}" in _one_line(r.output), r.output
    assert snapshot(model_copy, prompts.parent) == before


def test_generate_refuses_an_existing_output_unless_overwrite_and_then_replaces_it_whole(model_copy, prompts, tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text("my earlier results\n")
    out.chmod(0o640)
    before = snapshot(tmp_path)
    r = _generate(model_copy, prompts, out)
    assert r.exit_code == 2 and "already exists: pass --overwrite" in _one_line(r.output), r.output
    assert snapshot(tmp_path) == before
    inode = out.stat().st_ino
    r = _generate(model_copy, prompts, out, "--overwrite")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == ["hello world"]
    assert out.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten in place
    assert out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model", "p.jsonl", "results.jsonl"])


@pytest.mark.parametrize(
    "output, says",
    [("nodir/x.jsonl", "does not exist"), (".", "is a directory"), ("/dev/null", "not a regular file")],
)
def test_a_bad_output_exits_2_before_the_model_loads(model_copy, prompts, tmp_path, monkeypatch, output, says):
    from posttrainllm import models

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before --output was checked")

    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.chdir(tmp_path)
    r = _generate(model_copy, prompts, output, "--overwrite")
    assert r.exit_code == 2 and says in r.output, r.output
    assert not (tmp_path / "nodir").exists()


def test_an_output_that_appears_while_generating_is_kept(tmp_path):
    from posttrainllm.commands.generate import write_output
    from posttrainllm.errors import UsageError

    out = tmp_path / "late.jsonl"
    out.write_text("theirs")
    with pytest.raises(UsageError, match="appeared while generating"):
        write_output(str(out), "ours\n", overwrite=False)
    assert out.read_text() == "theirs" and [p.name for p in tmp_path.iterdir()] == ["late.jsonl"]


# --------------------------------------------------------------------------- 3. a run posttrainllm did not make
@pytest.fixture
def their_run(tmp_path):
    """What a transformers Trainer leaves: checkpoint-500/, checkpoint-1000/ and trainer_state.json, nothing of ours."""
    out = tmp_path / "hf-run"
    for step in (500, 1000):
        ck = out / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        (ck / "model.safetensors").write_bytes(os.urandom(256))
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        (ck / "optimizer.pt").write_bytes(os.urandom(128))
    (out / "trainer_state.json").write_text(json.dumps({"global_step": 1000, "log_history": []}))
    return out


@pytest.mark.parametrize("how", [["--overwrite"], ["--resume"], []])
def test_a_run_another_tool_made_is_neither_replaced_nor_resumed(their_run, tiny_model_dir, tmp_path, how):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 50)
    before = snapshot(their_run)
    r = runner.invoke(
        app,
        run_args("finetune", tiny_model_dir, corpus, their_run, *how, steps=1, max_length=16, lr=None),
    )  # fmt: skip
    text = _one_line(r.output)
    assert r.exit_code == 2, r.output
    assert "a run posttrainllm did not make" in text and "choose another --output-dir" in text, r.output
    assert f"--model {their_run / 'checkpoint-1000'}" in text  # how to go on from it
    assert "--resume to continue" not in text
    assert len([line for line in r.output.splitlines() if line.strip()]) <= 3  # one message (wrapped at most)
    assert snapshot(their_run) == before
    assert not (their_run / ".posttrainllm").exists()


def test_an_empty_hidden_folder_does_not_make_another_tools_run_ours(their_run, tiny_model_dir, tmp_path):
    (their_run / ".posttrainllm").mkdir()
    (their_run / ".posttrainllm" / "lock").write_text("{}")  # what a killed attempt could leave
    before = snapshot(their_run)
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world\n" * 50)
    r = runner.invoke(
        app,
        run_args("finetune", tiny_model_dir, corpus, their_run, steps=1, max_length=16, lr=None, overwrite=True),
    )  # fmt: skip
    assert r.exit_code == 2 and "a run posttrainllm did not make" in _one_line(r.output), r.output
    assert snapshot(their_run) == before


def test_a_finished_posttrainllm_run_is_still_posttrainllms(previous_run):
    from posttrainllm.rundir.outdir import another_tools_run, foreign, made_by_posttrainllm

    assert made_by_posttrainllm(previous_run) and foreign(previous_run) == [] and another_tools_run(previous_run) == []
    shutil.rmtree(previous_run / ".posttrainllm")  # an interrupted run keeps no hidden folder: its record says it
    assert made_by_posttrainllm(previous_run)
    (previous_run / "run_config.json").write_text(json.dumps({"learning_rate": 1}))  # another tool's record
    assert not made_by_posttrainllm(previous_run)
    assert "checkpoint-2" in another_tools_run(previous_run) and "run_config.json" in foreign(previous_run)


# ------------------------------------------------------------------- every path input: a FIFO is refused unopened
FIFO_CASES = [(c, o.name) for c in (*TRAINING, "eval", "generate") for o in input_options(c) if o.input == PATH]


@pytest.mark.parametrize("command, name", FIFO_CASES)
def test_every_path_input_refuses_a_fifo_before_opening_it(command, name, tiny_model_dir, tmp_path):
    import signal

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    opt = next(o for o in input_options(command) if o.name == name)
    if command == "eval":
        args = {"model": ["--model", str(tiny_model_dir)], "text": ["--text", str(tmp_path / "t.txt")]}
        (tmp_path / "t.txt").write_text("hello\n")
    elif command == "generate":
        args = {"model": ["--model", str(tiny_model_dir)], "prompts": ["--prompts", str(tmp_path / "p.txt")]}
        (tmp_path / "p.txt").write_text("hello\n")
    else:
        args = _base_args(command, tiny_model_dir, tmp_path)
    args[name] = [opt.cli_flag, str(fifo)] + (["--replay-ratio", "0.5"] if name == "replay_dataset" else [])
    argv = [command, *(a for v in args.values() for a in v)]
    if command in TRAINING:
        argv += ["--output-dir", str(tmp_path / "o")]
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"{opt.cli_flag} FIFO was opened (blocked)"))
    signal.alarm(60)
    try:
        r = runner.invoke(app, argv)
    finally:
        signal.alarm(0)
    text = _one_line(r.output)
    named = f"{opt.cli_flag} {fifo}" in text or f"{opt.name} {fifo}" in text  # the recipe says "recipe PATH"
    assert r.exit_code == 2 and named and f"{fifo} is a FIFO" in text, r.output
    assert not (tmp_path / "o").exists()
