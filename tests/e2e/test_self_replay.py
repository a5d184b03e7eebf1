"""--self-replay N: samples of the starting model, mixed in through the replay path (data/self_replay.py)."""

from __future__ import annotations

import json

import pytest
from conftest import build_tiny_model, build_tokenizer
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.data import self_replay as SR
from posttrainllm.rundir.layout import RUN_CONFIG, SELF_REPLAY, SELF_REPLAY_SETTINGS

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny():
    import torch

    torch.manual_seed(3)
    tok = build_tokenizer()
    return build_tiny_model(tok).eval(), tok


def _bare_generate(model, tok, prompt, n, batch, max_new, seed):
    """The model's own generate at the seed, batch after batch: the reference the samples must equal."""
    import torch

    torch.manual_seed(seed)
    texts = []
    while len(texts) < n:
        b = min(batch, n - len(texts))
        ids = torch.tensor([prompt] * b)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=max_new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
        for row in out[:, len(prompt) :].tolist():
            cut = row.index(tok.eos_token_id) if tok.eos_token_id in row else len(row)
            texts.append(tok.decode(row[:cut], skip_special_tokens=True))
    return texts


@pytest.mark.parametrize("n,batch", [(5, 2), (3, 8)])
def test_samples_equal_the_models_own_generate_at_the_seed(tiny, n, batch):
    model, tok = tiny
    prompt = SR.prompt_ids(tok, chat=False)
    texts, lengths = SR.draw(model, tok, prompt, n=n, max_length=24, seed=7, batch_size=batch)
    assert texts == _bare_generate(model, tok, prompt, n, batch, 23, seed=7)
    assert len(texts) == n and all(0 <= k <= 23 for k in lengths) and max(lengths) > 0
    assert SR.draw(model, tok, prompt, n=n, max_length=24, seed=8, batch_size=batch)[0] != texts


def test_sampling_is_at_temperature_one_whatever_the_generation_config_says(tiny):
    """The scores sampled from are the raw logits: no top-k, top-p, temperature or repetition penalty of the
    model's generation_config is applied."""
    import torch

    model, tok = tiny
    model.generation_config.update(top_k=3, top_p=0.5, temperature=0.2, repetition_penalty=1.5, do_sample=True)
    try:
        kwargs = SR.generate_kwargs(tok, 6)
        out = model.generate(
            torch.tensor([[tok.bos_token_id]] * 2), output_scores=True, output_logits=True,
            return_dict_in_generate=True, **kwargs,
        )  # fmt: skip
    finally:
        model.generation_config.update(top_k=50, top_p=1.0, temperature=1.0, repetition_penalty=1.0, do_sample=False)
    assert len(out.scores) >= 1
    for scores, logits in zip(out.scores, out.logits):
        torch.testing.assert_close(scores, logits.float(), rtol=0, atol=0)


def test_sampling_leaves_the_runs_random_state_as_it_was(tiny):
    import torch

    model, tok = tiny
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    SR.draw(model, tok, SR.prompt_ids(tok, chat=False), n=2, max_length=8, seed=1, batch_size=2)
    assert torch.equal(torch.rand(3), expected)


def test_the_prompt_is_bos_or_the_empty_user_turn_of_the_chat_template(tiny):
    from posttrainllm.data import ensure_chat_template

    _, tok = tiny
    assert SR.prompt_ids(tok, chat=False) == [tok.bos_token_id]
    chat_tok = build_tokenizer()
    ensure_chat_template(chat_tok)
    expected = chat_tok.apply_chat_template(
        [{"role": "user", "content": ""}], tokenize=False, add_generation_prompt=True
    )
    assert chat_tok.decode(SR.prompt_ids(chat_tok, chat=True)) == expected


def test_progress_lines_count_samples_and_rate():
    lines = []
    p = SR.Progress(lines.append, every=10.0)
    for done, t in [(4, 2.0), (8, 4.0), (12, 12.0), (16, 16.0)]:
        p(done, 16, t)
    assert lines == [
        "self-replay: 12/16 samples, 1.00 samples/s, 12 s",
        "self-replay: 16/16 samples, 1.00 samples/s, 16 s",
    ]


# ------------------------------------------------------------------------------------------------------- the CLI
@pytest.fixture(scope="module")
def alpaca(tmp_path_factory):
    p = tmp_path_factory.mktemp("sr-data") / "alpaca.json"
    rows = [{"instruction": f"Add {i} and {i + 1}.", "input": "", "output": f"It is {2 * i + 1}."} for i in range(24)]
    p.write_text(json.dumps(rows))
    return p


def _args(command, model, data, out, *extra):
    return run_args(
        command,
        model,
        data,
        out,
        *extra,
        steps=1,
        batch=4,
        grad_accum=4,  # 1 step × 4 × 4 × 0.5 = 8 replay rows: room for the 7 samples of the tests
        max_length=48,
        lr=None,
        save_steps=1,
        replay_ratio="0.5",
        self_replay_batch_size=3,
    )


def _texts(out):
    return [json.loads(line)["text"] for line in (out / SELF_REPLAY).read_text().splitlines()]


@pytest.mark.smoke
def test_same_seed_same_file_drawn_from_the_starting_model(tiny_model_dir, alpaca, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    outs = [tmp_path / n for n in ("a", "b", "c")]
    for out, seed in zip(outs, ("5", "5", "6")):
        r = runner.invoke(app, _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "7", "--seed", seed))
        assert r.exit_code == 0, r.output
        assert "self-replay: 7/7 samples" in r.output
    a, b, c = ((o / SELF_REPLAY).read_bytes() for o in outs)
    assert a == b and a != c
    settings = json.loads((outs[0] / SELF_REPLAY_SETTINGS).read_text())
    assert {k: settings[k] for k in ("n", "temperature", "max_length", "seed", "batch_size", "prompt")} == {
        "n": 7, "temperature": 1.0, "max_length": 48, "seed": 5, "batch_size": 3, "prompt": "bos",
    }  # fmt: skip
    assert json.loads((outs[0] / RUN_CONFIG).read_text())[SR.RECORD]["sha256"] == settings["sha256"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert _texts(outs[0]) == _bare_generate(model, tok, [tok.bos_token_id], 7, 3, 47, seed=5)


@pytest.mark.smoke
def test_resume_reuses_the_file_and_refuses_a_changed_n(tiny_model_dir, alpaca, tmp_path, monkeypatch):
    out = tmp_path / "run"
    r = runner.invoke(app, _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "4"))
    assert r.exit_code == 0, r.output
    before = (out / SELF_REPLAY).read_bytes()

    def no_sampling(*a, **k):
        raise AssertionError("a resumed run samples again")

    monkeypatch.setattr(SR, "draw", no_sampling)
    resume = _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "4", "--resume")
    resume[resume.index("--max-steps") + 1] = "2"
    r = runner.invoke(app, resume)
    assert r.exit_code == 0, r.output
    assert (out / SELF_REPLAY).read_bytes() == before
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    for extra in ([], ["--allow-config-change"]):
        changed = [*resume, "--self-replay", "5", *extra]
        changed[changed.index("--max-steps") + 1] = "3"
        r = runner.invoke(app, changed)
        assert r.exit_code == 2, r.output
        assert "self_replay" in r.output or "--self-replay 4" in r.output
    (out / SELF_REPLAY).write_bytes(before + b'{"text": "edited"}\n')
    r = runner.invoke(app, [*resume[:-1], "--resume", "--max-steps", "3"])
    assert r.exit_code == 2 and "changed since it was written" in r.output


@pytest.mark.smoke
def test_finetune_mixes_sample_blocks_into_its_token_blocks(tiny_model_dir, tmp_path):
    from conftest import CORPUS

    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(CORPUS * 10))
    out = tmp_path / "ft"
    args = _args("finetune", tiny_model_dir, text, out, "--self-replay", "6")
    args[args.index("--max-length") + 1] = "16"
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len(_texts(out)) == 6
    config = json.loads((out / RUN_CONFIG).read_text())
    assert config[SR.RECORD]["samples"] == 6 and config[SR.RECORD]["prompt"] == "bos"


@pytest.mark.parametrize(
    "command,extra,needle",
    [
        ("sft", ["--self-replay", "-1"], "--self-replay must be an integer >= 0"),
        ("finetune", ["--self-replay", "-3"], "--self-replay must be an integer >= 0"),
        ("sft", ["--self-replay", "4", "--replay-ratio", "0"], "--self-replay needs --replay-ratio > 0"),
        ("sft", ["--self-replay", "4", "--replay-dataset", "{data}"], "pick one"),
        ("dpo", ["--self-replay", "4"], "--self-replay is for sft and finetune"),
        ("kto", ["--self-replay", "4"], "--self-replay is for sft and finetune"),
        ("sft", ["--self-replay", "2", "--self-replay-batch-size", "0"], "--self-replay-batch-size"),
    ],
)
def test_bad_self_replay_settings_exit_2_before_a_model_loads(
    command, extra, needle, tiny_model_dir, alpaca, tmp_path, monkeypatch
):
    from posttrainllm import models

    def no_load(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.setattr(models, "load_tokenizer", no_load)
    args = cli_args(command, tiny_model_dir, alpaca, tmp_path / "o")
    if command in ("sft", "finetune"):
        args += ["--replay-ratio", "0.2"]
    args += [str(alpaca) if e == "{data}" else e for e in extra]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.smoke
def test_a_new_run_reuses_samples_of_the_same_settings_and_draws_for_others(tiny_model_dir, alpaca, tmp_path):
    out = tmp_path / "run"
    r = runner.invoke(app, _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "3"))
    assert r.exit_code == 0, r.output
    first = (out / SELF_REPLAY).read_bytes()
    r = runner.invoke(app, _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "3", "--overwrite"))
    assert r.exit_code == 0, r.output
    assert "self-replay: sampling" not in r.output  # the progress lines are plain lines, outside the banner
    assert (out / SELF_REPLAY).read_bytes() == first
    other_seed = _args("sft", tiny_model_dir, alpaca, out, "--self-replay", "3", "--overwrite", "--seed", "9")
    r = runner.invoke(app, other_seed)
    assert r.exit_code == 0, r.output
    assert "self-replay: 3/3 samples" in r.output and (out / SELF_REPLAY).read_bytes() != first
    assert json.loads((out / SELF_REPLAY_SETTINGS).read_text())["seed"] == 9


def test_samples_left_by_a_failed_start_are_pre_training_records(tmp_path):
    from posttrainllm.rundir import outdir

    for name in ("param_groups.json", SELF_REPLAY, SELF_REPLAY_SETTINGS):
        (tmp_path / name).write_text("{}")
    (tmp_path / RUN_CONFIG).write_text(json.dumps({"command": "sft"}))  # what a start writes: a run of posttrainllm's
    assert outdir.only_pre_training_records(tmp_path) and outdir.foreign(tmp_path) == []
    (tmp_path / "notes.txt").write_text("the user's")
    assert not outdir.only_pre_training_records(tmp_path) and outdir.foreign(tmp_path) == ["notes.txt"]


def test_the_file_reads_back_as_written_whatever_the_texts_hold(tmp_path):
    texts = ["a\u2028b", "c\x85d\u2029", "line\nbreak", "", "\ufffd bytes"]
    SR.SelfReplay(texts, {"n": len(texts)}).write(tmp_path)
    saved, back, problem = SR._saved(tmp_path)
    assert problem is None and back == texts and saved["sha256"] == SR.SelfReplay(texts, {}).record()["sha256"]


def test_a_prompt_longer_than_max_length_exits_2_before_the_model_loads(tiny, tmp_path):
    from types import SimpleNamespace

    from posttrainllm.data import ensure_chat_template
    from posttrainllm.errors import UsageError

    chat_tok = build_tokenizer()
    ensure_chat_template(chat_tok)
    n_prompt = len(SR.prompt_ids(chat_tok, chat=True))
    cfg = SimpleNamespace(output_dir=str(tmp_path), resume=False, model="m", self_replay=2, max_length=n_prompt,
                          seed=0, self_replay_batch_size=2)  # fmt: skip

    def no_load():
        raise AssertionError("a model loaded")

    with pytest.raises(UsageError, match=f"the prompt is {n_prompt} tokens"):
        SR.obtain(cfg, chat_tok, chat=True, model_identity=None, load_model=no_load)


# ---------------------------------------------------------------------------- no more samples than the run trains on
def _no_model_load(monkeypatch):
    from posttrainllm import models

    def no_load(*a, **k):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(models, "load_model", no_load)


@pytest.mark.parametrize(
    "command,most",
    [("sft", 4), ("finetune", 4 * 64)],  # 2 steps × 8 × 1 × 0.25 = 4 replay rows; a block holds <= 64 samples
)
def test_more_samples_than_the_steps_train_on_exit_2_naming_the_usable_maximum(
    command, most, tiny_model_dir, alpaca, tmp_path, monkeypatch
):
    _no_model_load(monkeypatch)
    out = tmp_path / "o"
    args = run_args(command, tiny_model_dir, alpaca, out, "--self-replay", "1000000000", steps=2, batch=8,
                    replay_ratio="0.25")  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if "--self-replay 1000000000" in line]
    assert len(lines) == 1 and f"at most {most} samples" in lines[0] and f"--self-replay {most} or fewer" in lines[0]
    assert "--max-steps 2 × --batch-size 8 × --grad-accum 1 × --replay-ratio 0.25" in lines[0]
    assert not out.exists()


def test_the_usable_maximum_itself_is_accepted(alpaca, tmp_path):
    from posttrainllm.commands.registry import to_config
    from posttrainllm.errors import ConfigErrors

    base = ["--model", "m", "--dataset", str(alpaca), "--output-dir", str(tmp_path / "o")]
    base += [
        "--max-steps",
        "3",
        "--batch-size",
        "2",
        "--grad-accum",
        "2",
        "--replay-ratio",
        "0.1",
    ]  # 3 × 2 × 2 × 0.1 = 1.2: 2 replay rows
    assert to_config("sft", [*base, "--self-replay", "2"]).self_replay == 2
    with pytest.raises(ConfigErrors) as e:
        to_config("sft", [*base, "--self-replay", "3"])
    assert any("at most 2 samples" in p for p in e.value.problems)


def test_under_epochs_the_training_rows_bound_the_samples_before_the_model_loads(
    tiny_model_dir, alpaca, tmp_path, monkeypatch
):
    _no_model_load(monkeypatch)
    out = tmp_path / "o"
    args = run_args("sft", tiny_model_dir, alpaca, out, "--self-replay", "9", steps=None, replay_ratio="0.25")
    r = runner.invoke(app, args)  # 24 rows at 0.25: 8 replay rows, the same ones each epoch
    assert r.exit_code == 2, r.output
    assert "--self-replay 9: this run trains on at most 8 samples (24 training rows" in " ".join(r.output.split())


def test_a_sweep_refuses_more_samples_than_its_cells_train_on():
    from posttrainllm.errors import ConfigErrors
    from posttrainllm.sweep import parse

    base = ["--model", "m", "--dataset", "d.jsonl", "--eval-split", "0.2", "--ood-eval", "o.txt", "--lr", "1e-4"]
    base += ["--max-steps", "2", "--batch-size", "8", "--replay-ratio", "0.25"]
    with pytest.raises(ConfigErrors) as e:
        parse("sft", [*base, "--self-replay", "0,1000000000"])
    assert any("--self-replay 1000000000" in p and "at most 4 samples" in p for p in e.value.problems)


def test_a_tokenizer_without_bos_or_eos_samples_after_the_eos_sft_adds(alpaca, tmp_path):
    """sft gives such a tokenizer a new <|endoftext|> EOS (a new embedding row): the sampling model gets that row
    too, as the model to train does, so the samples start from it instead of failing on an index past the
    embeddings."""
    import torch

    torch.manual_seed(0)
    tok = build_tokenizer(specials=["<|pad|>"], pad_token="<|pad|>")
    assert tok.bos_token is None and tok.eos_token is None
    model_dir = tmp_path / "no-bos-eos"
    build_tiny_model(tok).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "run"
    r = runner.invoke(app, _args("sft", model_dir, alpaca, out, "--self-replay", "2"))
    assert r.exit_code == 0, r.output
    assert len(_texts(out)) == 2
    settings = json.loads((out / SELF_REPLAY_SETTINGS).read_text())
    assert settings["prompt_ids"] == [len(tok)]  # the new EOS: the row past the model's embeddings
