"""Load tasks from local JSONL or Parquet files in the field's usual shapes (GSM8K, MATH, AIME, HotpotQA...).

``load_tasks(path)`` reads task files written by :func:`workbench.tasks.save_jsonl` unchanged, and
any other file of records by finding the question and answer fields:

- question: ``question``, ``problem``, ``prompt``, ``input``, ``query``, ``instruction``;
- answer: ``answer``, ``final_answer``, ``target``, ``output``, ``solution``, ``answers``, ``label``;
- id: ``id``, ``_id``, ``idx``, ``uid``, ``unique_id``, ``question_id``, ``qid`` (else ``<file stem>-<index>``).

Matching ignores case; ``question_field=``, ``answer_field=``, ``id_field=`` override it. Answers are
normalised: GSM8K's ``"... #### 1,234"`` becomes ``"1234"``, a MATH solution becomes the content of
its last ``\\boxed{}``, numbers become strings, a list becomes its first element (all of them are
kept in ``metadata["answers"]``). The verifier is ``verifier=`` when given, else ``boxed_math`` for
numeric, LaTeX or ``\\boxed`` answers and ``f1`` for free text. The record's other fields go to ``metadata["fields"]``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from workbench.answers import last_boxed
from workbench.tasks.errors import (
    EmptyTaskFileError,
    MalformedTaskFileError,
    MissingFieldError,
    TaskError,
    TaskFileNotFoundError,
)
from workbench.tasks.task import Task

QUESTION_FIELDS = ("question", "problem", "prompt", "input", "query", "instruction")
ANSWER_FIELDS = ("answer", "final_answer", "target", "output", "solution", "answers", "label")
ID_FIELDS = ("id", "_id", "idx", "uid", "unique_id", "question_id", "qid")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz", ".ndjson.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
_NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?$")


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in (*JSONL_SUFFIXES, *PARQUET_SUFFIXES):
        if name.endswith(suffix):
            return suffix
    return path.suffix.lower()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            first = True
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if first and line.lstrip().startswith("[") and path.suffix.lower() != ".jsonl":
                    yield from _read_json_array(path, line + handle.read())
                    return
                first = False
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise MalformedTaskFileError(
                        f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno}); "
                        "fix or remove that line (one JSON object per line)"
                    ) from None
    except UnicodeDecodeError as exc:
        raise MalformedTaskFileError(
            f"{path}: not UTF-8 text ({exc.reason}); save it as UTF-8 JSONL"
        ) from None
    except (OSError, EOFError) as exc:
        if isinstance(exc, TaskError):
            raise
        raise MalformedTaskFileError(f"{path}: cannot read ({_first_line(exc)}); check the file") from None


def _read_json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedTaskFileError(
            f"{path}:{exc.lineno}: invalid JSON ({exc.msg} at column {exc.colno}); fix the file"
        ) from None
    if not isinstance(data, list):
        raise MalformedTaskFileError(f"{path}: expected a JSON array of records, got {type(data).__name__}")
    yield from enumerate(data, start=1)


def _read_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a core dependency
        raise TaskError(
            f"{path}: reading Parquet needs pyarrow; install it with pip install pyarrow"
        ) from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several unrelated types for bad files
        raise MalformedTaskFileError(
            f"{path}: cannot read as Parquet ({_first_line(exc)}); check the file or convert it to JSONL"
        ) from None
    yield from enumerate(rows, start=1)


def read_records(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line or row number, record)`` from a JSONL/JSON/Parquet file, with one-line errors."""
    source = Path(path)
    if not source.exists():
        raise TaskFileNotFoundError(
            f"task file not found: {source}; check the path (a .jsonl or .parquet file)"
        )
    if source.is_dir():
        raise TaskFileNotFoundError(f"{source} is a directory; pass a .jsonl or .parquet file inside it")
    suffix = _suffix(source)
    if suffix in PARQUET_SUFFIXES:
        rows = _read_parquet(source)
    elif suffix in JSONL_SUFFIXES:
        rows = _read_jsonl(source)
    else:
        raise MalformedTaskFileError(
            f"{source}: unsupported file type {suffix or '(no extension)'!r}; use .jsonl (one JSON object "
            "per line), .json or .parquet"
        )
    for number, record in rows:
        if not isinstance(record, dict):
            raise MalformedTaskFileError(
                f"{source}:{number}: expected a JSON object, got {type(record).__name__}; "
                'write one object per line, e.g. {"question": ..., "answer": ...}'
            )
        yield number, record


def _find(record: Mapping[str, Any], explicit: str | None, candidates: tuple[str, ...]) -> str | None:
    if explicit is not None:
        return explicit if explicit in record else None
    lowered = {str(k).lower(): k for k in record}
    for name in candidates:
        if name in lowered and record[lowered[name]] not in (None, ""):
            return lowered[name]
    return None


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "tolist"):
        return _json_safe(value.tolist())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _scalar_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def normalise_answer(value: Any) -> tuple[str, dict[str, Any], bool] | None:
    """``(answer, extra metadata, looks_mathematical)`` from a raw answer value; None when it is empty."""
    if isinstance(value, Mapping):
        for key in ("value", "text", "answer"):
            if key in value:
                return normalise_answer(value[key])
        return None
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        items = [v for v in (value.tolist() if hasattr(value, "tolist") else value) if v not in (None, "")]
        if not items:
            return None
        first = normalise_answer(items[0])
        if first is None:
            return None
        return first[0], {"answers": [_scalar_text(v) for v in items]}, first[2]
    if value is None or isinstance(value, bool):
        return None if value is None else (str(value).lower(), {}, False)
    if isinstance(value, (int, float)):
        return _scalar_text(value), {}, True
    text = str(value).strip()
    if not text:
        return None
    if "####" in text:
        rationale, _, final = text.rpartition("####")
        return final.strip().replace(",", ""), {"rationale": rationale.strip()}, True
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, {"solution": text} if boxed != text else {}, True
    latex = any(mark in text for mark in ("\\", "$", "^", "{"))
    return text, {}, latex or bool(_NUMBER.match(text.replace(",", "")))


def _describe(record: Mapping[str, Any], id_key: str | None, number: int, index: int) -> str:
    ident = f" {record[id_key]!r}" if id_key and id_key in record else ""
    return f"record {index}{ident} (line/row {number})"


def load_tasks(
    path: str | os.PathLike[str],
    *,
    question_field: str | None = None,
    answer_field: str | None = None,
    verifier: str | None = None,
    id_field: str | None = None,
    limit: int | None = None,
) -> list[Task]:
    """Tasks from a local JSONL/JSON/Parquet file (see the module docstring for field detection)."""
    source = Path(path)
    mapped = question_field is not None or answer_field is not None or id_field is not None
    tasks: list[Task] = []
    for index, (number, record) in enumerate(read_records(source)):
        if limit is not None and len(tasks) >= limit:
            break
        if not mapped and {"id", "question", "answer", "verifier"} <= record.keys():
            task = Task.from_dict(record)
            if verifier is not None:
                task = Task(task.id, task.question, task.answer, verifier, task.metadata)
            tasks.append(task)
            continue
        id_key = _find(record, id_field, ID_FIELDS)
        where = _describe(record, id_key, number, index)
        fields = ", ".join(map(str, record)) or "(none)"
        q_key = _find(record, question_field, QUESTION_FIELDS)
        if q_key is None:
            wanted = (
                repr(question_field)
                if question_field
                else f"question field (tried {', '.join(QUESTION_FIELDS)})"
            )
            raise MissingFieldError(
                f"{source}: {where} has no {wanted}; its fields are: {fields}; pass question_field=... to pick one"
            )
        a_key = _find(record, answer_field, ANSWER_FIELDS)
        answer = normalise_answer(record[a_key]) if a_key is not None else None
        if answer is None:
            wanted = (
                repr(answer_field) if answer_field else f"answer field (tried {', '.join(ANSWER_FIELDS)})"
            )
            raise MissingFieldError(
                f"{source}: {where} has no {wanted} with a value; its fields are: {fields}; "
                "pass answer_field=... to pick one"
            )
        if id_field is not None and id_key is None:
            raise MissingFieldError(f"{source}: {where} has no field {id_field!r}; its fields are: {fields}")
        text, extra, mathematical = answer
        mathematical = mathematical or any(isinstance(v, str) and "\\boxed" in v for v in record.values())
        others = {str(k): _json_safe(v) for k, v in record.items() if k not in (q_key, a_key, id_key)}
        tasks.append(
            Task(
                id=str(record[id_key]) if id_key is not None else f"{source.stem}-{index}",
                question=str(record[q_key]).strip(),
                answer=text,
                verifier=verifier or ("boxed_math" if mathematical else "f1"),
                metadata={
                    "source": source.name,
                    "record": number,
                    "question_field": q_key,
                    "answer_field": a_key,
                    **_json_safe(extra),
                    "fields": others,
                },
            )
        )
    if not tasks and limit != 0:
        raise EmptyTaskFileError(f"{source} holds no records; add one JSON object per line")
    return tasks
