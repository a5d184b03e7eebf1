"""posttrainllm/commands/: each module's SPEC as data, the CLI's hand-off to a command's `main` (with `run_command`
for a command whose spec says runs_commands), and the demo's own parts (its output-directory check, its frontier
table's rows, its stages) with the stages replaced by a recorder: no model is trained here."""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

from posttrainllm import cli, commands, spec
from posttrainllm.commands import demo
from posttrainllm.commands.registry import SPECS, spec_of
from posttrainllm.errors import BudgetNotMet, UsageError

PATH_FIELDS = ("trainer", "trainer_config", "collator")


def _module(name: str):
    return importlib.import_module(f"posttrainllm.commands.{name}")


def test_every_registered_spec_is_its_modules_spec_under_its_own_name():
    assert list(SPECS)[:2] == ["pretrain", "sft"] and "demo" in SPECS and "generate" in SPECS
    for name, s in SPECS.items():
        assert s.name == name and spec_of(name) is s
        assert _module(name).SPEC is s
        if s.trains:  # the shared main runs it: the module has no main, its spec names a setup that exists
            assert not hasattr(_module(name), "main"), name
            assert callable(spec.load(s.setup)), name
        else:
            assert callable(_module(name).main)
        assert s.help and "\n" not in s.help


def test_a_spec_names_its_classes_by_import_path_and_trains_only_with_a_trainer():
    for s in SPECS.values():
        assert s.trains == (s.trainer is not None)
        for field in PATH_FIELDS:
            path = getattr(s, field)
            if path is not None:
                module, colon, attr = path.partition(":")
                assert colon and module and attr.isidentifier(), (s.name, field, path)
        if not s.trains:
            assert s.trainer_config is None and s.collator is None and not s.owned_fields
    assert {s.name for s in SPECS.values() if not s.trains} >= {"eval", "generate", "merge", "recipes", "demo"}


def test_only_the_demo_runs_other_commands_and_its_main_takes_the_runner():
    assert [s.name for s in SPECS.values() if s.runs_commands] == ["demo"]
    assert list(inspect.signature(demo.main).parameters) == ["cfg", "run_command"]
    for name, s in SPECS.items():
        if name != "demo" and not s.trains:
            assert list(inspect.signature(_module(name).main).parameters) == ["cfg"], name


def test_every_training_command_runs_through_the_one_shared_main_with_its_specs_setup(monkeypatch):
    from posttrainllm import lifecycle

    calls = []
    monkeypatch.setattr(lifecycle, "run", lambda cfg, s, setup: calls.append((cfg, s.name, setup)))
    trainers = [name for name, s in SPECS.items() if s.trains]
    for name in trainers:
        cli._main_of(name)("CFG")
    assert [(c, n) for c, n, _ in calls] == [("CFG", n) for n in trainers]
    setups = {n: setup for _, n, setup in calls}
    assert setups["sft"] is _module("sft").setup and setups["pretrain"] is _module("pretrain").setup
    assert setups["dpo"] is setups["grpo"] is _module("post_training").setup


def test_load_num_proc_and_default_reference():
    assert spec.load("json:dumps") is json.dumps

    class Cfg:
        dataset_num_proc = None
        lora_r = 0

    cfg = Cfg()
    assert commands.num_proc(cfg) is None
    cfg.dataset_num_proc = 1
    assert commands.num_proc(cfg) is None
    cfg.dataset_num_proc = 4
    assert commands.num_proc(cfg) == 4
    assert commands.default_reference(cfg) == "frozen copy of --model"
    cfg.lora_r = 8
    assert commands.default_reference(cfg) == "adapter-disabled base"


def test_the_cli_hands_run_command_to_the_demo_and_only_the_config_to_others(monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "main", lambda cfg, run_command: calls.append(("demo", cfg, run_command)))
    monkeypatch.setattr(_module("eval"), "main", lambda cfg: calls.append(("eval", cfg)))
    cli._main_of("demo")("CFG")
    cli._main_of("eval")("CFG")
    assert calls == [("demo", "CFG", cli.run_command), ("eval", "CFG")]


def test_run_command_resolves_the_values_then_runs_the_command(monkeypatch, tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text("some text\n")
    got = []
    monkeypatch.setattr(_module("eval"), "main", got.append)
    cli.run_command("eval", {"model": "org/model", "text": [str(text)], "eval_batch_size": "2"})
    (cfg,) = got
    assert cfg.command == "eval" and cfg.model == "org/model" and cfg.text == [str(text)] and cfg.eval_batch_size == 2
    assert cfg.argv == ["eval"]
    from posttrainllm.errors import ConfigErrors

    with pytest.raises(ConfigErrors):  # resolved first: a bad value never reaches main
        cli.run_command("eval", {"model": "org/model", "text": [str(text)], "eval_batch_size": "two"})
    assert len(got) == 1


# ------------------------------------------------------------------------------------------------------- the demo
def test_the_demo_refuses_a_file_and_a_foreign_or_unconfirmed_directory(tmp_path):
    demo._check_demo_dir(tmp_path / "new", "new", overwrite=False)  # missing: fine
    demo._check_demo_dir(tmp_path, "empty", overwrite=False)  # empty: fine
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        demo._check_demo_dir(tmp_path / "f", "f", overwrite=True)
    out = tmp_path / "out"
    (out / "base").mkdir(parents=True)
    with pytest.raises(UsageError, match="pass --overwrite"):
        demo._check_demo_dir(out, "out", overwrite=False)
    demo._check_demo_dir(out, "out", overwrite=True)  # only the demo's own entries
    (out / "mine.txt").write_text("")
    with pytest.raises(UsageError, match="holds mine.txt, which the demo did not write"):
        demo._check_demo_dir(out, "out", overwrite=True)
    assert (out / "mine.txt").is_file() and (out / "base").is_dir()  # nothing deleted


def _ood(before: float, after: float) -> dict:
    return {"heldout_code": {"before": before, "after": after, "change_pct": 100 * (after / before - 1)}}


def _write_results(out, name: str, eval_loss: float, ood: dict, budget: dict | None = None) -> None:
    (out / name).mkdir(parents=True, exist_ok=True)
    record = {"train": {"eval_loss": eval_loss}, "ood": ood, **({"budget": budget} if budget else {})}
    (out / name / "eval_results.json").write_text(json.dumps(record))


def _fake_runs(out, *, budget: dict, raise_budget: bool = False):
    """A run_command that records each stage and writes the eval_results.json an sft stage would."""
    stages = []

    def run_command(command: str, values: dict) -> None:
        stages.append((command, values))
        if command == "pretrain":
            return
        name = values["output_dir"].rsplit("/", 1)[-1]
        if name == "sft-flat":
            _write_results(out, name, 1.0, _ood(10.0, 11.5), budget)
            if raise_budget:
                raise BudgetNotMet("only the base is within the budget")
        else:
            _write_results(out, name, 1.2, _ood(10.0, 10.5))

    return stages, run_command


def test_collect_reads_the_runs_and_marks_the_budgeted_point(tmp_path):
    unmerged = _ood(10.0, 13.0)
    budget = {"only_base": False, "alpha": 0.5, "eval_loss": 1.1, "unmerged_results": unmerged}
    _, run = _fake_runs(tmp_path, budget=budget)
    for name in demo.RUNS:
        run("sft", {"output_dir": str(tmp_path / name)})
    summary = demo.collect(tmp_path)
    labels = list(summary)
    assert labels[0] == "flat (γ=1.0)" and summary[labels[0]]["after"] == 13.0  # the trained, unmerged model
    assert labels[-1].startswith(demo.BUDGET_MARK) and "α=0.50" in labels[-1]
    assert summary[labels[-1]] == {**_ood(10.0, 11.5)["heldout_code"], "eval_loss": 1.1, "alpha": 0.5}
    assert len(summary) == 4


def test_the_demo_runs_pretrain_then_three_sft_stages_through_run_command(tmp_path, capsys):
    from posttrainllm.config.runconfig import RunConfig

    out = tmp_path / "demo"
    budget = {"only_base": False, "alpha": 0.25, "eval_loss": 1.3}
    stages, run = _fake_runs(out, budget=budget)
    cfg = RunConfig(command="demo", sources={}, argv=["demo"], names=(), output_dir=str(out), overwrite=False,
                    quick=True)  # fmt: skip
    demo.main(cfg, run)
    assert [c for c, _ in stages] == ["pretrain", "sft", "sft", "sft"]
    pretrain = stages[0][1]
    assert pretrain["output_dir"] == str(out / "base") and pretrain["max_steps"] == "150"  # --quick
    sft = {v["output_dir"].rsplit("/", 1)[-1]: v for _, v in stages[1:]}
    assert list(sft) == list(demo.RUNS)
    assert sft["sft-flat"]["max_forgetting"] == str(demo.DEMO_BUDGET) and sft["sft-flat"]["llrd"] == "1.0"
    assert all(v["model"] == str(out / "base") and v["max_steps"] == "60" for v in sft.values())
    replay = sft[f"sft-replay-{demo.DEMO_REPLAY}"]
    assert replay["replay_dataset"] == pretrain["dataset"] and "max_forgetting" not in replay
    results = json.loads((out / "demo_results.json").read_text())
    assert len(results) == 4 and demo.render_table(results) in capsys.readouterr().out


def test_a_budget_only_the_base_meets_leaves_the_budgeted_row_out(tmp_path, capsys):
    from posttrainllm.config.runconfig import RunConfig

    out = tmp_path / "demo"
    stages, run = _fake_runs(out, budget={"only_base": True, "alpha": 0.0}, raise_budget=True)
    cfg = RunConfig(command="demo", sources={}, argv=["demo"], names=(), output_dir=str(out), overwrite=False,
                    quick=True)  # fmt: skip
    demo.run_demo(cfg, run)
    assert len(stages) == 4  # the flat stage's BudgetNotMet does not stop the demo
    results = json.loads((out / "demo_results.json").read_text())
    assert len(results) == 3 and not any(label.startswith(demo.BUDGET_MARK) for label in results)
