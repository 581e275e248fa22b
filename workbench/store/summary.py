"""A run's summary: its store without the prompts and token ids, as text files small enough to commit.

``export_summary(run_dir, out_dir, command=..., ...)`` writes every table of the run's database as gzipped JSON
lines (``<table>.jsonl.gz``: one list of values per row, in the table's column order), leaving out the columns that make a database
large and that no report reads (``SUMMARY_DROPS``: the prompts, the token ids, the log-probabilities, the
per-token advantages, the timings), together with the run's small files (``config.yaml`` ...) and a
``summary.json`` naming what made it (the command line, the seed) and what it holds; the same run gives the same
bytes, so exporting it again changes nothing in git. A 25-step
MarsRL run's 8.7 MB database becomes 60 KB.

``open_summary(summary_dir, cache_dir)`` builds a run directory from a summary (a database of the current
schema, the left-out columns empty) in ``cache_dir``, named after the summary's content, so ``RunReader``
and every report read a summary as they read a run; it is built once and reused until the summary changes.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import NotARunStoreError, SchemaVersionError
from .layout import DB_NAME, connect, existing_run, sqlite_errors
from .schema import check_readable, latest_version, migrate, read_version

SUMMARY_NAME = "summary.json"
SUMMARY_FORMAT = 1
TABLE_SUFFIX = ".jsonl.gz"
TABLES = ("runs", "steps", "episodes", "calls", "metrics", "events")
#: Columns a summary leaves out, by table.
SUMMARY_DROPS: Mapping[str, tuple[str, ...]] = {
    "calls": ("prompt_text", "prompt_ids", "completion_ids", "logprobs", "token_advantages", "timings"),
}
#: The run directory's files a summary carries (its config, a saved topology): small text files.
CARRIED_SUFFIXES = (".yaml", ".yml", ".json")


def is_summary(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a run summary."""
    return (Path(path) / SUMMARY_NAME).is_file()


def export_summary(run_dir: str | Path, out_dir: str | Path, **provenance: Any) -> Path:
    """Write the summary of the run at ``run_dir`` to ``out_dir`` (replaced if it exists); returns ``out_dir``.

    ``provenance`` (``command``, ``seed``, ``scale`` ...) is recorded in ``summary.json`` as given.
    """
    paths = existing_run(run_dir)
    out = Path(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=_made(out.parent)))
    try:
        conn = connect(paths.db, readonly=True)
        try:
            with sqlite_errors(paths.db):
                version = read_version(conn, paths.db)
                check_readable(version, paths.db)
                (run_id,) = conn.execute("SELECT id FROM runs").fetchone()
                tables = {table: _export_table(conn, table, staging) for table in TABLES}
        finally:
            conn.close()
        for file in sorted(paths.run_dir.iterdir()):
            if file.is_file() and file.suffix in CARRIED_SUFFIXES:
                shutil.copyfile(file, staging / file.name)
        summary = {
            "format": SUMMARY_FORMAT,
            "run": run_id,
            "schema_version": version,
            **provenance,
            "left_out": {table: list(columns) for table, columns in SUMMARY_DROPS.items()},
            "tables": tables,
        }
        (staging / SUMMARY_NAME).write_text(json.dumps(summary, indent=1, default=str) + "\n")
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _export_table(conn: Any, table: str, out: Path) -> dict[str, Any]:
    dropped = SUMMARY_DROPS.get(table, ())
    info = conn.execute(f"PRAGMA table_info({table})").fetchall()
    columns = [row[1] for row in info if row[1] not in dropped]
    blobs = [row[1] for row in info if row[1] in columns and row[2].upper() == "BLOB"]
    cursor = conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid")
    lines = [
        json.dumps(
            [base64.b64encode(v).decode() if isinstance(v, bytes) else v for v in row], separators=(",", ":")
        )
        for row in cursor
    ]
    # no time stamp in the gzip header: the same run, the same bytes
    with (out / f"{table}{TABLE_SUFFIX}").open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as f:
        f.write("".join(line + "\n" for line in lines).encode())
    count = len(lines)
    return {"columns": columns, "base64": blobs, "rows": count}


def read_summary(summary_dir: str | Path) -> dict[str, Any]:
    """The ``summary.json`` of a summary: what made it and what it holds."""
    path = Path(summary_dir) / SUMMARY_NAME
    if not path.is_file():
        raise NotARunStoreError(f"{path.parent} is not a run summary (no {SUMMARY_NAME} inside)")
    return json.loads(path.read_text())


def open_summary(summary_dir: str | Path, cache_dir: str | Path) -> Path:
    """A run directory built from the summary at ``summary_dir`` under ``cache_dir`` (reused while the
    summary is unchanged); ``RunReader`` reads it as any run."""
    source = Path(summary_dir)
    summary = read_summary(source)
    if summary.get("format") != SUMMARY_FORMAT or summary.get("schema_version", 0) > latest_version():
        raise SchemaVersionError(
            f"{source} is a summary of format {summary.get('format')}, schema v{summary.get('schema_version')}, "
            f"newer than this workbench reads (format {SUMMARY_FORMAT}, schema v{latest_version()}); upgrade it"
        )
    files = sorted(p for p in source.iterdir() if p.is_file())
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    run_dir = Path(cache_dir) / f"{source.resolve().name}-{digest.hexdigest()[:16]}" / summary["run"]
    if (run_dir / DB_NAME).is_file():
        return run_dir
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=_made(run_dir.parent.parent)))
    try:
        built = staging / summary["run"]
        built.mkdir()
        _build_database(source, summary, built / DB_NAME)
        for file in files:
            if file.suffix in CARRIED_SUFFIXES and file.name != SUMMARY_NAME:
                shutil.copyfile(file, built / file.name)
        staging.chmod(0o755)
        try:
            os.rename(staging, run_dir.parent)
        except OSError:  # another process built it first
            if not (run_dir / DB_NAME).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return run_dir


def _build_database(source: Path, summary: Mapping[str, Any], db: Path) -> None:
    conn = connect(db, readonly=False, create=True)
    try:
        with sqlite_errors(db, writer=True):
            migrate(conn, db, fresh=True)
            conn.execute("BEGIN")
            for table in TABLES:
                held = summary["tables"][table]
                columns, blobs = held["columns"], set(held["base64"])
                decoded = [i for i, c in enumerate(columns) if c in blobs]
                rows = []
                with gzip.open(source / f"{table}{TABLE_SUFFIX}", "rt") as f:
                    for line in f:
                        values = json.loads(line)
                        for i in decoded:
                            if values[i] is not None:
                                values[i] = base64.b64decode(values[i])
                        rows.append(values)
                marks = ", ".join("?" * len(columns))
                conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
            conn.execute("COMMIT")
    finally:
        conn.close()
