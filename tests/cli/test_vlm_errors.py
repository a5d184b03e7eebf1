"""Image-text data that cannot train exits 2 with one line naming the row and the path, before any model loads: a
missing image file, a file that is no image, an image count that does not match the image parts, image data given
to a text-only model; and what a vision-language run does not take yet (kto, --packing) is refused at once."""

import json

import pytest
from conftest import write_jsonl
from harness import run_args
from typer.testing import CliRunner
from vlm_models import save_vlm, sft_row, write_images, write_sft_data

from posttrainllm.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return save_vlm("llava", tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture
def no_model_load(monkeypatch):
    """The model must not load: every error here comes before it."""
    from posttrainllm import models

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", refuse)


def _one_line_exit_2(r):
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def _rows_with(tmp_path, bad_row, n=3):
    images = write_images(tmp_path)
    rows = [sft_row(images["red"], "red") for _ in range(n)]
    rows[1] = bad_row(images)
    return write_jsonl(tmp_path / "data.jsonl", rows)


def test_a_missing_image_file_names_the_row_and_the_path(llava_dir, tmp_path, no_model_load):
    data = _rows_with(tmp_path, lambda images: sft_row("pics/absent.png", "red"))
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o")))
    assert "row 2" in out and "pics/absent.png" in out and "not found" in out


def test_a_file_that_is_no_image_names_the_row(llava_dir, tmp_path, no_model_load):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "notes.png").write_text("not an image")
    data = _rows_with(tmp_path, lambda images: sft_row("pics/notes.png", "red"))
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o")))
    assert "row 2" in out and "pics/notes.png" in out and "PIL" in out


def test_more_images_than_image_parts_names_the_row_and_both_counts(llava_dir, tmp_path, no_model_load):
    def two_images(images):
        row = sft_row(images["red"], "red")
        row["images"] = [images["red"], images["blue"]]
        return row

    data = _rows_with(tmp_path, two_images)
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o")))
    assert "row 2" in out and "2 image(s)" in out and '1 {"type": "image"} part(s)' in out


def test_image_data_for_a_text_only_model_exits_2(tiny_model_dir, tmp_path, no_model_load):
    data = write_sft_data(tmp_path)
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", tiny_model_dir, data, tmp_path / "o")))
    assert "'images' column" in out and "text-only" in out


def test_generate_with_an_image_on_a_text_only_model_exits_2(tiny_model_dir, tmp_path, no_model_load):
    image = write_images(tmp_path)["red"]
    r = runner.invoke(app, ["generate", "--model", str(tiny_model_dir), "--image", str(tmp_path / image),
                            "--prompt", "What color?"])  # fmt: skip
    assert "text-only" in _one_line_exit_2(r)


@pytest.mark.parametrize(
    "command, extra, fragment",
    [("kto", (), "kto does not train one yet"), ("sft", ("--packing",), "--packing is not supported")],
)
def test_what_a_vision_run_does_not_take_exits_2(command, extra, fragment, llava_dir, tmp_path, no_model_load):
    data = write_sft_data(tmp_path)
    if command == "kto":
        rows = [json.loads(line) | {"label": True} for line in data.read_text().splitlines()]
        data = write_jsonl(tmp_path / "kto.jsonl", rows)
    r = runner.invoke(app, run_args(command, llava_dir, data, tmp_path / "o", *extra))
    assert fragment in _one_line_exit_2(r)


def test_image_eval_data_for_a_text_only_model_exits_2(tiny_model_dir, alpaca_file, tmp_path, no_model_load):
    data = write_sft_data(tmp_path)
    r = runner.invoke(app, run_args("sft", tiny_model_dir, alpaca_file, tmp_path / "o", "--eval-dataset", data))
    out = _one_line_exit_2(r)
    assert out.startswith("error: --eval-dataset") and "text-only" in out
