"""A command is one unit: its spec (posttrainllm/commands/<command>.py) is what the shared code reads, never the
command's name; RunConfig is a static, typed class generated from the option table; the plan reaches the trainer
through its constructor; the trainer config is built once and --trainer-arg checked once per run."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
from harness import cli_args
from typer.testing import CliRunner

import posttrainllm
from posttrainllm.cli import app

PKG = Path(posttrainllm.__file__).parent
ALLOWED = ("commands", "config")  # the rooms that may name a command


def _literal_names(node: ast.expr) -> bool:
    """A command's name written out: "sft", or a tuple/list/set of such strings."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_literal_names(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def command_branches(source: str) -> list[int]:
    """Lines comparing `<x>.command` with ==, !=, in or not in, or a variable `command` with a name written out: a
    branch on the command's name (a check that a given name is in a table, as the sweep's, is not one)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            continue
        sides = [node.left, *node.comparators]
        attribute = any(isinstance(x, ast.Attribute) and x.attr == "command" for x in sides)
        variable = any(isinstance(x, ast.Name) and x.id == "command" for x in sides) and any(
            _literal_names(x) for x in sides
        )
        if attribute or variable:
            lines.append(node.lineno)
    return lines


def test_the_branch_finder_sees_a_branch_on_the_command():
    assert command_branches('if cfg.command == "sft":\n    pass\n') == [1]
    assert command_branches('x = 1 if cfg.command in ("grpo", "rloo") else 2\n') == [1]
    assert command_branches('if "dpo" != self.cfg.command:\n    pass\n') == [1]
    assert command_branches('if command == "pretrain":\n    pass\n') == [1]
    assert command_branches("if spec.samples:\n    pass\nname = cfg.command + ' (dry run)'\n") == []
    assert command_branches("if command not in SWEEP_COMMANDS:\n    pass\n") == []


def test_no_branch_on_the_command_outside_commands_and_config():
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        room = path.relative_to(PKG).parts[0]
        if room in ALLOWED:
            continue
        lines = command_branches(path.read_text(encoding="utf-8"))
        if lines:
            found[str(path.relative_to(PKG.parent))] = lines
    assert not found, f"branches on cfg.command outside commands/ and config/ (read the command's spec): {found}"


def test_every_command_of_the_cli_has_a_spec_and_every_trainer_a_config_class():
    import typer

    from posttrainllm.cli import app
    from posttrainllm.commands.registry import SPECS
    from posttrainllm.rundir.outdir import RECORDING_COMMANDS

    group = typer.main.get_command(app)
    assert set(SPECS) == set(group.commands) - {"sweep"}  # sweep runs the other commands: it has no spec
    assert {name for name, s in SPECS.items() if s.trains} == RECORDING_COMMANDS  # the records' names (rundir/)
    assert {name for name, s in SPECS.items() if s.trains} == {
        "pretrain", "sft", "dpo", "kto", "reward", "finetune", "grpo", "rloo", "distill", "sdft",
    }  # fmt: skip
    for spec in SPECS.values():
        assert (spec.trainer is None) == (spec.trainer_config is None) == (spec.data is None), spec.name


def test_the_lr_help_lists_every_default_lr_of_the_specs():
    """The help's default LRs are written from the specs (distill's 1e-5 was once left out of a hand-written list)."""
    from posttrainllm.commands.registry import SPECS
    from posttrainllm.config.options import OPTIONS
    from posttrainllm.config.per_command import full_help

    lr = next(o for o in OPTIONS if o.name == "lr")
    listed = full_help(lr, SPECS).split("Default: ", 1)[1].rstrip(".").split(", ")
    by_command = {c: value for value, commands in (x.split(" ") for x in listed) for c in commands.split("/")}
    assert {c: float(v) for c, v in by_command.items()} == {n: s.lr for n, s in SPECS.items() if s.lr is not None}


def test_the_resolved_defaults_are_the_specs(tmp_path):
    from posttrainllm.commands.registry import SPECS, resolve

    for name in ("sft", "dpo", "distill", "rloo"):
        values = {"model": "org/m", "dataset": "org/d", "output_dir": str(tmp_path / name)}
        values |= {"reward_regex": ["x"]} if name == "rloo" else {"teacher": "org/t"} if name == "distill" else {}
        cfg = resolve(name, values)
        spec = SPECS[name]
        assert cfg.lr == spec.lr and cfg.max_length == spec.max_length
        assert all(getattr(cfg, k) == v for k, v in spec.defaults.items())


# ------------------------------------------------------------------------------------------------ typed RunConfig
def _expected_type(o) -> typing.Any:
    if o.type is dict:
        hint: typing.Any = dict[str, float] if o.item_type is float else dict[str, typing.Any]
    elif o.type is list:
        hint = list[o.item_type]
    else:
        hint = o.type
    return hint if o.default is not None else hint | None


def test_the_typed_runconfig_is_the_option_table():
    """Names, types and defaults of RunConfig's fields are the option table's, and the checked-in file is what the
    generator writes now (regenerate: python -m posttrainllm.config.typed)."""
    from posttrainllm.config import typed
    from posttrainllm.config.runconfig import RunConfig

    assert typed.TARGET.read_text(encoding="utf-8") == typed.render(), "run python -m posttrainllm.config.typed"
    opts = typed.options()
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert list(fields) == ["command", "sources", "argv", "names", *opts]
    hints = typing.get_type_hints(RunConfig)
    for name, o in opts.items():
        f = fields[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert hints[name] == _expected_type(o), name
        assert default == o.default and type(default) is type(o.default), name
        assert f.kw_only


@pytest.mark.parametrize("leaf", ["config/runconfig.py", "spec.py"])
def test_the_runconfig_and_spec_modules_are_leaves(leaf):
    """The spec is what every room reads: it imports nothing of the project (TYPE_CHECKING blocks included)."""
    tree = ast.parse((PKG / leaf).read_text(encoding="utf-8"))
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("posttrainllm")]


def test_every_cfg_parameter_is_annotated_as_runconfig():
    """(A `cfg: dict` is a recorded config read back from run_config.json, and says so.)"""
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                    named = isinstance(arg.annotation, ast.Name) and arg.annotation.id in ("RunConfig", "dict")
                    if arg.arg == "cfg" and not named:
                        missing.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name}")
    assert not missing, f"cfg parameters without `: RunConfig`: {missing}"


def test_opt_fields_are_keyword_only():
    from posttrainllm.config.opt import Opt

    with pytest.raises(TypeError):
        Opt("lr", float, None, "help", ("sft",))  # type: ignore[misc]
    assert Opt(name="lr", type=float, default=None, help="h", commands=("sft",)).cli_flag == "--lr"


# ------------------------------------------------------------------------------- the plan, the trainer config, once
def test_the_plan_is_a_constructor_argument_not_a_class_attribute(tiny_model_dir, text_file, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    from posttrainllm import data
    from posttrainllm.commands.registry import resolve, spec_of
    from posttrainllm.planning import plan_param_groups
    from posttrainllm.training import build_trainer, trainer_class
    from posttrainllm.training.dft import DFTLossMixin

    torch.set_num_threads(1)
    values = {"model": str(tiny_model_dir), "dataset": str(text_file), "output_dir": str(tmp_path / "o")}
    cfg = resolve("finetune", values | {"llrd": "0.5", "max_length": "16", "max_steps": "1"})
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    plan = plan_param_groups(cfg, model)
    prepared = data.prepare_text(str(text_file), tok, max_length=16)
    trainer = build_trainer(
        spec_of("finetune"), cfg, model=model, tokenizer=tok, train=prepared.train, eval_ds=None, plan=plan
    )
    assert trainer.llrd_plan is plan
    assert not any("llrd_plan" in vars(c) for c in type(trainer).__mro__)
    # one class per trainer class (and the command's own mixins: finetune's DFT loss), made once and reused
    assert type(trainer) is trainer_class(Trainer, False, False, DFTLossMixin)
    assert trainer.dft is False  # the spec's keywords: the loss is DFT only under --loss-type dft


def test_a_run_builds_its_trainer_config_once_and_checks_trainer_args_once(
    tiny_model_dir, alpaca_file, tmp_path, monkeypatch
):
    from posttrainllm.config import coerce
    from posttrainllm.training import args

    built, checked = [], []
    make_config, check_keyed = args.make_config, coerce.check_keyed

    def counting_make_config(cls, **kwargs):
        built.append(cls.__name__)
        return make_config(cls, **kwargs)

    def counting_check_keyed(flag, *a, **k):
        checked.append(flag)
        return check_keyed(flag, *a, **k)

    monkeypatch.setattr(args, "make_config", counting_make_config)
    monkeypatch.setattr(args, "check_keyed", counting_check_keyed)
    out = tmp_path / "o"
    argv = cli_args("sft", tiny_model_dir, alpaca_file, out)
    argv += ["--max-steps", "1", "--batch-size", "2", "--max-length", "128", "--trainer-arg", "max_grad_norm=0.5"]
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert built == ["SFTConfig"]
    assert checked == ["--trainer-arg"]


# the command families the option table names (posttrainllm/spec.py), as the sets of commands they stood for when
# they were tuples of names: a spec field changed by mistake moves a command out of a family, and its options with it
FAMILIES = {
    "TRAINING": {"pretrain", "sft", "dpo", "kto", "reward", "finetune", "grpo", "rloo", "distill", "sdft"},
    "POST_TRAINING": {"sft", "dpo", "kto", "reward", "finetune", "grpo", "rloo", "distill", "sdft"},
    "LANGUAGE_MODELS": {"sft", "dpo", "kto", "finetune", "grpo", "rloo", "distill", "sdft"},
    "SAMPLING": {"grpo", "rloo", "distill", "sdft"},
    "ONLINE_RL": {"grpo", "rloo"},
    "OFFLINE_DATA": {"pretrain", "sft", "dpo", "kto", "reward", "finetune"},
    "OFFLINE_LM": {"sft", "dpo", "kto", "finetune"},
    "LIKELIHOOD": {"sft", "finetune"},
    "BETA": {"dpo", "kto", "grpo", "rloo", "distill", "sdft"},
    "REFERENCE_MODEL": {"dpo", "kto"},
    "TEACHER": {"distill"},
    "FROM_SCRATCH": {"pretrain"},
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_command_family_is_the_set_of_commands_its_spec_fields_give(family):
    from posttrainllm import spec
    from posttrainllm.commands.registry import SPECS

    test = getattr(spec, family)
    assert {name for name, s in SPECS.items() if test(s)} == FAMILIES[family]


def test_a_family_union_and_a_command_of_its_own():
    from posttrainllm.commands.registry import SPECS
    from posttrainllm.spec import TRAINING, own

    both = TRAINING | own("eval")
    assert {name for name, s in SPECS.items() if both(s)} == FAMILIES["TRAINING"] | {"eval"}
    assert [name for name, s in SPECS.items() if own("merge")(s)] == ["merge"]


def test_a_training_spec_without_a_setup_is_refused():
    from posttrainllm.spec import CommandSpec

    with pytest.raises(ValueError, match="names its setup"):
        CommandSpec(name="x", help="x", trainer="trl:SFTTrainer", trainer_config="trl:SFTConfig", data="sft")
