"""posttrainllm/vision: a VLM told from its config; image-text rows checked and kept as file references (decoded
when a row is read, so memory follows the batch); images placed by TRL's rule; a chat template without generation
markers trains on each conversation's last message through prompt/completion rows."""

import re
from types import SimpleNamespace

import pytest
from conftest import write_jsonl
from vlm_models import build_llava, save_vlm, sft_row, write_images, write_sft_data

from posttrainllm.errors import UsageError
from posttrainllm.vision import data as vision_data
from posttrainllm.vision.detect import is_vision_config, is_vlm


@pytest.fixture(scope="module")
def processor():
    return build_llava()[1]


def run_config(dataset, **overrides):
    base = dict(command="sft", model="m", dataset=str(dataset), eval_dataset=None, eval_split=0.0, max_samples=None,
                seed=0, eval_split_seed=0, dataset_num_proc=None, train_on_prompt=False)  # fmt: skip
    return SimpleNamespace(**{**base, **overrides})


def test_a_vlm_is_told_from_its_config(tmp_path, tiny_model_dir):
    from transformers import Idefics3Config, LlamaConfig, LlavaConfig

    assert is_vision_config(LlavaConfig()) and is_vision_config(Idefics3Config())
    assert not is_vision_config(LlamaConfig())
    assert is_vlm(str(save_vlm("llava", tmp_path / "m"))) and not is_vlm(str(tiny_model_dir))


def test_images_are_file_references_decoded_when_a_row_is_read(processor, tmp_path):
    from datasets import Image

    data = write_sft_data(tmp_path, n=4)
    prepared = vision_data.prepare(run_config(data), processor, "sft")
    stored = prepared.train.data.column("images").to_pylist()
    assert [len(r) for r in stored] == [1] * 4
    assert all(ref["bytes"] is None and ref["path"].startswith(str(tmp_path)) for row in stored for ref in row)
    feature = prepared.train.features["images"].feature
    assert isinstance(feature, Image) and feature.decode
    assert prepared.train[0]["images"][0].size == (28, 28)


def test_image_paths_are_relative_to_the_dataset_folder_not_the_working_directory(processor, tmp_path, monkeypatch):
    data = write_sft_data(tmp_path / "data", n=2)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    prepared = vision_data.prepare(run_config(data), processor, "sft")
    assert prepared.train.data.column("images").to_pylist()[0][0]["path"] == str(tmp_path / "data" / "pics" / "red.png")


def test_string_contents_get_their_images_before_the_first_user_text(processor, tmp_path):
    images = write_images(tmp_path)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What color?"},
                {"role": "assistant", "content": "red"}]  # fmt: skip
    row = {"messages": messages, "images": [images["red"], images["blue"]]}
    prepared = vision_data.prepare(run_config(write_jsonl(tmp_path / "d.jsonl", [row, row])), processor, "sft")
    user = prepared.train[0]["messages"][1]["content"]
    assert [p["type"] for p in user] == ["image", "image", "text"] and user[2]["text"] == "What color?"
    assert [p["type"] for p in prepared.train[0]["messages"][0]["content"]] == ["text"]


def test_a_conversation_without_an_assistant_turn_is_refused_naming_its_row(processor, tmp_path):
    images = write_images(tmp_path)
    rows = [sft_row(images["red"], "red"), {"messages": [{"role": "user", "content": "hi"}], "images": []}]
    with pytest.raises(UsageError, match="row 2: the conversation has no assistant message"):
        vision_data.prepare(run_config(write_jsonl(tmp_path / "d.jsonl", rows)), processor, "sft")


def _without_markers(processor):
    import copy

    plain = copy.deepcopy(processor)
    plain.chat_template = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", processor.chat_template)
    return plain


def test_without_generation_markers_the_last_message_is_the_completion_and_carries_the_loss(processor, tmp_path):
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    plain = _without_markers(processor)
    prepared = vision_data.prepare(run_config(write_sft_data(tmp_path, n=2)), plain, "sft")
    assert prepared.loss.completion_only_loss and not prepared.loss.assistant_only_loss
    assert set(prepared.train.column_names) == {"prompt", "completion", "images"}
    rows = [prepared.train[i] for i in range(2)]
    batch = DataCollatorForVisionLanguageModeling(plain, completion_only_loss=True)(rows)
    for k, row in enumerate(rows):
        reply = plain.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        reply = reply[len(plain.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)) :]
        want = plain.tokenizer(reply, add_special_tokens=False)["input_ids"]
        labels = [t for t in batch["labels"][k].tolist() if t != -100]
        assert labels == want


def test_without_generation_markers_several_assistant_turns_are_refused(processor, tmp_path):
    images = write_images(tmp_path)
    row = sft_row(images["red"], "red")
    row["messages"] += [{"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]
    with pytest.raises(UsageError, match="row 1: .*no \\{% generation %\\} markers"):
        vision_data.prepare(run_config(write_jsonl(tmp_path / "d.jsonl", [row])), _without_markers(processor), "sft")


def test_a_processor_without_a_chat_template_is_refused(processor, tmp_path):
    import copy

    bare = copy.deepcopy(processor)
    bare.chat_template = None
    with pytest.raises(UsageError, match="has no chat template"):
        vision_data.prepare(run_config(write_sft_data(tmp_path, n=2)), bare, "sft")


def test_an_image_column_of_one_file_per_row_becomes_images(processor, tmp_path):
    images = write_images(tmp_path)
    rows = [{"messages": sft_row("", "red")["messages"], "image": str(tmp_path / images["red"])}] * 2  # absolute
    prepared = vision_data.prepare(run_config(write_jsonl(tmp_path / "d.jsonl", rows)), processor, "sft")
    assert prepared.train[1]["images"][0].size == (28, 28)
    assert set(prepared.train.column_names) == {"messages", "images"}


def test_preference_rows_keep_their_image_parts_in_the_prompt(processor, tmp_path):
    from vlm_models import write_preference_data

    prepared = vision_data.prepare(run_config(write_preference_data(tmp_path, n=2)), processor, "preference")
    row = prepared.train[0]
    assert [p["type"] for p in row["prompt"][0]["content"]] == ["image", "text"]
    assert row["chosen"][0]["role"] == "assistant" and len(row["images"]) == 1 and prepared.loss is None


def test_a_preference_row_with_an_image_but_no_image_part_names_its_row(processor, tmp_path):
    images = write_images(tmp_path)
    rows = [{"prompt": [{"role": "user", "content": [{"type": "text", "text": "Which?"}]}], "chosen": "red",
             "rejected": "blue", "images": [images["red"]]}]  # fmt: skip
    with pytest.raises(UsageError, match=r"row 1: 1 image\(s\) in 'images' but 0"):
        vision_data.prepare(run_config(write_jsonl(tmp_path / "d.jsonl", rows)), processor, "preference")


def test_preparing_the_data_decodes_no_image(processor, tmp_path, monkeypatch):
    """Only headers are read while the rows are checked: pixels are decoded when a row is read (a batch is built)."""
    from PIL import ImageFile

    data = write_sft_data(tmp_path, n=4)
    decoded = []
    original = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self) or original(self))
    prepared = vision_data.prepare(run_config(data), processor, "sft")
    assert decoded == []
    prepared.train[0]["images"][0].convert("RGB")
    assert decoded  # reading one row decodes its image


def test_an_image_removed_since_an_earlier_run_is_caught(processor, tmp_path):
    """The checks are not taken from datasets' cache of an earlier run on the same file."""
    data = write_sft_data(tmp_path, n=2)
    vision_data.prepare(run_config(data), processor, "sft")
    (tmp_path / "pics" / "red.png").unlink()
    with pytest.raises(UsageError, match="row 1: image file pics/red.png not found"):
        vision_data.prepare(run_config(data), processor, "sft")


def test_measuring_the_rows_against_max_length_decodes_no_image(processor, tmp_path, monkeypatch):
    """--max-length is checked from the images' sizes (their headers), once per distinct sizes, not their pixels."""
    from PIL import ImageFile

    from posttrainllm.vision import lengths

    data = write_sft_data(tmp_path, n=4)
    decoded, processed = [], []
    original = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self) or original(self))
    measure = lengths._Measure.image_tokens
    monkeypatch.setattr(
        lengths._Measure, "image_tokens", lambda self, s, *a: processed.append(s) or measure(self, s, *a)
    )
    vision_data.prepare(run_config(data, max_length=41), processor, "sft")
    assert decoded == [] and len(processed) == 4 and len(set(processed)) == 1
    with pytest.raises(UsageError, match=r"row 1 \(and 3 more of the 4 rows\).*--max-length 55 or more"):
        vision_data.prepare(run_config(data, max_length=40), processor, "sft")
