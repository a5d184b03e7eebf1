"""One plan per run: the groups printed and saved in param_groups.json are the groups the trainer's optimizer
holds, group by group and parameter by parameter (freeze, clamp, LoRA, tied embeddings, DDP); the library is
importable from the package root without importing torch; the logged `learning_rate` is the base LR."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import saved_groups
from harness import run_args, torchrun
from torch import nn
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def optimizer_groups(optimizer, model):
    """The optimizer's real groups as param_groups.json describes them (names via the trainer's model)."""
    from posttrainllm.llrd import strip_wrappers

    name_of = {id(p): strip_wrappers(n) for n, p in model.named_parameters()}
    return [
        {
            "name": g["name"],
            "lr": g["lr"],
            "weight_decay": g["weight_decay"],
            "params": [name_of[id(p)] for p in g["params"]],
        }
        for g in optimizer.param_groups
    ]


@pytest.fixture
def captured(monkeypatch):
    """Records (groups as created, optimizer, model) each time a trainer creates its optimizer."""
    from posttrainllm.training import LLRDMixin

    seen = []
    original = LLRDMixin.create_optimizer

    def spy(self, model=None):
        opt = original(self, model)
        used = self.model if model is None else model
        seen.append((optimizer_groups(opt, used), opt, used))
        return opt

    monkeypatch.setattr(LLRDMixin, "create_optimizer", spy)
    return seen


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory):
    from conftest import build_tiny_model, build_tokenizer

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tied")
    tok = build_tokenizer()
    model = build_tiny_model(tok, tie_word_embeddings=True)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


SETTINGS = {
    "flat": [],
    "llrd": ["--llrd", "0.8", "--weight-decay", "0.1"],
    "freeze": ["--llrd", "0.5", "--llrd-freeze-below", "0.2"],
    "clamp": ["--llrd", "0.5", "--llrd-min-scale", "0.3", "--weight-decay", "0.01"],
    "lora": ["--llrd", "0.8", "--lora-r", "2"],
    "lora_freeze": ["--llrd", "0.5", "--lora-r", "2", "--llrd-freeze-below", "0.2"],
    "tied": ["--llrd", "0.8", "--tied-embeddings", "embedding"],
}


@pytest.mark.smoke
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_param_groups_json_equals_the_optimizers_groups(
    setting, captured, tiny_model_dir, tied_model_dir, alpaca_file, tmp_path
):
    model_dir = tied_model_dir if setting == "tied" else tiny_model_dir
    out = tmp_path / "o"
    args = run_args("sft", model_dir, alpaca_file, out, *SETTINGS[setting], steps=1, max_length=128)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len(captured) == 1
    created, optimizer, model = captured[0]
    assert created == saved_groups(out)
    grouped = [id(p) for g in optimizer.param_groups for p in g["params"]]
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(grouped) == sorted(trainable)  # every trainable parameter exactly once, nothing frozen in it
    if "freeze" in setting:
        frozen = [n for n, p in model.named_parameters() if "lora_" not in n and "layers.0." in n]
        assert frozen and all(not dict(model.named_parameters())[n].requires_grad for n in frozen)


@pytest.mark.smoke
def test_param_groups_json_equals_the_optimizers_groups_on_every_ddp_rank(tiny_model_dir, alpaca_file, tmp_path):
    """torchrun, 2 processes (gloo): each rank dumps its real optimizer groups; both equal param_groups.json."""
    script = tmp_path / "spy.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).resolve().parents[1])!r}]
        from test_plan_once import optimizer_groups
        from posttrainllm import cli
        from posttrainllm.training import LLRDMixin

        original = LLRDMixin.create_optimizer

        def spy(self, model=None):
            opt = original(self, model)
            path = {str(tmp_path)!r} + f"/rank{{os.environ['RANK']}}.json"
            with open(path, "w") as f:
                json.dump(optimizer_groups(opt, self.model if model is None else model), f)
            return opt

        LLRDMixin.create_optimizer = spy
        sys.argv = ["posttrainllm", *sys.argv[1:]]
        cli.main()
    """)
    )
    out = tmp_path / "ddp"
    options = dict(llrd=0.5, llrd_freeze_below=0.2, weight_decay=0.1)
    args = run_args("sft", tiny_model_dir, alpaca_file, out, steps=1, max_length=128, lr=None, **options)
    r = torchrun(script, *args, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    want = saved_groups(out)
    for rank in (0, 1):
        assert json.loads((tmp_path / f"rank{rank}.json").read_text()) == want, rank


def test_the_library_is_importable_from_the_package_root_without_importing_torch_first():
    code = (
        "import sys, posttrainllm; assert 'torch' not in sys.modules; "
        "from posttrainllm import build_param_groups, LLRDPlan, apply_freeze; "
        "import posttrainllm.llrd as l; assert build_param_groups is l.build_param_groups; "
        "assert set(posttrainllm.__all__) >= {'build_param_groups', 'LLRDPlan'}"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_groups_for_a_wrapped_copy_are_matched_by_name_and_a_different_model_is_refused():
    from posttrainllm.llrd import build_param_groups

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("C", (), {"num_hidden_layers": 3})()
            self.embed = nn.Embedding(10, 4)
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
            self.head = nn.Linear(4, 10)

    model = Net()
    plan = build_param_groups(model, 1e-3, 0.5)
    assert plan.groups_for(model) is plan.groups  # the planned model itself: the very same groups
    wrapper = nn.Module()
    wrapper.module = Net()  # DDP-style prefix, other tensor objects
    wrapper.module.load_state_dict(model.state_dict())
    groups = plan.groups_for(wrapper)
    named = dict(wrapper.named_parameters())
    for g, planned in zip(groups, plan.groups):
        assert g["lr"] == planned["lr"] and g["name"] == planned["name"]
        assert [id(p) for p in g["params"]] == [id(named["module." + n]) for n in plan.param_names[g["name"]]]
    other = Net()
    other.extra = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="trainable not planned"):
        plan.groups_for(other)


@pytest.mark.smoke
def test_logged_learning_rate_is_the_base_lr_not_group_0s(tiny_model_dir, text_file, tmp_path):
    out = tmp_path / "o"
    r = runner.invoke(
        app,
        run_args("finetune", tiny_model_dir, text_file, out, logging_steps=1, llrd="0.5", lr_scheduler="constant"),
    )
    assert r.exit_code == 0, r.output
    logs = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    assert logs and all(h["learning_rate"] == pytest.approx(1e-3) for h in logs)
    assert all(h["lr_min"] == pytest.approx(1e-3 * 0.5**3) and h["lr_max"] == pytest.approx(1e-3) for h in logs)


@pytest.mark.parametrize("command", ["sft", "dpo", "kto", "reward", "grpo", "rloo", "distill", "finetune", "pretrain"])
def test_every_trainer_argument_posttrainllm_sets_exists_in_the_installed_versions(command, tmp_path):
    from posttrainllm.commands.registry import resolve, spec_of
    from posttrainllm.training import trainer_config

    values = {
        "dataset": "org/data",
        "output_dir": str(tmp_path / "o"),
        "eval_steps": "5",
        "gradient_checkpointing": True,
    }
    if command != "pretrain":
        values["model"] = "org/model"
    if command in ("grpo", "rloo"):
        values["reward_regex"] = ["x"]
    if command == "distill":
        values["teacher"] = "org/teacher"
    cfg = resolve(command, values)
    for has_eval in (False, True):
        conf = trainer_config(spec_of(command), cfg, "fp32", has_eval=has_eval)
        assert conf.learning_rate == cfg.lr and conf.output_dir == cfg.output_dir
        assert conf.activation_checkpointing is True


def test_an_unknown_trainer_keyword_is_an_error_not_dropped():
    from transformers import TrainingArguments

    from posttrainllm.errors import UsageError
    from posttrainllm.training import make_config

    with pytest.raises(UsageError, match=r"no argument save_safetensor \(closest: .*save_steps"):
        make_config(TrainingArguments, output_dir="o", save_safetensor=True)
