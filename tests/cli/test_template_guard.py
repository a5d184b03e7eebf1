"""Chat templates from a model's files render under bounds (time, memory, output) before they are used: a template
that asks for gigabytes, loops without end or writes megabytes is refused within seconds, with exit 2 naming it;
a sound template, and one that merely raises for a conversation it does not support, pass."""

from __future__ import annotations

import shutil
import time

import pytest
from harness import cli_args
from typer.testing import CliRunner

from posttrainllm.cli import app
from posttrainllm.models import template_guard as G

runner = CliRunner()

MEMORY, TIME = "needed more than 2 GiB of memory", "took over 5 s to render"
BOMBS = {  # the template, and what stops it (either bound may trip first for the doubling string)
    "six_gigabytes": ("{{ 'x' * 6000000000 }}", (MEMORY,)),
    "nested_loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
        (TIME,),
    ),
    "doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        (MEMORY, TIME),
    ),
    "megabytes": (
        "{% for i in range(100000) %}{{ 'y' * 50 }}{% endfor %}",
        ("rendered more than 1,000,000 characters",),
    ),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_template_bomb_is_stopped_within_seconds_and_bounded_memory(name):
    template, says = BOMBS[name]
    t0 = time.monotonic()
    problem = G.check_template(template)
    assert problem is not None and any(s in problem for s in says), problem
    assert time.monotonic() - t0 < G.RENDER_S + 55  # the child's start (importing jinja2) on a busy machine


def test_the_renderer_s_peak_memory_stays_under_the_bound():
    """The 6 GB template checked from a fresh process: the peak memory of its renderer child is under the bound."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        f"import sys; sys.path.insert(0, {str(Path(G.__file__).resolve().parents[1])!r})\n"
        "import resource\n"
        "from posttrainllm.models.template_guard import check_template\n"
        f"print(check_template({BOMBS['six_gigabytes'][0]!r}))\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    problem, peak_kib = done.stdout.strip().splitlines()[-2:]
    assert MEMORY in problem, done.stdout + done.stderr
    assert 0 < int(peak_kib) * 1024 <= G.MEMORY_BYTES


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{{ messages[-1]['content'] }}",
        "{% generation %}{{ messages | tojson }}{% endgeneration %}",
    ],
)
def test_a_sound_or_merely_raising_template_passes(template):
    assert G.check_template(template, {"eos_token": "</s>"}) is None


def test_a_model_directory_whose_template_is_a_bomb_exits_2_naming_it(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    model = tmp_path / "hostile"
    shutil.copytree(tiny_model_dir, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = "{{ 'x' * 7000000000 }}"
    tok.save_pretrained(model)
    t0 = time.monotonic()
    r = runner.invoke(app, cli_args("generate", model, prompt="hello", max_new_tokens=2))
    assert time.monotonic() - t0 < 90
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert f"the chat template of {model} needed more than 2 GiB of memory" in text and "is refused" in text, text
    assert "Traceback" not in r.output


def test_a_chat_template_path_for_trl_is_bounded_too(tiny_model_dir, alpaca_file, tmp_path):
    bomb = tmp_path / "bomb.jinja"
    bomb.write_text("{% for i in range(100000) %}{{ 'z' * 100 }}{% endfor %}")
    args = cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o")
    r = runner.invoke(app, [*args, "--trainer-arg", f"chat_template_path={bomb}", "--dry-run"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert f"--trainer-arg chat_template_path={bomb}: the chat template rendered more than" in text, text
