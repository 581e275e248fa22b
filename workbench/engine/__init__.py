"""The rollout engine: runs a topology's flow over tasks and records every call."""

from workbench.engine import mas_graph, mas_lines  # noqa: F401  (register the mas_xml and mas_lines parsers)
from workbench.engine.parsers import FormatError
from workbench.engine.records import CallRecord, EpisodeRecord
from workbench.engine.runner import Rollout

__all__ = ["CallRecord", "EpisodeRecord", "FormatError", "Rollout"]
