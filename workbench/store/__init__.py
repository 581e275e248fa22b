"""Run store: one directory per run, an embedded SQLite database (WAL) with one writer and many readers.

    store = RunStore.create("runs", config)            # the single writer
    with store.step(0, policy_version=0) as step:      # a step is all or nothing
        ep = step.add_episode(task_id="t1", group_key="t1")
        step.add_call(ep, role="solver", prompt_ids=p, completion_ids=c, logprobs=lp, mask=m)
        step.flush()                                   # readers see the rows so far
        step.log_metrics({"reward_mean": 0.5}, role="solver")
    reader = RunReader(store.run_dir)                  # read-only, any process, while writing
    reader.calls(step=0, role="solver")                # pandas DataFrames, arrays decoded
    for rows in reader.tail("calls", timeout=5): ...   # live tail

Layout on disk: `layout.py`; tables and migrations: `schema.py`; token-array encoding and the
ownership-mask codes (`TokenOwner`): `codec.py`; the dashboard's named read queries (a page of
episodes, an episode's call tree, what changed since the last poll): `queries.py`.
"""

from .codec import TokenOwner
from .errors import (
    CorruptStoreError,
    InvalidRecordError,
    NotARunStoreError,
    ReadOnlyStoreError,
    RunExistsError,
    RunNotFoundError,
    RunsDirError,
    SchemaVersionError,
    StepError,
    StorageError,
    StoreError,
    WriterLockedError,
)
from .reader import RunReader, list_runs, to_wide
from .schema import SCHEMA_VERSION
from .step import StepWriter
from .writer import RUN_STATUSES, RunStore

__all__ = [
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "CorruptStoreError",
    "InvalidRecordError",
    "NotARunStoreError",
    "ReadOnlyStoreError",
    "RunExistsError",
    "RunNotFoundError",
    "RunReader",
    "RunStore",
    "RunsDirError",
    "SchemaVersionError",
    "StepError",
    "StorageError",
    "StoreError",
    "StepWriter",
    "TokenOwner",
    "WriterLockedError",
    "list_runs",
    "to_wide",
]
