"""`posttrainllm kto`: unpaired preference data (prompt, completion, label) detected, converted and counted; bad
labels and data of another command are clear errors; a tiny model trains with the per-block LRs of the formula in the
optimizer's groups and in the weights' first step, and the reference model stays out of the optimizer."""

from __future__ import annotations

import json

import pytest
from conftest import check_optimizer_groups, write_jsonl
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm import data as D
from posttrainllm.cli import app
from posttrainllm.errors import DataError

runner = CliRunner()


def _rows(n=16):
    return [
        {"prompt": f"Say {i}.", "completion": f"{i}" if i % 2 == 0 else f"no {i + 3} maybe", "label": i % 2 == 0}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def tok():
    from data_samples import make_tokenizer

    return make_tokenizer()


# ---------------------------------------------------------------------------------------------------------- data
def test_unpaired_rows_are_detected_converted_and_counted(tmp_path, tok):
    rows = _rows(8)
    rows[1]["label"], rows[2]["label"], rows[4]["label"] = "false", 1, "True"  # CSV-style and 0/1 labels
    rows[3]["completion"] = "  "  # degenerate: nothing to learn from
    rows[5]["label"] = None  # degenerate: no label
    prep = D.prepare_kto(str(write_jsonl(tmp_path / "k.jsonl", rows)), tok)
    assert prep.format == "unpaired" and prep.n_train == 6
    assert prep.dropped == {"empty completion": 1, "null label": 1}
    got = {r["prompt"]: r["label"] for r in prep.train}
    assert got == {"Say 0.": True, "Say 1.": False, "Say 2.": True, "Say 4.": True, "Say 6.": True, "Say 7.": False}
    assert prep.desirable == 4
    line = D.describe(prep)
    assert "unpaired → prompt/completion/label" in line and "(4 desirable, 2 undesirable)" in line
    assert "dropped 2 degenerate rows (1 empty completion, 1 no label)" in line


def test_conversational_unpaired_rows_keep_their_messages(tmp_path, tok):
    rows = [
        {"prompt": [{"role": "user", "content": f"Say {i}."}], "completion": f"{i}", "label": i % 2 == 0}
        for i in range(4)
    ]
    prep = D.prepare_kto(str(write_jsonl(tmp_path / "k.jsonl", rows)), tok)
    row = prep.train[0]
    assert prep.conversational and row["completion"][0]["role"] == "assistant"
    assert isinstance(row["label"], bool)


@pytest.mark.parametrize("label", ["yes", 2, [True], {"x": 1}])
def test_a_label_that_is_not_true_or_false_names_the_record(tmp_path, tok, label):
    rows = _rows(4)
    rows[2]["label"] = label
    with pytest.raises(DataError, match=r"record 3: 'label' must be true \(desirable\) or false"):
        D.prepare_kto(str(write_jsonl(tmp_path / "k.jsonl", rows)), tok)


def test_data_of_the_other_preference_command_is_named(tmp_path, tok, preference_file, unpaired_file):
    with pytest.raises(DataError, match="looks like preference data .*Use the dpo command"):
        D.prepare_kto(str(preference_file), tok)
    with pytest.raises(DataError, match="looks like unpaired preference data .*Use the kto command"):
        D.prepare_dpo(str(unpaired_file), tok)


def test_one_label_for_every_row_is_a_warning(tmp_path, tok):
    rows = [{**r, "label": True} for r in _rows(6)]
    prep = D.prepare_kto(str(write_jsonl(tmp_path / "k.jsonl", rows)), tok)
    assert "every training row of k.jsonl has label true (desirable)" in D.label_note(prep)
    rows = [{**r, "label": False} for r in _rows(6)]
    assert "label false (undesirable)" in D.label_note(D.prepare_kto(str(write_jsonl(tmp_path / "u.jsonl", rows)), tok))
    assert D.label_note(D.prepare_kto(str(write_jsonl(tmp_path / "m.jsonl", _rows(6))), tok)) is None


# ---------------------------------------------------------------------------------------------------------- CLI
def test_batch_size_one_exits_2(unpaired_file):
    r = runner.invoke(app, cli_args("kto", "org/m", unpaired_file, batch_size=1))
    assert r.exit_code == 2 and "kto needs --batch-size 2 or more" in r.output


def test_all_true_labels_are_warned_in_the_banner(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "k.jsonl", [{**r, "label": True} for r in _rows(8)])
    args = cli_args("kto", tiny_model_dir, data, tmp_path / "o")
    r = runner.invoke(app, [*args, "--dry-run", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "has label true (desirable)" in " ".join(r.output.split())


@pytest.mark.smoke
def test_optimizer_groups_follow_the_formula_and_hold_no_reference(tiny_model_dir, unpaired_file, tmp_path):
    """The KTOTrainer posttrainllm builds: group LR = base × γ^(N-1-i) per block, embeddings at block 0's, head at
    the base; every trainable weight in exactly one group and none of the reference model's."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.commands.registry import spec_of, to_config
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer

    torch.set_num_threads(1)
    cfg = to_config(
        "kto",
        ["--model", str(tiny_model_dir), "--dataset", str(unpaired_file), "--output-dir", str(tmp_path / "o")]
        + ["--llrd", "0.5", "--lr", "1e-3", "--batch-size", "4", "--max-length", "64"],
    )
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ref = copy.deepcopy(model).requires_grad_(False)
    prep = D.prepare_kto(str(unpaired_file), tok)
    trainer = build_trainer(
        spec_of("kto"), cfg, model=model, tokenizer=tok, train=prep.train, eval_ds=None, precision="fp32",
        plan=plan_param_groups(cfg, model), ref_model=ref,
    )  # fmt: skip
    check_optimizer_groups(trainer.create_optimizer(), trainer.model, 1e-3, 0.5, not_in=[trainer.ref_model])


@pytest.mark.smoke
def test_kto_first_step_moves_each_block_by_its_lr(tiny_model_dir, unpaired_file, tmp_path):
    """Adam's first step moves each element with a gradient by about its group's LR: max|ΔW| per block = its LR."""
    from safetensors.torch import load_file
    from test_smoke import block_change

    out = tmp_path / "o"
    args = cli_args("kto", tiny_model_dir, unpaired_file, out)
    r = runner.invoke(app, [*args, "--llrd", "0.5", "--lr", "1e-3", "--max-steps", "1", "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    assert "KTO" in r.output and "(16 desirable, 16 undesirable)" in " ".join(r.output.split())
    before, after = load_file(str(tiny_model_dir / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for i in range(4):
        assert block_change(before, after, i, "max") == pytest.approx(1e-3 * 0.5 ** (3 - i), rel=0.02)
    assert block_change(before, after, "lm_head", "max") == pytest.approx(1e-3, rel=0.02)
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["command"] == "kto" and saved["beta"] == 0.1
    groups = {g["name"]: g["lr"] for g in json.loads((out / "param_groups.json").read_text())}
    assert groups["block_0"] == pytest.approx(1.25e-4)
    assert (out / "training_complete.json").is_file()
