"""dpo --loss-type / --loss-weights: the loss TRL computes is the closed form of the loss asked for (each family), the
list of names is TRL's, bad names and counts exit 2 before any model loads, and a run records and trains it."""

from __future__ import annotations

import copy
import inspect
import json
import math
import re

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.commands.registry import to_config
from posttrainllm.config.checks import DPO_LOSS_TYPES
from posttrainllm.errors import ConfigErrors

runner = CliRunner()
BETA = 0.5


def test_loss_type_list_is_the_installed_trls():
    """Our list (read at --help time without TRL) equals the branches of DPOTrainer's loss and DPOConfig's help."""
    from trl import DPOConfig, DPOTrainer

    source = inspect.getsource(DPOTrainer._compute_loss)
    branches = re.findall(r'loss_type == "(\w+)"', source)
    assert tuple(branches) == DPO_LOSS_TYPES
    documented = re.findall(r"`'(\w+)'`", DPOConfig.__dataclass_fields__["loss_type"].metadata["help"])
    assert tuple(documented) == DPO_LOSS_TYPES


# ---------------------------------------------------------------------------------------------------------- config
def _cfg(*extra):
    return to_config("dpo", ["--model", "org/m", "--dataset", "org/d", *extra])


def test_loss_types_repeatable_and_comma_separated():
    cfg = _cfg(
        "--loss-type", "sigmoid,bco_pair", "--loss-type", "sft", "--loss-weights", "0.8,0.2", "--loss-weights", "1"
    )
    assert cfg.loss_type == ["sigmoid", "bco_pair", "sft"] and cfg.loss_weights == [0.8, 0.2, 1.0]
    assert _cfg().loss_type == ["sigmoid"] and _cfg().loss_weights is None


def test_recipe_sets_the_losses(tmp_path):
    from posttrainllm.commands.registry import resolve

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: org/m\ndataset: org/d\nloss_type: [ipo, sft]\nloss_weights: [1, 0.5]\n")
    cfg = resolve("dpo", {"recipe": str(recipe)})
    assert cfg.loss_type == ["ipo", "sft"] and cfg.loss_weights == [1.0, 0.5]
    assert cfg.sources["loss_type"] == "recipe"


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--loss-type", "sigmoid,dpop"], "--loss-type must be one of: sigmoid, hinge, ipo"),
        (["--loss-type", "ipo", "--loss-weights", "1,2"], "2 weight(s) for 1 --loss-type loss(es) (ipo)"),
        (["--loss-type", "ipo,sft", "--loss-weights", "1"], "1 weight(s) for 2 --loss-type loss(es)"),
        (["--loss-weights", "x"], "--loss-weights: expected a list of numbers"),
        (["--loss-weights", "-1"], "--loss-weights must be >= 0"),
        (["--loss-type", "ipo,,sft"], "--loss-type: expected"),
        (["--loss-type", "ipo,ipo"], "--loss-type ipo given more than once"),
        (["--loss-type", "exo_pair"], "exo_pair needs label smoothing"),
    ],
)
def test_bad_losses_are_config_errors(args, fragment):
    with pytest.raises(ConfigErrors) as e:
        _cfg(*args)
    assert fragment in str(e.value)


def test_unknown_loss_type_exits_2_listing_the_valid_ones(tmp_path):
    r = runner.invoke(app, cli_args("dpo", "org/m", "org/d", loss_type="dpop"))
    assert r.exit_code == 2
    assert all(name in r.output for name in DPO_LOSS_TYPES) and len(r.output.strip().splitlines()) == 1


def test_trainer_arg_loss_type_is_refused_for_dpo_only():
    from posttrainllm.commands.registry import spec_of
    from posttrainllm.training import check_trainer_args

    with pytest.raises(ConfigErrors, match="set it with --loss-type"):
        check_trainer_args(spec_of("dpo"), {"loss_type": "ipo"})
    with pytest.raises(ConfigErrors, match="set it with --loss-weights"):
        check_trainer_args(spec_of("dpo"), {"loss_weights": "[1]"})
    with pytest.raises(ConfigErrors, match="set it with --loss-type"):
        check_trainer_args(spec_of("sft"), {"loss_type": "dft"})  # SFTConfig's loss_type: sft's own --loss-type


def test_banner_text_of_the_losses():
    from posttrainllm.commands.dpo import dpo_loss_text

    assert dpo_loss_text(_cfg()) == "sigmoid"
    assert dpo_loss_text(_cfg("--loss-type", "sigmoid,sft")) == "1×sigmoid + 1×sft"
    assert dpo_loss_text(_cfg("--loss-type", "sigmoid,sft", "--loss-weights", "0.8,0.2")) == "0.8×sigmoid + 0.2×sft"


# ------------------------------------------------------------------------------- the loss TRL computes, by family
def _closed_form(name, lc, lr, nc, nr, nll, eps):
    """The per-pair loss from the papers, in the policy/reference log-ratios lc (chosen) and lr (rejected), summed
    over the completion tokens (nc, nr: their counts; nll: the chosen tokens' mean negative log-likelihood)."""
    import torch.nn.functional as F

    b, d = BETA, lc - lr
    s = F.logsigmoid
    forms = {
        "sigmoid": lambda: -s(b * d),  # DPO
        "hinge": lambda: (1 - b * d).clamp(min=0),  # SLiC
        "ipo": lambda: (lc / nc - lr / nr - 1 / (2 * b)) ** 2,  # IPO, TRL's per-token-averaged log-ratios
        "robust": lambda: (-(1 - eps) * s(b * d) + eps * s(-b * d)) / (1 - 2 * eps),  # rDPO, flip rate ε
        "exo_pair": lambda: (
            (b * d).sigmoid() * (s(b * d) - math.log(1 - eps)) + (-b * d).sigmoid() * (s(-b * d) - math.log(eps))
        ),
        "bco_pair": lambda: -s(b * lc) - s(-b * lr),
        "nca_pair": lambda: -s(b * lc) - 0.5 * s(-b * lc) - 0.5 * s(-b * lr),
        "sppo_hard": lambda: (lc - 0.5 / b) ** 2 + (lr + 0.5 / b) ** 2,
        "apo_zero": lambda: 1 - (b * lc).sigmoid() + (b * lr).sigmoid(),
        "apo_down": lambda: (b * lc).sigmoid() + 1 - (b * d).sigmoid(),
        "sigmoid_norm": lambda: -s(b * (lc / nc - lr / nr)),
        "sft": lambda: nll.expand_as(lc),
    }
    return forms[name]().mean()


def _sequence_logps(model, batch):
    """Σ log p(token) over each row's completion tokens, computed here from the logits (not by TRL)."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    token = torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["completion_mask"][:, 1:].float()
    return (token * mask).sum(1), mask.sum(1), token, mask


@pytest.fixture(scope="module")
def dpo_parts(tiny_model_dir, tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm import data as D

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("prefs")
    rows = [{"prompt": f"Say {i}.", "chosen": f"{i} is the sum", "rejected": f"no {i + 3} maybe"} for i in range(8)]
    (d / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ref = copy.deepcopy(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference that differs: log-ratios far from 0
    ref.requires_grad_(False)
    return model, ref, tok, D.prepare_dpo(str(d / "p.jsonl"), tok).train, d


def _trl_loss(dpo_parts, *flags):
    """The loss of one batch as the DPOTrainer that posttrainllm builds for these flags computes it."""
    from posttrainllm.commands.registry import spec_of
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer

    model, ref, tok, train, d = dpo_parts
    cfg = to_config(
        "dpo",
        ["--model", str(d), "--dataset", str(d / "p.jsonl"), "--output-dir", str(d / "out"), "--batch-size", "8"]
        + ["--beta", str(BETA), "--max-length", "64", *flags],
    )
    trainer = build_trainer(
        spec_of("dpo"), cfg, model=model, tokenizer=tok, train=train, eval_ds=None, precision="fp32",
        plan=plan_param_groups(cfg, model), ref_model=ref,
    )  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    import torch

    model.eval()  # no dropout; TRL then logs under "eval", which changes nothing in the loss
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
    return loss, batch


EPS = 0.1
FAMILIES = ["sigmoid", "hinge", "ipo", "robust", "exo_pair", "bco_pair", "nca_pair", "sppo_hard", "apo_zero"]
FAMILIES += ["apo_down", "sigmoid_norm"]


@pytest.mark.smoke
@pytest.mark.parametrize("name", FAMILIES)
def test_trl_computes_the_loss_asked_for(name, dpo_parts):
    model, ref = dpo_parts[0], dpo_parts[1]
    smoothing = ["--trainer-arg", f"label_smoothing={EPS}"] if name in ("robust", "exo_pair") else []
    loss, batch = _trl_loss(dpo_parts, "--loss-type", name, *smoothing)
    pol, n, _, _ = _sequence_logps(model, batch)
    base, _, _, _ = _sequence_logps(ref, batch)
    (lc, lr), (nc, nr) = (pol - base).chunk(2), n.chunk(2)
    expected = _closed_form(name, lc, lr, nc, nr, None, EPS)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    if name != "sigmoid":  # the families differ on this batch, so the comparison tells them apart
        assert expected.item() != pytest.approx(_closed_form("sigmoid", lc, lr, nc, nr, None, EPS).item(), rel=1e-3)


@pytest.mark.smoke
def test_weighted_sum_of_losses(dpo_parts):
    """MPO-style sums: 0.5 × DPO + 2 × the chosen answers' token NLL (TRL's `sft` loss)."""
    model, ref = dpo_parts[0], dpo_parts[1]
    loss, batch = _trl_loss(dpo_parts, "--loss-type", "sigmoid,sft", "--loss-weights", "0.5,2")
    pol, n, token, mask = _sequence_logps(model, batch)
    base, _, _, _ = _sequence_logps(ref, batch)
    (lc, lr), (nc, nr) = (pol - base).chunk(2), n.chunk(2)
    chosen_token, chosen_mask = token.chunk(2)[0], mask.chunk(2)[0]
    nll = -(chosen_token * chosen_mask).sum() / chosen_mask.sum()
    expected = 0.5 * _closed_form("sigmoid", lc, lr, nc, nr, nll, EPS) + 2 * _closed_form(
        "sft", lc, lr, nc, nr, nll, EPS
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)


# ------------------------------------------------------------------------------------------------------ end to end
@pytest.mark.smoke
def test_ipo_run_trains_and_records_its_loss(tiny_model_dir, preference_file, tmp_path):
    out = tmp_path / "o"
    args = cli_args("dpo", tiny_model_dir, preference_file, out)
    args += ["--loss-type", "ipo", "--max-steps", "2", "--batch-size", "4", "--max-length", "64", "--lr", "1e-3"]
    r = runner.invoke(app, [*args, "--logging-steps", "1", "--llrd", "0.5"])
    assert r.exit_code == 0, r.output
    assert re.search(r"DPO\s+β=0\.1, loss ipo, reference=", r.output), r.output
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["loss_type"] == ["ipo"] and saved["loss_weights"] is None
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert len(losses) == 2 and all(loss == loss for loss in losses)
    # IPO's loss at the start (policy = reference) is (0 - 1/(2β))² = 25 for β = 0.1; DPO's would be log 2
    assert losses[0] == pytest.approx((1 / (2 * 0.1)) ** 2, rel=1e-3)
