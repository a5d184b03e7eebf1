"""Image-text data that cannot train exits 2 with one line naming the row and the path, before any model loads: a
missing image file, a file that is no image, an image count that does not match the image parts, image data given
to a text-only model; and what a vision-language run does not take yet (kto, --packing) is refused at once."""

import json

import pytest
from conftest import write_jsonl
from harness import run_args
from typer.testing import CliRunner
from vlm_models import save_vlm, sft_row, write_images, write_preference_data, write_sft_data

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


# ------------------------------------------------------------------------- rows cut by --max-length, odd image files
def test_a_max_length_that_cuts_every_answer_exits_2_naming_the_row_and_the_length_needed(
    llava_dir, tmp_path, no_model_load
):
    """The tiny LLaVA's row: 40 tokens up to the answer (5 of them the image's), 55 in all: at --max-length 30
    truncation would keep the image and drop the answer, and the run would train on nothing."""
    data = write_sft_data(tmp_path)
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o", max_length=30)))
    assert "row 1" in out and "--max-length 30" in out and "--max-length 55 or more" in out
    assert not (tmp_path / "o").exists()


def test_one_row_whose_answer_would_be_cut_is_named(llava_dir, tmp_path, no_model_load):
    def long_question(images):
        row = sft_row(images["red"], "red")
        row["messages"][0]["content"][1]["text"] = "What color is the square? " * 8
        return row

    data = _rows_with(tmp_path, long_question)
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o", max_length=64)))
    assert "row 2" in out and "row 1" not in out and "answer" in out and "--max-length 64" in out


def test_dpo_pairs_whose_answers_would_be_cut_exit_2(llava_dir, tmp_path, no_model_load):
    data = write_preference_data(tmp_path)
    out = _one_line_exit_2(runner.invoke(app, run_args("dpo", llava_dir, data, tmp_path / "o", max_length=20)))
    assert "row 1" in out and "--max-length 20" in out and "answer" in out


def test_rows_that_keep_part_of_their_answer_train_on_what_is_kept(llava_dir, tmp_path):
    from posttrainllm.commands.registry import to_config
    from posttrainllm.models import load_processor
    from posttrainllm.vision import data as vision_data

    data = write_sft_data(tmp_path)
    cfg = to_config("sft", ["--model", str(llava_dir), "--dataset", str(data), "--output-dir", str(tmp_path / "o"),
                              "--max-length", "41"])  # fmt: skip
    prepared = vision_data.prepare(cfg, load_processor(str(llava_dir)), "sft")
    assert prepared.n_train == 4


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels (1-bit grey) and holds no pixel data: what PIL's header check reads."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_a_decompression_bomb_is_one_line_naming_the_row_and_the_path(llava_dir, tmp_path, no_model_load):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "bomb.png").write_bytes(_png_header(20000, 20000))
    data = _rows_with(tmp_path, lambda images: sft_row("pics/bomb.png", "red"))
    r = runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o"))
    assert r.exit_code == 1, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert "row 2" in r.output and "pics/bomb.png" in r.output and "pixels" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("kind, words", [("loop", "symlink loop"), ("dir", "a directory"), ("fifo", "FIFO")])
def test_an_image_path_that_is_no_file_says_what_it_is(kind, words, llava_dir, tmp_path, no_model_load):
    import os

    pics = tmp_path / "pics"
    pics.mkdir()
    target = pics / "odd.png"
    if kind == "loop":
        target.symlink_to(target)
    elif kind == "dir":
        target.mkdir()
    else:
        os.mkfifo(target)
    data = _rows_with(tmp_path, lambda images: sft_row("pics/odd.png", "red"))
    out = _one_line_exit_2(runner.invoke(app, run_args("sft", llava_dir, data, tmp_path / "o")))
    assert "row 2" in out and "pics/odd.png" in out and words in out and "not found" not in out


@pytest.mark.parametrize("kind, words", [("loop", "symlink loop"), ("dir", "a directory"), ("absent", "not found")])
def test_generate_image_that_is_no_file_says_what_it_is(kind, words, llava_dir, tmp_path, no_model_load):
    target = tmp_path / "odd.png"
    if kind == "loop":
        target.symlink_to(target)
    elif kind == "dir":
        target.mkdir()
    r = runner.invoke(app, ["generate", "--model", str(llava_dir), "--image", str(target), "--prompt", "What?"])
    out = _one_line_exit_2(r)
    assert "--image" in out and words in out and ("does not exist" not in out)
