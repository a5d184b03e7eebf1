"""Vision-language models end to end, on tiny LLaVA (CLIP and SigLIP towers), LLaVA-NeXT, Idefics3 and Gemma 3
models built here with drawn images: sft trains 2 steps with the loss on the assistant's reply only (image tokens
and the user's turn carry none), saves a model that loads with its processor, and generate answers an image prompt;
dpo trains on image preference pairs."""

import json

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner
from vlm_models import TRAINED, save_vlm, write_images, write_preference_data, write_sft_data

from posttrainllm.cli import app

pytestmark = pytest.mark.smoke
runner = CliRunner()


@pytest.fixture(scope="module", params=TRAINED)
def vlm_dir(request, tmp_path_factory):
    return save_vlm(request.param, tmp_path_factory.mktemp(f"tiny-{request.param}"))


def _reply_positions(input_ids: list[int], reply: list[int]) -> set[int]:
    """The positions of the last occurrence of `reply` in `input_ids`."""
    for start in range(len(input_ids) - len(reply), -1, -1):
        if input_ids[start : start + len(reply)] == reply:
            return set(range(start, start + len(reply)))
    raise AssertionError(f"reply {reply} not in {input_ids}")


def check_assistant_only_labels(trainer, processor):
    """Collate two training rows: labels equal the input ids on the assistant's reply and its end-of-turn token,
    -100 everywhere else (the image tokens, the user's turn, the headers, padding)."""
    rows = [trainer.train_dataset[i] for i in range(2)]
    replies = [r["messages"][-1]["content"][0]["text"] + "<|im_end|>" for r in rows]
    batch = trainer.data_collator(rows)
    tok = processor.tokenizer
    image_id = getattr(tok, "image_token_id", None) or tok.convert_tokens_to_ids("<image>")
    for k, reply in enumerate(replies):
        ids, labels = batch["input_ids"][k].tolist(), batch["labels"][k].tolist()
        kept = _reply_positions(ids, processor.tokenizer(reply, add_special_tokens=False)["input_ids"])
        assert {i for i, label in enumerate(labels) if label != -100} == kept
        assert all(labels[i] == ids[i] for i in kept)
        image_positions = [i for i, t in enumerate(ids) if t == image_id]
        assert image_positions and all(labels[i] == -100 for i in image_positions)


def test_sft_trains_saves_with_its_processor_and_generate_answers(vlm_dir, tmp_path, captured_trainer):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    data, out = write_sft_data(tmp_path / "data", n=4), tmp_path / "out"
    r = runner.invoke(app, run_args("sft", vlm_dir, data, out, steps=2, batch=2, max_length=128))
    assert r.exit_code == 0, r.output
    assert json.loads((out / "training_complete.json").read_text())["global_step"] == 2
    processor = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model).__name__ == type(AutoModelForImageTextToText.from_pretrained(vlm_dir)).__name__
    assert processor.chat_template and type(processor).__name__ == type(AutoProcessor.from_pretrained(vlm_dir)).__name__
    check_assistant_only_labels(captured_trainer[0], processor)
    # padding-free batches take no images: padded, and the banner says why
    assert "padded: a vision-language model" in " ".join(r.output.split()) and not captured_trainer[0].padding_free
    assert json.loads((out / "run_config.json").read_text())["padding_free_used"] is False

    image = tmp_path / "data" / write_images(tmp_path / "data")["green"]
    r = runner.invoke(app, cli_args("generate", out, image=image, prompt="What color is the square?",
                                    max_new_tokens=8))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output.strip()


def test_dpo_trains_on_image_preference_pairs(vlm_dir, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    data, out = write_preference_data(tmp_path / "data", n=4), tmp_path / "out"
    r = runner.invoke(app, run_args("dpo", vlm_dir, data, out, steps=2, batch=2, max_length=128))
    assert r.exit_code == 0, r.output
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert any("rewards/margins" in h for h in state["log_history"])
    AutoProcessor.from_pretrained(out)
    AutoModelForImageTextToText.from_pretrained(out)


def test_a_lora_adapter_of_a_vlm_trains_and_answers_an_image_prompt(tmp_path):
    """--lora-r on a VLM saves an adapter (with an eval split of the image data); generate finds that its base is a
    VLM (from adapter_config.json)."""
    model = save_vlm("llava", tmp_path / "llava")
    data, out = write_sft_data(tmp_path / "data", n=8), tmp_path / "out"
    r = runner.invoke(app, run_args("sft", model, data, out, "--lora-r", "4", "--eval-split", "0.25", steps=2, batch=2,
                                    max_length=128))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "eval_loss" in json.loads((out / "eval_results.json").read_text())["train"]
    assert (out / "adapter_config.json").is_file() and not (out / "config.json").exists()
    image = tmp_path / "data" / write_images(tmp_path / "data")["red"]
    r = runner.invoke(app, cli_args("generate", out, image=image, prompt="What color?", max_new_tokens=8))
    assert r.exit_code == 0, r.output
    assert r.output.strip()


def test_generate_answers_a_prompts_file_with_images(vlm_dir, tmp_path):
    """--prompts JSON Lines on a VLM: each record's images (relative to the file) go with its prompt; a string prompt
    gets them before its text, messages place them with their image parts; a record without images is text only."""
    images = write_images(tmp_path)
    rows = [
        {"prompt": "What color is the square?", "images": [images["red"]]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                                   {"type": "image"}]}], "images": [images["red"], images["blue"]]},
        {"prompt": "Say hello."},
    ]  # fmt: skip
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "answers.jsonl"
    r = runner.invoke(app, cli_args("generate", vlm_dir, prompts=prompts, output=out, max_new_tokens=4))
    assert r.exit_code == 0, r.output
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(a.get("images", [])) for a in answers] == [1, 2, 0]
    assert all(isinstance(a["completion"], str) for a in answers)
    rows[0]["images"] = ["pics/absent.png"]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = runner.invoke(app, cli_args("generate", vlm_dir, prompts=prompts, output=tmp_path / "again.jsonl"))
    assert r.exit_code == 2 and "line 1: image file pics/absent.png not found" in r.output


@pytest.mark.parametrize("family, paths", [("llava", "llava_clip"), ("idefics3", "idefics3")])
def test_sft_trains_each_tower_at_its_closed_form_lr(family, paths, tmp_path):
    """The per-tower schedule through the command line: every parameter is in exactly one group of
    param_groups.json with the LR of its tower, depth and factor, and Adam's first step moves each tensor by that
    LR (max |ΔW| = lr when its gradient is not ~0)."""
    from tower_families import expected_lr
    from transformers import AutoModelForImageTextToText

    model_dir, data, out = save_vlm(family, tmp_path / "m"), write_sft_data(tmp_path / "data", n=4), tmp_path / "o"
    schedule = dict(gamma=0.5, gamma_v=0.7, proj=2.0, n=2, m=2, base=1e-3)
    args = run_args("sft", model_dir, data, out, steps=1, batch=2, max_length=128, lr="1e-3")
    args += ["--llrd", "0.5", "--vision-llrd", "0.7", "--projector-lr-scale", "2", "--weight-decay", "0"]
    # Adam's epsilon ~0: the first step is lr × sign(gradient) even where a tiny tower's gradient is ~1e-8
    r = runner.invoke(app, [*args, "--warmup-ratio", "0", "--trainer-arg", "adam_epsilon=1e-20"])
    assert r.exit_code == 0, r.output
    names = [n for n, _ in AutoModelForImageTextToText.from_pretrained(model_dir).named_parameters()]
    planned = {}
    for g in json.loads((out / "param_groups.json").read_text()):
        for name in g["params"]:
            assert name not in planned, name
            planned[name] = g["lr"]
    assert sorted(planned) == sorted(names)
    for name, lr in planned.items():
        assert lr == pytest.approx(expected_lr(paths, name, **schedule), rel=1e-9), name
    before = dict(AutoModelForImageTextToText.from_pretrained(model_dir).named_parameters())
    after = dict(AutoModelForImageTextToText.from_pretrained(out).named_parameters())
    moved = 0
    for name, lr in planned.items():
        change = (after[name] - before[name]).abs().max().item()
        if change > 0.1 * lr:  # a tensor with a gradient (a CLIP post-norm after the used layer gets none)
            assert change == pytest.approx(lr, rel=2e-3), name
            moved += 1
    assert moved >= 0.8 * len(planned)
