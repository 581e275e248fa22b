"""The folders of the report plan's runs made with several seeds: seed 0's run (or the config's seed's) in
``<name>/``, seed k's in ``<name>-seed<k>/``, in a runs folder and a summaries folder alike (``reports/runs/``)."""

from __future__ import annotations

import re

#: A folder of the plan's run made with a seed other than 0: ``marsrl-seed2``.
SEED_FOLDER = re.compile(r"^(?P<name>.+)-seed(?P<seed>[0-9]+)$")


def seed_folder(name: str, seed: int | None = None) -> str:
    """The folder (and summary) name of the plan's run ``name`` made with ``seed``: ``name`` itself for the
    config's seed (None) or seed 0, ``<name>-seed<k>`` for seed k > 0."""
    return name if not seed else f"{name}-seed{int(seed)}"


def split_seed(folder: str) -> tuple[str, int]:
    """The plan run and seed of a folder name: ``marsrl-seed2`` -> ("marsrl", 2), ``marsrl`` -> ("marsrl", 0)."""
    matched = SEED_FOLDER.match(folder)
    return (matched["name"], int(matched["seed"])) if matched else (folder, 0)
