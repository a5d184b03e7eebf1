"""The per-tower schedule end to end on more VLM families (tests/vlm_models.py: Gemma 3, PaliGemma, LLaVA with a
SigLIP tower, LLaVA-NeXT), through `posttrainllm sft` at schedule values of their own (γ=0.8, γ_v=0.6, projector
×0.5): every parameter is in exactly one group of param_groups.json at the closed-form LR of its tower, depth and
factor (tests/tower_families.py), Adam's first step moves each tensor by that LR, the output loads with its
processor, and `generate --image` answers. --freeze-vision leaves the tower out and unmoved; a template without
generation markers trains on the last reply; processors that rewrite the text (PaliGemma, Mllama), take no text
alone (PaliGemma) or miss an optional package (Qwen2-VL and SmolVLM without torchvision) are refused with one line
that names the fix."""

import json

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner
from vlm_models import save_vlm, write_images, write_sft_data

from posttrainllm.cli import app

pytestmark = pytest.mark.smoke
runner = CliRunner()
# vlm_models family -> its module paths in tower_families.FAMILIES
PATHS = {"gemma3": "gemma3", "paligemma": "paligemma", "llava_siglip": "llava_siglip", "llava_next": "llava_next"}
SCHEDULE = dict(gamma=0.8, gamma_v=0.6, proj=0.5, n=2, m=2, base=1e-3)
FLAGS = ["--llrd", "0.8", "--vision-llrd", "0.6", "--projector-lr-scale", "0.5"]
# PaliGemma's processor inserts a BOS after the image tokens: the template's assistant mask would miss the reply,
# so its sft puts the loss on every token (the last test below)
LOSS = {"paligemma": ["--train-on-prompt"]}


def _sft_one_step(model_dir, tmp_path, *extra):
    """One sft step at lr 1e-3 with Adam's epsilon ~0 (the first step is lr × sign(gradient) even where a tiny
    tower's gradient is ~1e-8), no warmup and no weight decay: the output directory."""
    data, out = write_sft_data(tmp_path / "data", n=4), tmp_path / "out"
    args = run_args("sft", model_dir, data, out, *extra, steps=1, batch=2, max_length=128, lr="1e-3")
    args += ["--weight-decay", "0", "--warmup-ratio", "0", "--trainer-arg", "adam_epsilon=1e-20"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads((out / "training_complete.json").read_text())["global_step"] == 1
    return out


def _planned(out) -> dict[str, float]:
    """param_groups.json as parameter -> LR, each parameter in exactly one group."""
    planned: dict[str, float] = {}
    for g in json.loads((out / "param_groups.json").read_text()):
        for name in g["params"]:
            assert name not in planned, name
            planned[name] = g["lr"]
    return planned


def _changes(model_dir, out) -> dict[str, float]:
    """max |ΔW| of every parameter between the model and the trained output (both loaded as saved)."""
    from transformers import AutoModelForImageTextToText

    before = dict(AutoModelForImageTextToText.from_pretrained(model_dir).named_parameters())
    after = dict(AutoModelForImageTextToText.from_pretrained(out).named_parameters())
    assert sorted(before) == sorted(after)
    return {n: (after[n] - before[n]).abs().max().item() for n in before}


@pytest.mark.parametrize("family", list(PATHS))
def test_sft_trains_each_tower_at_its_closed_form_lr_and_answers(family, tmp_path):
    from tower_families import expected_lr
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir = save_vlm(family, tmp_path / "m")
    out = _sft_one_step(model_dir, tmp_path, *FLAGS, *LOSS.get(family, []))
    planned, changes = _planned(out), _changes(model_dir, out)
    assert sorted(planned) == sorted(changes)
    for name, lr in planned.items():
        assert lr == pytest.approx(expected_lr(PATHS[family], name, **SCHEDULE), rel=1e-9), name
    moved = [n for n, lr in planned.items() if changes[n] > 0.1 * lr]  # a tensor with a gradient
    for name in moved:
        assert changes[name] == pytest.approx(planned[name], rel=2e-3), name
    assert len(moved) >= 0.8 * len(planned)
    for prefix in {p for p in _tower_prefixes(PATHS[family])}:
        assert any(n.startswith(prefix) for n in moved), f"nothing under {prefix} moved"
    processor = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    source = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert type(model).__name__ == type(source).__name__

    def tied(m):
        return m.get_output_embeddings().weight is m.get_input_embeddings().weight

    assert tied(model) == tied(source)  # Gemma 3 and PaliGemma tie them: still one tensor
    assert tied(source) == (family in ("gemma3", "paligemma"))
    assert type(processor).__name__ == type(AutoProcessor.from_pretrained(model_dir)).__name__
    image = tmp_path / "data" / write_images(tmp_path / "data")["green"]
    r = runner.invoke(app, cli_args("generate", out, image=image, prompt="What color is the square?",
                                    max_new_tokens=4))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output[:-1], "no answer printed"  # a tiny random model's answer may be whitespace (PaliGemma's is)


def _tower_prefixes(paths: str) -> tuple[str, ...]:
    """Each tower's top-level module paths: both vision blocks, the projector(s), both decoder blocks."""
    from tower_families import FAMILIES

    _, vblock, _, projector, block, _ = FAMILIES[paths]
    return (f"{vblock}0.", f"{vblock}1.", *projector, f"{block}0.", f"{block}1.")


def test_freeze_vision_leaves_the_tower_out_and_unmoved_and_the_rest_at_its_lr(tmp_path):
    """--freeze-vision on LLaVA-NeXT: no vision parameter is in param_groups.json or moves; the projector (with its
    image_newline) and the decoder train at their closed-form LRs."""
    from tower_families import FAMILIES, expected_lr

    model_dir = save_vlm("llava_next", tmp_path / "m")
    out = _sft_one_step(model_dir, tmp_path, "--llrd", "0.8", "--projector-lr-scale", "0.5", "--freeze-vision")
    planned, changes = _planned(out), _changes(model_dir, out)
    _, _, vision, projector, _, _ = FAMILIES["llava_next"]
    tower = {n for n in changes if n.startswith(vision) and not n.startswith(projector)}
    assert tower and not tower & set(planned)
    assert set(planned) | tower == set(changes)
    assert all(changes[n] == 0 for n in tower)
    for name, lr in planned.items():
        assert lr == pytest.approx(expected_lr("llava_next", name, **{**SCHEDULE, "gamma_v": 1.0}), rel=1e-9), name
        assert changes[name] == pytest.approx(lr, rel=2e-3), name


def test_a_template_without_generation_markers_trains_on_the_last_reply(tmp_path, captured_trainer):
    """A chat template without `{% generation %}` markers (LLaVA-SigLIP): each conversation is split into
    prompt/completion and only the completion (the assistant's reply and its end of turn) carries loss; image
    tokens and the user's turn carry none."""
    model_dir = save_vlm("llava_siglip", tmp_path / "m", markers=False)
    data, out = write_sft_data(tmp_path / "data", n=4), tmp_path / "out"
    r = runner.invoke(app, run_args("sft", model_dir, data, out, steps=1, batch=2, max_length=128))
    assert r.exit_code == 0, r.output
    assert "the last (assistant) message of each conversation" in " ".join(r.output.split())
    trainer = captured_trainer[0]
    rows = [trainer.train_dataset[i] for i in range(2)]
    assert all(set(row) >= {"prompt", "completion"} for row in rows)
    batch = trainer.data_collator(rows)
    tok = trainer.processing_class.tokenizer
    image_id = tok.convert_tokens_to_ids("<image>")
    for k, row in enumerate(rows):
        ids, labels = batch["input_ids"][k].tolist(), batch["labels"][k].tolist()
        kept = [i for i, label in enumerate(labels) if label != -100]
        assert all(labels[i] == ids[i] for i in kept)
        reply = row["completion"][-1]["content"][0]["text"] + "<|im_end|>"
        assert tok.decode([ids[i] for i in kept]).strip() == reply
        assert image_id in ids and all(labels[i] == -100 for i, t in enumerate(ids) if t == image_id)


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.skipif(_installed("torchvision"), reason="torchvision is installed: these processors load")
@pytest.mark.parametrize("family, part", [("qwen2_vl", "Qwen2VLVideoProcessor"), ("smolvlm", "SmolVLMVideoProcessor")])
def test_a_processor_missing_its_optional_package_exits_1_naming_it(family, part, tmp_path):
    """Qwen2-VL's and SmolVLM's processors need their video processor, which needs torchvision, even for images: sft
    and generate exit 1 with one line naming the part, the package and how to install it, before training."""
    from vlm_models import SAVED_WITHOUT_PROCESSOR

    model_dir = SAVED_WITHOUT_PROCESSOR[family](tmp_path / family)
    data = write_sft_data(tmp_path / "data", n=2)
    image = tmp_path / "data" / write_images(tmp_path / "data")["red"]
    for args in (
        run_args("sft", model_dir, data, tmp_path / "out", steps=1),
        cli_args("generate", model_dir, image=image, prompt="What color?"),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 1, r.output
        line = r.output.strip().splitlines()[-1]
        assert line.startswith("error: ") and "Traceback" not in r.output
        assert f"{part} needs torchvision" in line and "pip install torchvision" in line
    assert not (tmp_path / "out" / "training_complete.json").exists()


def test_a_processor_that_rewrites_the_text_or_needs_images_is_refused_before_the_model_loads(tmp_path):
    """PaliGemma's processor puts a BOS after the image tokens (the template's assistant mask would fall on other
    tokens) and takes no text without images (TRL's collators process completions alone): sft with the markers,
    sft without them and dpo exit 2 with one line naming the fix; --train-on-prompt trains."""
    from vlm_models import write_preference_data

    marked, unmarked = save_vlm("paligemma", tmp_path / "m"), save_vlm("paligemma", tmp_path / "u", markers=False)
    data, pairs = write_sft_data(tmp_path / "data", n=4), write_preference_data(tmp_path / "data", n=4)
    for args, what, fix in (
        (run_args("sft", marked, data, tmp_path / "o1"), "the assistant mask of its chat", "--train-on-prompt"),
        (run_args("sft", unmarked, data, tmp_path / "o2"), "takes no text without images", "--train-on-prompt"),
        (run_args("dpo", marked, pairs, tmp_path / "o3"), "takes no text without images", "dpo cannot train this"),
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output  # one line, no banner
        assert what in r.output and fix in r.output, r.output
    r = runner.invoke(app, run_args("sft", marked, data, tmp_path / "o4", "--train-on-prompt", steps=1))
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o4" / "training_complete.json").read_text())["global_step"] == 1


def test_mllama_trains_on_every_token_and_answers_its_assistant_mask_refused(tmp_path):
    """Mllama's processor puts a BOS before the text, so the template's assistant mask is refused (exit 2, before
    the model loads); with --train-on-prompt it trains with the per-tower flags, every parameter in one group, and
    the output loads with its processor and answers an image prompt."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model_dir = save_vlm("mllama", tmp_path / "m")
    data = write_sft_data(tmp_path / "data", n=4)
    r = runner.invoke(app, run_args("sft", model_dir, data, tmp_path / "refused"))
    assert r.exit_code == 2 and "the assistant mask of its chat template" in r.output, r.output
    out = _sft_one_step(model_dir, tmp_path, *FLAGS, "--train-on-prompt")
    names = {n for n, _ in AutoModelForImageTextToText.from_pretrained(out).named_parameters()}
    assert set(_planned(out)) == names
    assert type(AutoProcessor.from_pretrained(out)).__name__ == "MllamaProcessor"
    image = tmp_path / "data" / write_images(tmp_path / "data")["blue"]
    r = runner.invoke(app, cli_args("generate", out, image=image, prompt="What color?", max_new_tokens=4))
    assert r.exit_code == 0, r.output
    assert r.output[:-1], "no answer printed"
