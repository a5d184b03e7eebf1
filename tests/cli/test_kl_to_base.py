"""--kl-to-base β (posttrainllm/training/kl_to_base.py): loss = the LM loss + β × the mean per-token KL(base ‖ model)
over the loss tokens. At step 1 the model is the base, so the loss is the plain loss; a later step's logged loss is
recomputed here from the two models' logits; KL to the base after training falls as β rises; β = 0 is the plain run
bit for bit; β < 0 and the commands without it exit 2 before a model loads."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import CORPUS
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.training.kl_to_base import KLToBaseMixin

runner = CliRunner()


def _invoke(command, model, data, out, *extra):
    args = cli_args(command, model, data, out, precision="fp32")
    args += ["--batch-size", "4", "--logging-steps", "1", "--save-steps", "1000", "--lr", "1e-2", *extra]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output


def _run(command, model, data, out, *extra):
    """The run's log_history (trainer_state.json)."""
    _invoke(command, model, data, out, *extra)
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def _steps(history):
    return {h["step"]: h for h in history if "loss" in h}


@pytest.fixture
def data_for(alpaca_file, text_file):
    return {"sft": alpaca_file, "finetune": text_file}


def test_negative_beta_exits_2_before_a_model_loads(tiny_model_dir, alpaca_file, tmp_path, monkeypatch):
    from posttrainllm import models

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", no_load)
    out = tmp_path / "o"
    r = runner.invoke(
        app, cli_args("sft", tiny_model_dir, alpaca_file, out, kl_to_base="-0.5"),
    )  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "--kl-to-base must be >= 0" in r.output and not out.exists()


@pytest.mark.parametrize("command", ["dpo", "kto"])
def test_the_preference_commands_refuse_kl_to_base(command, tiny_model_dir, preference_file, tmp_path):
    r = runner.invoke(
        app, cli_args(command, tiny_model_dir, preference_file, tmp_path / "o", kl_to_base="0.1"),
    )  # fmt: skip
    assert r.exit_code == 2 and "--kl-to-base" in r.output, r.output


@pytest.mark.parametrize("command", ["sft", "finetune"])
def test_help_describes_kl_to_base(command):
    r = runner.invoke(app, [command, "--help"], terminal_width=200)
    text = " ".join(r.output.split())
    assert r.exit_code == 0 and "--kl-to-base" in text and "KL(base ‖ model)" in text
    assert "dpo's and kto's --beta" in text


@pytest.mark.parametrize(
    "command, extra, base",
    [("sft", [], "frozen copy"), ("finetune", [], "frozen copy"), ("sft", ["--lora-r", "4"], "adapters disabled")],
)
def test_step_1_loss_is_the_plain_loss(command, extra, base, tiny_model_dir, data_for, tmp_path):
    """Model = base at step 1: KL is 0 and the loss equals the run without the anchor; at step 2 the anchor acts."""
    plain = _steps(_run(command, tiny_model_dir, data_for[command], tmp_path / "plain", "--max-steps", "2", *extra))
    anchored_run = tmp_path / "kl"
    output = _invoke(
        command, tiny_model_dir, data_for[command], anchored_run, "--max-steps", "2", "--kl-to-base", "5", *extra
    )
    anchored = _steps(json.loads((anchored_run / "trainer_state.json").read_text())["log_history"])
    assert [line for line in output.splitlines() if line.startswith("step 2/2") and "kl_to_base " in line]
    assert anchored[1]["kl_to_base"] == 0.0
    assert anchored[1]["loss"] == pytest.approx(plain[1]["loss"], rel=1e-6, abs=0)
    assert anchored[2]["kl_to_base"] > 0
    assert anchored[2]["loss"] != pytest.approx(plain[2]["loss"], rel=1e-6)
    config = json.loads((anchored_run / "run_config.json").read_text())
    assert config["kl_to_base"] == 5.0


def test_the_banner_names_the_base_and_its_cost(tiny_model_dir, alpaca_file, tmp_path):
    args = cli_args("sft", tiny_model_dir, alpaca_file, dry_run=True, kl_to_base="0.1")
    r = runner.invoke(app, [*args, "--output-dir", str(tmp_path / "a")], terminal_width=200)
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "loss + 0.1 × mean KL(base ‖ model)" in text and "a frozen copy of the starting model (+" in text
    assert "one extra forward of the base" in text
    r = runner.invoke(app, [*args, "--lora-r", "4", "--output-dir", str(tmp_path / "b")], terminal_width=200)
    assert r.exit_code == 0 and "adapters disabled (no second copy)" in " ".join(r.output.split()), r.output


def _sums(model, base, batch) -> tuple[float, float, int]:
    """Σ next-token CE over labels != -100, Σ KL(base ‖ model) at the same positions (from the full logits of the two
    models), and the number of those positions."""
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}  # padded or not
    with torch.no_grad():
        # no KV cache, as the trainer runs them: only then does a padding-free row keep its examples apart
        logits, ref = model(**fwd, use_cache=False).logits[:, :-1], base(**fwd, use_cache=False).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    ce = F.cross_entropy(logits[mask].double(), labels[mask], reduction="sum")
    log_q, log_p = logits[mask].double().log_softmax(-1), ref[mask].double().log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum()
    return ce.item(), kl.item(), int(mask.sum())


def _tokens(batch) -> int:
    """The batch's real tokens (no padding)."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()


@pytest.fixture
def chat_file(tmp_path):
    """Conversations: the loss (and so the KL) is on the assistant's turns only."""
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Add {i} and {i + 1}."},
                      {"role": "assistant", "content": f"The sum is {2 * i + 1}."}]}
        for i in range(32)
    ]  # fmt: skip
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.mark.parametrize("accum, data", [(1, "alpaca"), (2, "alpaca"), (1, "chat")])
def test_a_later_steps_logged_loss_is_ce_plus_beta_kl_from_the_logits(
    accum, data, tiny_model_dir, alpaca_file, chat_file, tmp_path, monkeypatch
):
    """The loss logged at step 3 = CE(model after step 2) + β × KL(base ‖ model after step 2), token means over step
    3's batch (its micro-batches together under gradient accumulation), on the positions the LM loss is on: the
    completions of Alpaca rows, the assistant's turns of conversations."""
    from transformers import AutoModelForCausalLM

    batches = []
    original = KLToBaseMixin.compute_loss

    def spy(self, model, inputs, *args, **kwargs):
        batches.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(KLToBaseMixin, "compute_loss", spy)
    beta, out = 0.7, tmp_path / "o"
    extra = ["--max-steps", "3", "--save-steps", "2", "--kl-to-base", str(beta), "--grad-accum", str(accum)]
    steps = _steps(_run("sft", tiny_model_dir, {"alpaca": alpaca_file, "chat": chat_file}[data], out, *extra))
    assert len(batches) == 3 * accum
    labels = batches[-1]["labels"]
    assert 0 < int((labels != -100).sum()) < _tokens(batches[-1])  # a masked loss
    model = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2").eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ce, kl, n = (sum(x) for x in zip(*(_sums(model, base, b) for b in batches[2 * accum :])))
    ce, kl = ce / n, kl / n
    assert kl > 1e-4  # the model moved: the anchor is not a no-op here
    assert steps[3]["kl_to_base"] == pytest.approx(kl, rel=1e-4)
    assert steps[3]["loss"] == pytest.approx(ce + beta * kl, rel=1e-4)
    assert steps[3]["loss"] != pytest.approx(ce, rel=1e-4)  # the KL term is in the logged loss


def _kl_to(model_dir, base_dir) -> float:
    """Mean KL(base ‖ model) per token on the test corpus, measured with the eval's own scorer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.evaluate.divergence import kl_sum

    tok = AutoTokenizer.from_pretrained(base_dir)
    ids = torch.tensor([tok(" ".join(CORPUS))["input_ids"][:200]])
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(model_dir)(input_ids=ids).logits[0]
        ref = AutoModelForCausalLM.from_pretrained(base_dir)(input_ids=ids).logits[0]
    total, count = kl_sum(ref, logits)
    return total / count


def test_kl_to_the_base_after_training_falls_as_beta_rises(tiny_model_dir, text_file, tmp_path):
    measured = []
    for beta in ("0", "1", "10"):
        out = tmp_path / f"beta{beta}"
        _run("finetune", tiny_model_dir, text_file, out, "--max-steps", "12", "--kl-to-base", beta)
        measured.append(_kl_to(out, tiny_model_dir))
    assert measured[0] > measured[1] > measured[2] > 0, measured


def test_beta_zero_is_the_plain_run_bit_for_bit(tiny_model_dir, alpaca_file, tmp_path, captured_trainer):
    plain = _run("sft", tiny_model_dir, alpaca_file, tmp_path / "plain", "--max-steps", "3")
    zero = _run("sft", tiny_model_dir, alpaca_file, tmp_path / "zero", "--max-steps", "3", "--kl-to-base", "0")
    assert not any(isinstance(t, KLToBaseMixin) for t in captured_trainer) and len(captured_trainer) == 2
    assert [h.get("loss") for h in zero] == [h.get("loss") for h in plain]
    assert not any("kl_to_base" in h for h in zero)
    weights = [(tmp_path / d / "model.safetensors").read_bytes() for d in ("plain", "zero")]
    assert weights[0] == weights[1]


def test_a_resumed_run_keeps_the_anchor(tiny_model_dir, alpaca_file, tmp_path):
    out, same = tmp_path / "o", ["--kl-to-base", "0.5", "--max-length", "128"]
    _run("sft", tiny_model_dir, alpaca_file, out, "--max-steps", "2", "--save-steps", "1", *same)
    steps = _steps(_run("sft", tiny_model_dir, alpaca_file, out, "--max-steps", "3", "--resume", *same))
    assert set(steps) == {1, 2, 3} and steps[3]["kl_to_base"] > 0


def test_kl_to_base_reaches_tensorboard_every_step(tiny_model_dir, alpaca_file, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, extra = tmp_path / "o", ["--max-steps", "3", "--kl-to-base", "1", "--report-to", "tensorboard"]
    steps = _steps(_run("sft", tiny_model_dir, alpaca_file, out, *extra))
    scalars = {}
    for events in out.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        if "train/kl_to_base" in acc.Tags()["scalars"]:
            scalars.update({e.step: e.value for e in acc.Scalars("train/kl_to_base")})
    assert sorted(scalars) == [1, 2, 3]
    assert all(scalars[s] == pytest.approx(steps[s]["kl_to_base"], rel=1e-6, abs=1e-12) for s in scalars)


def test_a_huge_beta_that_diverges_names_kl_to_base_and_not_fp32_on_an_fp32_run(tiny_model_dir, alpaca_file, tmp_path):
    out = tmp_path / "o"
    args = cli_args("sft", tiny_model_dir, alpaca_file, out, precision="fp32", kl_to_base="1e30")
    r = runner.invoke(app, [*args, "--batch-size", "4", "--max-steps", "3", "--save-steps", "1000", "--lr", "1e-2"])
    assert r.exit_code == 1, r.output
    line = " ".join(r.output.split())
    assert "training diverged" in line and "--kl-to-base 1e+30" in line and "likely cause" in line
    assert "--precision fp32" not in line


@pytest.mark.parametrize(
    "fields, present, absent",
    [
        (dict(low_precision=True, kl_beta=0.0), ["--lr (now 0.001)", "--precision fp32"], ["--kl-to-base"]),
        (dict(low_precision=False, kl_beta=0.0), ["--lr (now 0.001)", "--warmup-ratio"], ["fp32", "--kl-to-base"]),
        (dict(low_precision=False, kl_beta=0.5), ["a lower --kl-to-base (now 0.5)"], ["likely cause", "fp32"]),
        (dict(low_precision=True, kl_beta=1e6), ["likely cause", "--kl-to-base 1e+06", "--precision fp32"], []),
    ],
)
def test_the_divergence_advice_follows_the_runs_fields(fields, present, absent):
    from posttrainllm.training.mixins import divergence_advice

    advice = divergence_advice(1e-3, **fields)
    assert all(p in advice for p in present) and not any(a in advice for a in absent), advice
