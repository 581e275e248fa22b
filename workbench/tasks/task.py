"""The :class:`Task` record (question, reference answer, verifier name, metadata) and JSONL saving.

A task is plain data: it round-trips through ``to_dict``/``from_dict`` and JSON without loss, so a
task set saved with :func:`save_jsonl` loads back equal with :func:`workbench.tasks.load_tasks`.
The ``verifier`` field names the checker in ``workbench.rewards`` that scores an answer
(``"boxed_math"``, ``"number"``, ``"exact"``, ``"f1"``, ``"mod23_int"``, ``"mod23_list"``,
``"boxed_list"``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.tasks.errors import MissingFieldError, TaskError

_REQUIRED = ("id", "question", "answer", "verifier")


@dataclass(frozen=True)
class Task:
    """One question with its reference answer and the name of the verifier that checks answers.

    ``metadata`` carries everything a test or a report needs to recompute or slice the task
    (difficulty level, axis, hops, source, the structured problem); it must be JSON-serialisable.
    """

    id: str
    question: str
    answer: str
    verifier: str
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-ready); ``Task.from_dict(t.to_dict()) == t``."""
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "verifier": self.verifier,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Task:
        """Build a task from the dict ``to_dict`` writes; raises :class:`MissingFieldError` if keys lack."""
        if not isinstance(data, Mapping):
            raise TaskError(f"Task.from_dict needs a mapping, got {type(data).__name__}; pass a dict")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise MissingFieldError(
                f"task record lacks {', '.join(missing)}; its fields are: {', '.join(map(str, data)) or '(none)'}"
            )
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise TaskError(f"task {data['id']!r}: metadata must be an object, got {type(metadata).__name__}")
        return cls(
            id=str(data["id"]),
            question=str(data["question"]),
            answer=str(data["answer"]),
            verifier=str(data["verifier"]),
            metadata=dict(metadata),
        )


def write_jsonl(lines: Iterable[str], path: str | os.PathLike[str]) -> Path:
    """Write JSON lines to ``path`` atomically (a temporary file renamed into place); parents are created.

    If producing a line fails, nothing is left behind and the error propagates.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(line + "\n")
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def _task_line(task: Any) -> str:
    if not isinstance(task, Task):
        raise TaskError(f"save_jsonl got a {type(task).__name__}, not a Task; pass Task objects")
    try:
        return json.dumps(task.to_dict(), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise TaskError(
            f"task {task.id!r} is not JSON-serialisable ({exc}); keep metadata to dicts, lists, strings and numbers"
        ) from None


def save_jsonl(tasks: Iterable[Task], path: str | os.PathLike[str]) -> Path:
    """Write tasks to ``path`` as JSON Lines, atomically. Returns the path written."""
    return write_jsonl((_task_line(t) for t in tasks), path)
