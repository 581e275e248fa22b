"""The dashboard's link to a comparison: ``/?compare=<run_id>,<run_id>,summary:<name>``.

A link names runs of the served runs directory by id and the committed summaries (``reports/runs/<name>``,
``workbench.analysis.compare.committed_summaries``) by ``summary:<name>``. ``compared_runs`` turns a link's
value into run folders, keeping only names that are exactly that (a run id of the directory, a committed
summary's name), at most ``MAX_COMPARED`` of them; nothing in a URL is read as a path. ``compare_query`` is
the query a comparison puts in the address bar, so that the link reopens it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlencode

from workbench.analysis.compare import committed_summaries
from workbench.store.errors import StoreError
from workbench.store.layout import DB_NAME, check_run_id

#: The query argument of a comparison's link.
COMPARE_ARG = "compare"
#: How a link names a committed summary.
SUMMARY_PREFIX = "summary:"
#: The most runs one comparison opens (each a shared poll and a few lines per plot).
MAX_COMPARED = 12


def compared_runs(runs_dir: Path, value: str) -> dict[str, Path]:
    """The runs a link's ``compare`` value names, by label (a run's id, a summary's ``summary:<name>``), in
    its order, without repeats; names that are neither a run of ``runs_dir`` nor a committed summary are
    ignored."""
    summaries = None
    found: dict[str, Path] = {}
    root = runs_dir.resolve()
    for item in value.split(","):
        item = item.strip()
        if not item or item in found or len(found) >= MAX_COMPARED:
            continue
        if item.startswith(SUMMARY_PREFIX):
            summaries = committed_summaries() if summaries is None else summaries
            name = item[len(SUMMARY_PREFIX) :]
            if name in summaries:
                found[item] = summaries[name]
            continue
        try:
            check_run_id(item)
        except StoreError:
            continue
        run_dir = runs_dir / item
        if (run_dir / DB_NAME).is_file() and run_dir.resolve().parent == root:
            found[item] = run_dir
    return found


def compare_query(labels: Sequence[str]) -> str:
    """The address bar's query for a comparison of ``labels`` (run ids, ``summary:<name>``)."""
    return "?" + urlencode({COMPARE_ARG: ",".join(labels)}, safe=",:")


__all__ = ["COMPARE_ARG", "MAX_COMPARED", "SUMMARY_PREFIX", "compare_query", "compared_runs"]
