"""Tasks: synthetic generators (arithmetic, multi-hop KB QA, MASBench) and local dataset loaders.

>>> from workbench.tasks import generate, list_generators
>>> tasks = generate("arithmetic", n=4, seed=0, level=1, format="plain")

Importing this package registers the built-in generators.
"""

from workbench.tasks import arithmetic, masbench, masbench_small, multihop  # noqa: F401  (register generators)
from workbench.tasks.errors import (
    EmptyTaskFileError,
    MalformedTaskFileError,
    MissingFieldError,
    TaskError,
    TaskFileNotFoundError,
    TaskGenerationError,
    TaskOptionError,
    UnknownGeneratorError,
)
from workbench.tasks.knowledge_base import (
    Document,
    Entity,
    Fact,
    KnowledgeBase,
    build_knowledge_base,
    load_corpus,
    save_corpus,
)
from workbench.tasks.loaders import load_tasks
from workbench.tasks.registry import generate, generator_options, list_generators, register_generator
from workbench.tasks.task import Task, save_jsonl

__all__ = [
    "Document",
    "EmptyTaskFileError",
    "Entity",
    "Fact",
    "KnowledgeBase",
    "MalformedTaskFileError",
    "MissingFieldError",
    "Task",
    "TaskError",
    "TaskFileNotFoundError",
    "TaskGenerationError",
    "TaskOptionError",
    "UnknownGeneratorError",
    "build_knowledge_base",
    "generate",
    "generator_options",
    "list_generators",
    "load_corpus",
    "load_tasks",
    "register_generator",
    "save_corpus",
    "save_jsonl",
]
