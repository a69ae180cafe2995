"""`hf_condinit.glue.suite_task_files`: where run_glue.py's ``--glue_suite`` finds each task's local files."""

import json

import pytest

from hf_condinit.glue import suite_task_files


def test_glue_distribution_layout(tmp_path):
    """Under ``--glue_data_dir``: the distribution's folder names, the first candidate of each split; MNLI's matched
    dev file is its validation and its mismatched one is kept; a task without a folder has no files (the hub's)."""
    for path in ("MNLI/train.tsv", "MNLI/dev_matched.tsv", "MNLI/dev_mismatched.tsv", "RTE/train.tsv", "RTE/dev.tsv",
                 "RTE/dev.csv", "RTE/dev_mismatched.tsv", "STS-B/train.jsonl"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("x")
    assert suite_task_files("mnli", None, str(tmp_path)) == {
        "train": str(tmp_path / "MNLI/train.tsv"), "validation": str(tmp_path / "MNLI/dev_matched.tsv"),
        "validation_mismatched": str(tmp_path / "MNLI/dev_mismatched.tsv")}
    assert suite_task_files("rte", None, str(tmp_path)) == {
        "train": str(tmp_path / "RTE/train.tsv"), "validation": str(tmp_path / "RTE/dev.tsv")}
    assert suite_task_files("stsb", None, str(tmp_path)) == {"train": str(tmp_path / "STS-B/train.jsonl")}
    assert suite_task_files("cola", None, str(tmp_path)) == {}
    assert suite_task_files("cola", None, None) == {}


def test_suite_files_json_wins_with_paths_relative_to_it(tmp_path):
    mapping = {"rte": {"train": "rte/train.tsv", "validation": str(tmp_path / "abs.tsv")}}
    (tmp_path / "files.json").write_text(json.dumps(mapping))
    (tmp_path / "RTE").mkdir()
    (tmp_path / "RTE" / "train.tsv").write_text("x")
    assert suite_task_files("rte", str(tmp_path / "files.json"), str(tmp_path)) == {
        "train": str(tmp_path / "rte/train.tsv"), "validation": str(tmp_path / "abs.tsv")}
    # a task the JSON does not list falls back to --glue_data_dir
    assert suite_task_files("mrpc", str(tmp_path / "files.json"), str(tmp_path)) == {}


@pytest.mark.parametrize("mapping, message", [
    ({"rtee": {"train": "a"}}, r"unknown tasks \['rtee'\]"),
    ({"rte": {"dev": "a"}}, r"task rte: unknown keys \['dev'\]"),
])
def test_suite_files_json_errors(tmp_path, mapping, message):
    (tmp_path / "files.json").write_text(json.dumps(mapping))
    with pytest.raises(ValueError, match=message):
        suite_task_files("rte", str(tmp_path / "files.json"), None)
