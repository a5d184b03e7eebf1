"""`sft` trains padding-free at its defaults where that is exact, with the padded run's first-step loss (the
completion-only and the assistant-only masks, llama-, qwen2-, mistral- and gemma3-style models), says so in the
banner and run_config.json; `--no-padding-free` pads; a model it cannot verify stays padded and the banner says why."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_tiny_model, build_tokenizer
from data_samples import write_jsonl
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

SLIDING = {"sliding_window": 4}  # shorter than the rows: the sliding-window layers' masks matter
FAMILIES = {
    "llama": {},
    "qwen2": {},
    "mistral": SLIDING,
    "gemma3_text": {**SLIDING, "layer_types": ["sliding_attention", "full_attention"] * 2},
}
PROMPT_COMPLETION = [
    {"prompt": f"Add {i} and {i + 1}.", "completion": f" {2 * i + 1}." * (1 + i % 3)} for i in range(8)
]
MESSAGES = [
    {
        "messages": [
            {"role": "user", "content": f"Double {i}." + " Please." * (i % 3)},
            {"role": "assistant", "content": f"{2 * i}" + " done" * (i % 2)},
        ]
    }
    for i in range(8)
]


@pytest.fixture
def first_steps(monkeypatch):
    """The first compute_loss of each trainer in the test: its loss, the token count it is divided by, its inputs."""
    from trl import SFTTrainer

    seen: list[dict] = []
    original = SFTTrainer.compute_loss

    def spy(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = original(self, model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        if not any(s["trainer"] is self for s in seen):
            loss = out[0] if return_outputs else out
            seen.append(dict(trainer=self, loss=float(loss), n=int(num_items_in_batch), inputs=dict(inputs)))
        return out

    monkeypatch.setattr(SFTTrainer, "compute_loss", spy)
    return seen


def _model_dir(path, kind: str, **extra):
    torch.manual_seed(0)
    tok = build_tokenizer()
    build_tiny_model(tok, model_type=kind, **{**FAMILIES.get(kind, {}), **extra}).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _sft(model, data, out, *extra):
    argv = run_args("sft", model, data, out, *extra, steps=1, batch=4, max_length=64, precision="fp32")
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    return r.output, json.loads((out / "run_config.json").read_text())


@pytest.mark.parametrize(
    ("kind", "rows", "mask"),
    [(kind, PROMPT_COMPLETION, "completion") for kind in FAMILIES]
    + [("llama", MESSAGES, "assistant"), ("gemma3_text", MESSAGES, "assistant")],
)
def test_the_first_step_loss_equals_the_padded_runs(kind, rows, mask, first_steps, tmp_path, monkeypatch):
    from posttrainllm.training.padding_free import CheaperLayout

    # every batch flattened: on models this small the padded batch computes less, and sft would pad it
    # (test_a_batch_is_flattened_only_where_that_computes_less); this test is the flattened layout's exactness
    monkeypatch.setattr(CheaperLayout, "flatten", lambda self, lengths: True)
    model = _model_dir(tmp_path / "m", kind)
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    out, record = _sft(model, data, tmp_path / "free")
    assert "padding-free (each batch's examples in one row" in " ".join(out.split())
    assert record["padding_free"] is True and record["padding_free_used"] is True
    out, padded_record = _sft(model, data, tmp_path / "padded", "--no-padding-free")
    assert "padded to each batch's longest row (--no-padding-free)" in " ".join(out.split())
    assert padded_record["padding_free"] is False and padded_record["padding_free_used"] is False
    free, padded = first_steps
    assert free["trainer"].padding_free and free["trainer"].args.padding_free
    assert not padded["trainer"].padding_free and not padded["trainer"].args.padding_free
    for step in (free, padded):  # the loss mask in force: TRL's completion-only, or posttrainllm's assistant mask
        trainer = step["trainer"]
        assert trainer.args.assistant_only_loss if mask == "assistant" else trainer.completion_only_loss
    # padding-free: one row of the batch's 4 examples, position ids restarting at each, no attention mask
    assert "attention_mask" not in free["inputs"] and free["inputs"]["input_ids"].shape[0] == 1
    assert int((free["inputs"]["position_ids"] == 0).sum()) == 4
    assert padded["inputs"]["input_ids"].shape[0] == 4 and "attention_mask" in padded["inputs"]
    assert free["inputs"]["input_ids"].shape[1] == int(padded["inputs"]["attention_mask"].sum())  # no pad tokens
    assert free["n"] == padded["n"] > 0  # the same loss tokens: the same mean
    assert free["loss"] == pytest.approx(padded["loss"], rel=1e-6, abs=1e-6)


def test_an_architecture_not_verified_trains_padded_and_says_why(first_steps, tmp_path):
    model = _model_dir(tmp_path / "m", "gpt2")
    out, record = _sft(model, write_jsonl(tmp_path / "pc.jsonl", PROMPT_COMPLETION), tmp_path / "o")
    assert "padded: GPT2LMHeadModel (gpt2) is not an architecture whose padding-free" in " ".join(out.split())
    assert record["padding_free"] is True and record["padding_free_used"] is False
    assert (
        record["padded_because"] == "GPT2LMHeadModel (gpt2) is not an architecture whose padding-free loss is verified"
    )
    (step,) = first_steps
    assert "attention_mask" in step["inputs"] and not step["trainer"].args.padding_free


def test_packing_stays_padding_free_and_refuses_no_padding_free(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "pc.jsonl", PROMPT_COMPLETION)
    r = CliRunner().invoke(app, run_args("sft", tiny_model_dir, data, tmp_path / "o", "--packing", "--no-padding-free"))
    assert r.exit_code == 2
    assert "--no-padding-free with --packing: TRL's best-fit-decreasing packing is always padding-free" in r.output
    r = CliRunner().invoke(
        app, run_args("sft", tiny_model_dir, data, tmp_path / "t", "--trainer-arg", "padding_free=0")
    )
    assert r.exit_code == 2
    assert "--trainer-arg padding_free: set it with --no-padding-free" in r.output


def _lengths(inputs) -> list[int]:
    """The examples' lengths in a batch: a padded batch's mask sums, or a flattened row's position-id restarts."""
    if "attention_mask" in inputs:
        return [int(n) for n in inputs["attention_mask"].sum(dim=1)]
    starts = [int(i) for i in torch.nonzero(inputs["position_ids"][0] == 0).flatten()]
    return [b - a for a, b in zip(starts, [*starts[1:], inputs["input_ids"].shape[1]])]


@pytest.mark.parametrize(
    "rows", [[{"prompt": "hi", "completion": " ok"}] * 3 + [{"prompt": "x " * 20, "completion": " y"}]]
)
def test_at_its_defaults_sft_flattens_each_batch_only_where_that_computes_less(rows, first_steps, tmp_path):
    from posttrainllm.training.padding_free import CheaperLayout, layout_costs

    model = _model_dir(tmp_path / "m", "llama")
    _, record = _sft(model, write_jsonl(tmp_path / "rows.jsonl", rows), tmp_path / "o")
    assert record["padding_free_used"] is True
    (step,) = first_steps
    layout = step["trainer"].data_collator
    assert isinstance(layout, CheaperLayout) and layout.flattened + layout.padded >= 1
    assert (layout.per_token, layout.per_pair) == layout_costs(step["trainer"].model.config)
    lengths = _lengths(step["inputs"])
    assert len(lengths) == 4 and ("attention_mask" not in step["inputs"]) == layout.flatten(lengths)
