"""posttrainllm/rundir/layout.py, the leaf every room reads: atomic JSON records, the manifest of what posttrainllm
wrote, which checkpoints are there and complete, a finished run's record. No model, no torch."""

from __future__ import annotations

import hashlib
import json
import math

from posttrainllm.rundir import layout as L


def _checkpoint(out, step: int, *, complete: bool = True, files: dict[str, bytes] | None = None):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    files = files if files is not None else {"model.safetensors": b"weights", "sub/config.json": b"{}"}
    for name, data in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    if complete:
        (d / L.MARKER).write_text(json.dumps({"files": L.file_sizes(d)}))
    return d


def test_rank_and_world_size_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert L.is_rank0() and L.world_size() == 1
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert not L.is_rank0() and L.world_size() == 4


def test_write_json_writes_non_finite_numbers_as_null_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "r.json"
    L.write_json(path, {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (1, 2), "e": tmp_path})
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, None, {"c": None}], "d": [1, 2], "e": str(tmp_path)}
    assert path.read_text().endswith("\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    L.write_json(path, {"again": 1})  # replaces the record whole
    assert json.loads(path.read_text()) == {"again": 1}


def test_own_records_names_in_the_manifest_once(tmp_path):
    assert L.manifest(tmp_path) == set()  # no hidden folder yet
    L.own(tmp_path, ["model.safetensors", "tokenizer.json"])
    L.own(str(tmp_path), ["tokenizer.json", "config.json"])
    assert L.manifest(tmp_path) == {"model.safetensors", "tokenizer.json", "config.json"}
    saved = json.loads((tmp_path / L.HIDDEN / L.MANIFEST).read_text())
    assert saved == {"files": sorted(["config.json", "model.safetensors", "tokenizer.json"])}
    L.own(tmp_path, [])  # nothing new: nothing written
    assert L.manifest(tmp_path) == {"model.safetensors", "tokenizer.json", "config.json"}


def test_an_unreadable_manifest_lists_nothing(tmp_path):
    (tmp_path / L.HIDDEN).mkdir()
    for text in ("not json", "[1, 2]", '"files"'):
        (tmp_path / L.HIDDEN / L.MANIFEST).write_text(text)
        assert L.manifest(tmp_path) == set()


def test_file_sizes_lists_every_file_but_the_marker(tmp_path):
    d = _checkpoint(tmp_path, 5, files={"a.bin": b"12345", "nested/b.json": b"{}"})
    assert L.file_sizes(d) == {"a.bin": 5, "nested/b.json": 2}


def test_listed_files_problem_names_what_does_not_match(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"123")
    assert L.listed_files_problem(tmp_path, {"a.bin": 3}, "record") is None
    assert "does not list the files" in L.listed_files_problem(tmp_path, {}, "record")
    assert "does not list the files" in L.listed_files_problem(tmp_path, ["a.bin"], "record")
    assert L.listed_files_problem(tmp_path, {"gone.bin": 1}, "record") == "gone.bin is missing"
    assert L.listed_files_problem(tmp_path, {"a.bin": 4}, "record") == "a.bin has 3 bytes, its record says 4"


def test_a_checkpoint_is_complete_only_with_its_marker_and_every_listed_file(tmp_path):
    good = _checkpoint(tmp_path, 10)
    assert L.verify_checkpoint(good) is None
    cut = _checkpoint(tmp_path, 20, complete=False)
    assert "no COMPLETE marker" in L.verify_checkpoint(cut)
    (good / "model.safetensors").write_bytes(b"w")  # truncated after the marker was written
    assert "model.safetensors has 1 bytes" in L.verify_checkpoint(good)
    garbled = _checkpoint(tmp_path, 30)
    (garbled / L.MARKER).write_text("{not json")
    assert "does not list the files" in L.verify_checkpoint(garbled)


def test_checkpoints_are_listed_by_step_and_links_apart(tmp_path):
    assert L.checkpoint_dirs(tmp_path / "missing") == [] and L.linked_checkpoints(tmp_path / "missing") == []
    for step in (9, 100, 10):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-7").write_text("a file, not a checkpoint")
    (tmp_path / "checkpoint-x").mkdir()
    (tmp_path / "checkpoint-200").symlink_to(tmp_path / "checkpoint-100")
    assert [d.name for d in L.checkpoint_dirs(tmp_path)] == ["checkpoint-9", "checkpoint-10", "checkpoint-100"]
    assert [d.name for d in L.linked_checkpoints(tmp_path)] == ["checkpoint-200"]
    assert L.checkpoint_step(tmp_path / "checkpoint-100") == 100


def test_the_newest_good_checkpoint_skips_incomplete_ones(tmp_path):
    assert L.newest_good_checkpoint(tmp_path) is None
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 3, complete=False)
    assert L.newest_good_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert L.newest_good_checkpoint(str(tmp_path)) == tmp_path / "checkpoint-2"


def test_a_finished_run_needs_its_record_and_the_files_it_lists(tmp_path):
    assert L.finished_run(tmp_path) is None
    (tmp_path / L.FINAL_MARKER).write_text("[]")
    assert L.finished_run(tmp_path) is None  # not a record
    (tmp_path / L.FINAL_MARKER).write_text(json.dumps({"step": 4}))
    assert L.finished_run(tmp_path) == {"step": 4}  # an older record lists no files
    (tmp_path / "model.safetensors").write_bytes(b"12")
    done = {"step": 4, "files": {"model.safetensors": 2}}
    (tmp_path / L.FINAL_MARKER).write_text(json.dumps(done))
    assert L.finished_run(tmp_path) == done
    (tmp_path / "model.safetensors").write_bytes(b"1")
    assert L.finished_run(tmp_path) is None


def test_sha256_reads_the_whole_file(tmp_path):
    data = b"x" * ((1 << 22) + 7)  # more than one 4 MiB chunk
    (tmp_path / "f").write_bytes(data)
    assert L.sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_a_runs_own_records_include_the_run_config_and_the_final_marker():
    assert {L.RUN_CONFIG, L.FINAL_MARKER, L.PROBE, L.SELF_REPLAY} <= L.OWN_RECORDS
    assert L.CKPT_DIR.match("checkpoint-12").group(1) == "12" and not L.CKPT_DIR.match("checkpoint-12a")
