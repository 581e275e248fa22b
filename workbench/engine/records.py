"""What a rollout produces (episodes of calls): declared with the plain data of the bottom layer, in
``workbench.store.records``, so that rewards and the store use them without importing the engine."""

from workbench.store.records import CallRecord, EpisodeRecord

__all__ = ["CallRecord", "EpisodeRecord"]
