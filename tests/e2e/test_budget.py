"""--max-forgetting PCT on a run that forgets: the output is the merge toward the starting model whose held-out
perplexity change, measured again by eval, is within PCT; the trained model is kept in OUT/unmerged/; the α, every α
tried and the kept share of the gain are in eval_results.json and the model card; exit 3 when only the base meets
it."""

from __future__ import annotations

import json
import random

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app


@pytest.fixture
def held_out(tmp_path):
    """Text the tiny model never sees in training: digits and symbols, which a run on English prose forgets."""
    rng = random.Random(0)
    p = tmp_path / "held.txt"
    p.write_text("\n".join(" ".join(f"{rng.randint(0, 99999)}#{rng.choice('@%&*')}" for _ in range(12))
        for _ in range(40)))  # fmt: skip
    return p


def _change(model_dir, base_dir, held, max_length=32) -> float:
    """The held-out perplexity change (%) of model_dir against base_dir, as eval measures it."""
    r = CliRunner().invoke(app, ["eval", "--model", str(model_dir), "--text", str(held), "--max-length",
        str(max_length), "--json", "--precision", "fp32"])  # fmt: skip
    b = CliRunner().invoke(app, ["eval", "--model", str(base_dir), "--text", str(held), "--max-length",
        str(max_length), "--json", "--precision", "fp32"])  # fmt: skip
    assert r.exit_code == 0 and b.exit_code == 0, r.output + b.output
    after, before = json.loads(r.stdout)["held.txt"], json.loads(b.stdout)["held.txt"]
    return 100 * (after["perplexity"] / before["perplexity"] - 1)


def _run(tiny_model_dir, text_file, held, out, budget):
    argv = run_args("finetune", tiny_model_dir, text_file, out, steps=12, batch=4, max_length=32, lr="1e-2",
        ood_eval=held, max_forgetting=budget, eval_split="0.1", precision="fp32")  # fmt: skip
    return CliRunner().invoke(app, argv)


def test_the_budgeted_output_forgets_at_most_the_budget_measured_again(
    tiny_model_dir, text_file, held_out, tmp_path, monkeypatch
):
    from posttrainllm.training import forgetting

    loads = []
    load = forgetting.kl_reference
    monkeypatch.setattr(forgetting, "kl_reference", lambda *a: loads.append(a) or load(*a))
    out = tmp_path / "o"
    r = _run(tiny_model_dir, text_file, held_out, out, "5")
    assert len(loads) == 1  # the starting model, loaded again once: the held-out KL, the merges, the output's KL
    assert r.exit_code == 0, r.output
    budget = json.loads((out / "eval_results.json").read_text())["budget"]
    assert 0 < budget["alpha"] < 1 and not budget["only_base"]  # the trained run forgets more than 5%
    assert budget["tried"][0]["alpha"] == 1.0 and budget["tried"][0]["ppl_change_pct"] > 5
    unmerged = _change(out / "unmerged", tiny_model_dir, held_out)
    assert unmerged == pytest.approx(budget["tried"][0]["ppl_change_pct"], rel=1e-4)
    assert _change(out, tiny_model_dir, held_out) <= 5 + 1e-3  # what eval measures on the output
    at = next(t for t in budget["tried"] if t["alpha"] == budget["alpha"])
    assert _change(out, tiny_model_dir, held_out) == pytest.approx(at["ppl_change_pct"], rel=1e-4, abs=1e-4)
    assert budget["kept_gain"] is not None and 0 < budget["kept_gain"] < 1
    assert "forgetting budget 5%: merged back to α" in " ".join(r.output.split())
    card = (out / "README.md").read_text()
    assert "Forgetting budget" in card and f"α = {budget['alpha']:g}" in card
    assert json.loads((out / "run_config.json").read_text())["max_forgetting"] == 5.0


def test_a_budget_only_the_base_meets_exits_3_keeping_the_trained_model(tiny_model_dir, text_file, tmp_path):
    held = tmp_path / "held.txt"
    held.write_text("@%&*" * 400)  # symbols English prose never shows: every step away from the base costs here
    out = tmp_path / "o"
    r = _run(tiny_model_dir, text_file, held, out, "0")
    assert r.exit_code == 3, r.output
    assert "only the starting model meets it" in " ".join(r.output.split())
    budget = json.loads((out / "eval_results.json").read_text())["budget"]
    assert budget["only_base"] and budget["alpha"] == 0.0 and not (out / "unmerged").exists()
    assert (out / "model.safetensors").is_file()


def test_a_trained_model_within_the_budget_is_kept_as_it_is(tiny_model_dir, text_file, held_out, tmp_path):
    out = tmp_path / "o"
    r = _run(tiny_model_dir, text_file, held_out, out, "100000")
    assert r.exit_code == 0, r.output
    budget = json.loads((out / "eval_results.json").read_text())["budget"]
    assert budget["alpha"] == 1.0 and len(budget["tried"]) == 1 and not (out / "unmerged").exists()


def test_max_forgetting_needs_ood_eval_or_the_probe_and_no_lora(tiny_model_dir, text_file, tmp_path):
    r = CliRunner().invoke(app, run_args("finetune", tiny_model_dir, text_file, tmp_path / "o", max_forgetting="2",
        forgetting_probe="0"))  # fmt: skip
    assert r.exit_code == 2 and "--max-forgetting needs --ood-eval" in r.output and "--forgetting-probe" in r.output
    r = CliRunner().invoke(app, run_args("finetune", tiny_model_dir, text_file, tmp_path / "o", max_forgetting="2",
        ood_eval=text_file, lora_r="4"))  # fmt: skip
    assert r.exit_code == 2 and "posttrainllm merge --max-forgetting" in r.output
    r = CliRunner().invoke(app, run_args("finetune", tiny_model_dir, text_file, tmp_path / "o", max_forgetting="-1",
        ood_eval=text_file))  # fmt: skip
    assert r.exit_code == 2 and "--max-forgetting" in r.output


def test_merge_max_forgetting_writes_the_merge_within_the_budget(tiny_model_dir, text_file, held_out, tmp_path):
    trained = tmp_path / "t"
    r = CliRunner().invoke(app, run_args("finetune", tiny_model_dir, text_file, trained, steps=12, batch=4,
        max_length=32, lr="1e-2", precision="fp32"))  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "m"
    argv = ["merge", "--base", tiny_model_dir, "--model", trained, "--max-forgetting", "5", "--ood-eval", held_out,
        "--max-length", "32", "--precision", "fp32", "--output-dir", out]  # fmt: skip
    r = CliRunner().invoke(app, [str(a) for a in argv])
    assert r.exit_code == 0, r.output
    record = json.loads((out / "merge.json").read_text())
    budget = record["budget"]
    assert record["alpha"] == budget["alpha"] and 0 < budget["alpha"] < 1
    assert budget["tried"][0]["ppl_change_pct"] == pytest.approx(_change(trained, tiny_model_dir, held_out), rel=1e-4)
    assert _change(out, tiny_model_dir, held_out) <= 5 + 1e-3
    r = CliRunner().invoke(app, [str(a) for a in argv[:-1]] + [str(tmp_path / "m2"), "--alpha", "0.5"])
    assert r.exit_code == 2 and "not both" in r.output


def test_max_forgetting_under_several_processes_points_at_merge(tiny_model_dir, text_file, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = CliRunner().invoke(app, run_args("finetune", tiny_model_dir, text_file, tmp_path / "o", max_forgetting="2",
        ood_eval=text_file))  # fmt: skip
    assert r.exit_code == 2 and "posttrainllm merge --max-forgetting" in r.output and "one process" in r.output
    assert not (tmp_path / "o").exists()


def _probe_kl(model_dir, base_dir, texts) -> float:
    """The probe's KL(start ‖ model) on `texts`, measured afresh from the saved models."""
    from posttrainllm import models
    from posttrainllm.evaluate import probe

    tok = models.load_tokenizer(str(base_dir))
    model = models.load_model(str(model_dir), precision="fp32").eval()
    base = models.load_model(str(base_dir), precision="fp32").eval()
    return probe.measure(model, base, tok, texts)["kl"]


def test_without_ood_eval_the_budget_is_on_the_probe_as_a_kl_budget(tiny_model_dir, text_file, tmp_path, monkeypatch):
    import math

    from posttrainllm.evaluate import probe
    from posttrainllm.training import forgetting

    loads = []
    load = forgetting.kl_reference
    monkeypatch.setattr(forgetting, "kl_reference", lambda *a: loads.append(a) or load(*a))

    out = tmp_path / "o"
    argv = run_args("finetune", tiny_model_dir, text_file, out, steps=12, batch=4, max_length=32, lr="1e-2",
        max_forgetting="5", eval_split="0.1", precision="fp32")  # fmt: skip
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 0, r.output
    res = json.loads((out / "eval_results.json").read_text())
    budget = res["budget"]
    assert budget["measure"] == "probe" and budget["max_probe_kl"] == pytest.approx(math.log1p(0.05))
    assert 0 < budget["alpha"] < 1 and budget["tried"][0]["ppl_change_pct"] > 5
    texts = [json.loads(line)["text"] for line in (out / probe.PROBE_FILE).read_text().splitlines()[1:]]
    unmerged_kl = _probe_kl(out / "unmerged", tiny_model_dir, texts)
    assert 100 * math.expm1(unmerged_kl) == pytest.approx(budget["tried"][0]["ppl_change_pct"], rel=1e-4)
    kl = _probe_kl(out, tiny_model_dir, texts)  # the output, measured again: within the KL budget
    assert kl <= math.log1p(0.05) + 1e-6 and res["probe"]["kl"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
    assert "own samples" in " ".join(r.output.split()) and "own samples" in (out / "README.md").read_text()
    assert len(loads) == 1  # the starting model, loaded again once for the probe, the merges and their scoring
