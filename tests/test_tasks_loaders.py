"""Loading local task files (JSONL, JSON, Parquet) in GSM8K / MATH / AIME / HotpotQA shapes, and their errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench.tasks import (
    EmptyTaskFileError,
    MalformedTaskFileError,
    MissingFieldError,
    Task,
    TaskError,
    TaskFileNotFoundError,
    generate,
    load_tasks,
    save_jsonl,
)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_gsm8k_jsonl(tmp_path):
    path = write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            {"question": "Big sum?", "answer": "It is large.\n#### 1,234"},
        ],
    )
    tasks = load_tasks(path)
    assert [t.answer for t in tasks] == ["7", "1234"]
    assert tasks[0].metadata["rationale"].startswith("3 + 4")
    assert tasks[0].verifier == "boxed_math"
    assert [t.id for t in tasks] == ["gsm8k-0", "gsm8k-1"]
    assert tasks[1].question == "Big sum?"


def test_hotpotqa_jsonl_keeps_other_fields(tmp_path):
    record = {
        "_id": "5a8b57f25542995d1e6f1371",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "answer": "yes",
        "type": "comparison",
        "level": "hard",
        "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
        "context": [["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]]],
    }
    (task,) = load_tasks(write_jsonl(tmp_path / "hotpot_dev.jsonl", [record]))
    assert task.id == "5a8b57f25542995d1e6f1371"
    assert task.answer == "yes" and task.verifier == "f1"
    assert task.metadata["fields"]["level"] == "hard"
    assert task.metadata["fields"]["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0]]
    assert load_tasks(tmp_path / "hotpot_dev.jsonl", verifier="exact")[0].verifier == "exact"


def test_math_parquet_extracts_last_boxed(tmp_path):
    path = tmp_path / "math.parquet"
    pd.DataFrame(
        {
            "problem": ["Compute $\\frac{1}{2}+\\frac{1}{2}$.", "Find x."],
            "solution": ["We add: $\\boxed{1}$.", "So $x = \\boxed{\\frac{3}{4}}$ and done."],
            "level": ["Level 1", "Level 3"],
            "type": ["Algebra", "Algebra"],
        }
    ).to_parquet(path)
    tasks = load_tasks(path)
    assert [t.answer for t in tasks] == ["1", "\\frac{3}{4}"]
    assert all(t.verifier == "boxed_math" for t in tasks)
    assert tasks[1].metadata["solution"].startswith("So $x")
    assert tasks[0].metadata["fields"] == {"level": "Level 1", "type": "Algebra"}


def test_aime_parquet_with_int_answers_and_case_insensitive_fields(tmp_path):
    path = tmp_path / "aime24.parquet"
    pd.DataFrame({"ID": ["2024-I-1", "2024-I-2"], "Problem": ["p1", "p2"], "Answer": [204, 25]}).to_parquet(
        path
    )
    tasks = load_tasks(path)
    assert [(t.id, t.question, t.answer) for t in tasks] == [
        ("2024-I-1", "p1", "204"),
        ("2024-I-2", "p2", "25"),
    ]
    assert all(t.verifier == "boxed_math" for t in tasks)


def test_field_overrides(tmp_path):
    path = write_jsonl(
        tmp_path / "custom.jsonl",
        [
            {
                "key": "k1",
                "ask": "What is the capital of France?",
                "gold": ["Paris", "paris"],
                "answer": "ignored",
            }
        ],
    )
    (task,) = load_tasks(path, question_field="ask", answer_field="gold", id_field="key", verifier="exact")
    assert (task.id, task.question, task.answer, task.verifier) == (
        "k1",
        "What is the capital of France?",
        "Paris",
        "exact",
    )
    assert task.metadata["answers"] == ["Paris", "paris"]
    assert task.metadata["fields"] == {"answer": "ignored"}


def test_json_array_file_and_limit(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"prompt": f"q{i}", "target": str(i)} for i in range(5)]))
    tasks = load_tasks(path, limit=3)
    assert [t.answer for t in tasks] == ["0", "1", "2"]


def test_round_trip_of_generated_tasks(tmp_path):
    tasks = (
        generate("arithmetic", 6, seed=0) + generate("masbench", 5, seed=0) + generate("multihop", 4, seed=0)
    )
    path = save_jsonl(tasks, tmp_path / "out" / "tasks.jsonl")
    assert load_tasks(path) == tasks
    assert not list((tmp_path / "out").glob(".*.tmp"))
    assert load_tasks(path, verifier="exact")[0].verifier == "exact"
    parquet = tmp_path / "tasks.parquet"
    pd.DataFrame([t.to_dict() for t in tasks[:6]]).to_parquet(parquet)
    assert [t.answer for t in load_tasks(parquet)] == [t.answer for t in tasks[:6]]


def test_missing_file(tmp_path):
    missing = tmp_path / "nowhere" / "gsm8k.jsonl"
    with pytest.raises(TaskFileNotFoundError) as info:
        load_tasks(missing)
    message = str(info.value)
    assert str(missing) in message and "\n" not in message
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, TaskError)


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": \n{"question": "c"}\n')
    with pytest.raises(MalformedTaskFileError) as info:
        load_tasks(path)
    message = str(info.value)
    assert f"{path}:3:" in message and "invalid JSON" in message and "\n" not in message


def test_non_object_line(tmp_path):
    path = tmp_path / "lists.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(MalformedTaskFileError, match=r"lists\.jsonl:2: expected a JSON object, got list"):
        load_tasks(path)


def test_record_without_needed_fields_names_record_and_fields(tmp_path):
    path = write_jsonl(
        tmp_path / "odd.jsonl", [{"question": "q", "answer": "a"}, {"id": "r7", "text": "x", "label2": 1}]
    )
    with pytest.raises(MissingFieldError) as info:
        load_tasks(path)
    message = str(info.value)
    assert "record 1 'r7'" in message and "line/row 2" in message
    assert "its fields are: id, text, label2" in message and "question_field=" in message
    no_answer = write_jsonl(tmp_path / "noanswer.jsonl", [{"question": "q", "answer": None}])
    with pytest.raises(MissingFieldError, match="no answer field"):
        load_tasks(no_answer)
    with pytest.raises(MissingFieldError, match="no 'ask'"):
        load_tasks(no_answer, question_field="ask")


def test_empty_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(EmptyTaskFileError, match="holds no records"):
        load_tasks(empty)
    parquet = tmp_path / "empty.parquet"
    pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(
        parquet
    )
    with pytest.raises(EmptyTaskFileError):
        load_tasks(parquet)


def test_bad_formats(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("question,answer\nq,a\n")
    with pytest.raises(MalformedTaskFileError, match="unsupported file type '.csv'"):
        load_tasks(csv)
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    with pytest.raises(MalformedTaskFileError, match="cannot read as Parquet") as info:
        load_tasks(fake)
    assert "\n" not in str(info.value)
    with pytest.raises(TaskFileNotFoundError, match="is a directory"):
        load_tasks(tmp_path)


def test_task_from_dict_errors():
    with pytest.raises(MissingFieldError, match="lacks verifier"):
        Task.from_dict({"id": "1", "question": "q", "answer": "a"})
    task = Task("1", "q", "a", "exact", {"k": [1, 2]})
    assert Task.from_dict(task.to_dict()) == task
    assert hash(task) == hash(Task("1", "q", "a", "exact", {}))


def test_save_jsonl_rejects_unserialisable_metadata_and_leaves_nothing(tmp_path):
    bad = Task("1", "q", "a", "exact", {"obj": object()})
    with pytest.raises(TaskError, match="not JSON-serialisable"):
        save_jsonl([bad], tmp_path / "t.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_gzipped_jsonl(tmp_path):
    import gzip

    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"input": "2+2?", "output": "4"}) + "\n")
    (task,) = load_tasks(path)
    assert (task.id, task.question, task.answer) == ("train.jsonl-0", "2+2?", "4")
