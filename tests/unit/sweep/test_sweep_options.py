"""The sweep's own options, read before anything runs: values that would share a cell's folder, a list where one
number is meant, and an option the swept command does not take (the command's own reason, in one line)."""

import pytest
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.errors import ConfigErrors, UsageError
from posttrainllm.sweep import parse

runner = CliRunner()


@pytest.fixture
def base(tmp_path):
    """A sweep's command options over small real files (the model is never loaded: every check here comes first)."""
    row = '{"instruction": "Add 1 and 2.", "input": "", "output": "3"}\n'
    for name, text in (("d.jsonl", row), ("e.jsonl", row), ("o.txt", "held-out text. " * 8), ("r.txt", "replay. ")):
        (tmp_path / name).write_text(text)
    files = {n: str(tmp_path / n) for n in ("d.jsonl", "e.jsonl", "o.txt", "r.txt")}
    out = ["--output-dir", str(tmp_path / "sweep")]  # a sweep that gets past its checks writes only here
    args = ["--model", "m", "--dataset", files["d.jsonl"], "--eval-dataset", files["e.jsonl"]]
    return [*args, "--ood-eval", files["o.txt"], *out], files


def _problems(command: str, args: list[str]) -> list[str]:
    with pytest.raises((ConfigErrors, UsageError)) as e:
        parse(command, args)
    return e.value.problems if isinstance(e.value, ConfigErrors) else [str(e.value)]


@pytest.mark.parametrize(
    "flag, values",
    [
        ("--lr", ("1e-3", "1.0000001e-3")),
        ("--llrd", ("0.9", "0.90000001")),
        ("--replay-ratio", ("0.25", "0.2500000001")),
        ("--merge-alpha", ("0.5", "0.5000001")),
    ],
)
def test_values_that_format_alike_are_refused_naming_the_option_and_both_values(flag, values, base):
    args, files = base
    args = [*args, "--replay-dataset", files["r.txt"], "--lr", "1e-4"]
    args += [flag, ",".join(values)]
    (problem,) = _problems("sft", args)
    assert problem.startswith(flag) and all(v in problem for v in values) and "\n" not in problem


def test_values_that_differ_in_a_cell_name_are_kept_apart(base):
    spec = parse("sft", [*base[0], "--lr", "1e-3,1.5e-3,0.001", "--llrd", "1.0,0.95"])
    assert spec.lrs == [1e-3, 1.5e-3]  # 0.001 is 1e-3 itself: one cell, no refusal
    names = [c.name for c in spec.cells()]
    assert len(names) == len(set(names)) == 4


@pytest.mark.parametrize("flag, text", [("--max-forgetting", "5,-50"), ("--jobs", "2,4")])
def test_an_option_of_one_number_refuses_a_list(flag, text, base):
    (problem,) = _problems("sft", [*base[0], "--lr", "1e-4", flag, text])
    assert problem.startswith(flag) and text in problem


def test_a_single_negative_budget_is_still_a_budget(base):
    assert parse("sft", [*base[0], "--lr", "1e-4", "--max-forgetting", "-2"]).max_forgetting == -2.0


@pytest.mark.parametrize("value", ["0.1", "0", "0,0.1"])
def test_sweep_dpo_with_kl_to_base_gives_the_commands_own_reason(value, base):
    own = runner.invoke(app, ["dpo", "--model", "m", "--dataset", base[1]["d.jsonl"], "--kl-to-base", "0.1"])
    assert own.exit_code == 2
    reason = own.output.split("Error:", 1)[1].strip()
    assert reason.startswith("--kl-to-base is not an option of dpo")
    r = runner.invoke(app, ["sweep", "dpo", *base[0], "--lr", "1e-4", "--kl-to-base", value])
    assert r.exit_code == 2, r.output
    assert reason in " ".join(r.output.split()) and "No such option" not in r.output


def test_an_option_no_command_takes_still_says_no_such_option(base):
    (problem,) = _problems("sft", [*base[0], "--lr", "1e-4", "--no-such-flag", "1"])
    assert "--no-such-flag" in problem


def test_cli_exit_codes_for_refused_values(base):
    r = runner.invoke(app, ["sweep", "sft", *base[0], "--lr", "1e-3,1.0000001e-3"])
    assert r.exit_code == 2 and "--lr" in r.output and "1.0000001e-3" in r.output
    r = runner.invoke(app, ["sweep", "sft", *base[0], "--lr", "1e-4", "--max-forgetting", "5,-50"])
    assert r.exit_code == 2 and "--max-forgetting" in r.output


def test_a_dry_run_lists_every_cell_and_writes_nothing(tiny_model_dir, alpaca_file, text_file, tmp_path):
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    out = tmp_path / "sw"
    argv = ["sweep", "sft", "--model", str(tiny_model_dir), "--dataset", str(alpaca_file), "--eval-dataset",
        str(alpaca_file), "--ood-eval", str(text_file), "--llrd", "1.0,0.9", "--lr", "1e-3,2e-3", "--merge-alpha",
        "0.5", "--max-steps", "2", "--output-dir", str(out), "--dry-run"]  # fmt: skip
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "4 cells (0 already done, 4 to run" in text and text.count(": to run: posttrainllm sft") == 4
    assert "--llrd 0.9" in text and "merged back toward the base at α 0.5" in text
    assert not out.exists()


def test_sft_loss_type_is_an_axis_with_its_cells_named_and_labelled_by_method(base):
    from posttrainllm.sweep.grid import method_label

    spec = parse("sft", [*base[0], "--lr", "1e-4", "--loss-type", "nll,dft", "--kl-to-base", "0,0.5"])
    cells = spec.cells()
    assert sorted(c.loss_type for c in cells) == ["dft", "dft", "nll", "nll"]
    dft_kl = next(c for c in cells if c.loss_type == "dft" and c.kl_to_base)
    assert dft_kl.name.endswith("-kl0.5-dft-s0")
    argv = spec.argv(dft_kl)
    assert argv[argv.index("--loss-type") + 1] == "dft" and argv[argv.index("--kl-to-base") + 1] == "0.5"
    assert "--loss-type" not in spec.argv(next(c for c in cells if c.loss_type == "nll"))
    assert method_label(1.0, 0.0, 0.5, 0, None, "dft") == "DFT flat + KL β=0.5"
    assert method_label(0.9, 0.0, 0.0, 0, None, command="sdft") == "SDFT γ=0.9"


def test_an_unknown_sft_loss_type_is_refused_naming_the_values(base):
    (problem,) = _problems("sft", [*base[0], "--lr", "1e-4", "--loss-type", "nll,focal"])
    assert problem.startswith("--loss-type") and "nll, dft" in problem and "focal" in problem


def test_sweep_help_lists_the_loss_type_axis_and_the_budget():
    result = runner.invoke(app, ["sweep", "sft", "--help"])
    assert result.exit_code == 0
    assert "--loss-type" in result.output and "--max-forgetting" in result.output and "sdft" in result.output
