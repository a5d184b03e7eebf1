"""The demo's parts that need no training: its data comes from this Python install, and its table (the README quotes
the recorded run's, docs/demo_results.json) renders the way the demo prints it. The demo's run itself:
tests/e2e/test_demo.py."""

import json
from pathlib import Path

from posttrainllm.commands import demo_data

REPO = Path(__file__).resolve().parents[3]
RECORD = REPO / "docs" / "demo_results.json"


def test_demo_data_comes_from_this_python_install(tmp_path):
    files = demo_data.write_demo_files(tmp_path)
    assert files["pretrain"].stat().st_size > 100_000
    assert files["heldout_code"].read_text() not in files["pretrain"].read_text()


def test_the_readme_quotes_the_recorded_demo_run():
    """docs/demo_results.json is the last full `posttrainllm demo` (its demo_results.json plus what the numbers
    depend on); the README's table is that record rendered the way the demo prints it, and names its environment."""
    from posttrainllm.commands import demo

    record = json.loads(RECORD.read_text())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert demo.render_table(record["runs"]) in readme
    env = record["environment"]
    assert f"torch {env['torch']}" in readme and f"{env['threads']} threads" in readme
    assert ("demo --quick" in readme) == env["quick"]  # the README says which demo the table is


def test_the_demo_prints_its_table_as_render_table_does(tmp_path):
    from posttrainllm.commands import demo

    runs = {
        "flat (γ=1.0)": {"eval_loss": 1.5, "before": 100.0, "after": 150.0, "change_pct": 50.0},
        "★ budget ≤20% (α=0.25)": {"eval_loss": 1.9, "before": 100.0, "after": 112.0, "change_pct": 12.0},
    }
    text = demo.render_table(runs)
    assert "flat (γ=1.0)" in text and "+50.0%" in text and demo.TABLE_TITLE in text
    assert "★ budget ≤20% (α=0.25)" in text and "+12.0%" in text and "--max-forgetting 20" in text
    assert all(line == line.rstrip() for line in text.splitlines())
