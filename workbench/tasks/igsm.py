"""iGSM-style worlds and dependency graphs with arithmetic mod 23: the substrate of MASBench tasks.

A *world* is a category hierarchy (e.g. School -> Classroom -> Backpack) with a few items per
layer and a random set of parent-child edges. Each edge is an *instance parameter*
("Central High's Robotics Lab"); each parent and child category gives an *abstract parameter*
("Central High's Classroom") equal to the sum of that parent's instance parameters in the category.
A :class:`GraphBuilder` defines instance parameters one at a time, each as a constant in 0..22 or
an expression over earlier parameters, so the dependency graph is acyclic by construction.
Parameters never defined count as zero ("default zero"); once an abstract parameter is used its
undefined children are frozen at zero so its value can never change afterwards.

Expressions are plain dicts (JSON-ready, stored in task metadata):
``{"op": "const", "value": k}``, ``{"op": "ref", "name": p}``, ``{"op": "sum", "args": [...]}``,
``{"op": "diff", "args": [a, b]}``, ``{"op": "add", "k": k, "arg": e}``, ``{"op": "mul", "k": k, "arg": e}``.
They render as the iGSM sentence forms: "equals 17", "equals each X", "equals 3 more than each X",
"equals 5 times as much as the sum of each X and each Y", "equals the difference of each X and each Y".
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MOD = 23
INSTRUCTION = (
    "All calculations are done mod 23. "
    "Any parameter that wasn't mentioned in the problem statement is by default zero."
)

Expr = dict[str, Any]


@dataclass(frozen=True)
class Family:
    """A category hierarchy with an item vocabulary per layer (category names are unique across families)."""

    name: str
    layers: tuple[tuple[str, tuple[str, ...]], ...]


def _family(name: str, *layers: tuple[str, str]) -> Family:
    return Family(name, tuple((category, tuple(items.split("|"))) for category, items in layers))


FAMILIES: tuple[Family, ...] = (
    _family(
        "grocery",
        (
            "Store",
            "Fresh Market|Super Saver|Corner Grocer|Green Basket|Value Mart|Harvest Foods|Daily Pantry",
        ),
        (
            "Product",
            "Canned Peaches|Canned Olives|Canned Fish|Canned Soups|Canned Beans|Canned Corn|Canned Tomatoes",
        ),
        ("Ingredient", "Sorghum|Rye|Quinoa|Barley|Millet|Oats|Buckwheat"),
    ),
    _family(
        "forest",
        (
            "Forest",
            "Montane Forest|Old-growth Forest|Temperate Broadleaf Forest|Cloud Forest|Boreal Forest|"
            "Mangrove Forest|Bamboo Forest",
        ),
        ("Animal", "Sloth|Grizzly Bear|Bengal Tiger|Red Fox|Lynx|Badger|Wolverine"),
        ("Organ", "Respiratory Mucosa|Nasal Cavity|Oropharynx|Trachea|Bronchus|Larynx|Pharynx"),
    ),
    _family(
        "zoo",
        (
            "Zoo",
            "Tracy Aviary|Sylvan Heights Bird Park|Riverbend Zoo|Highland Wildlife Park|Bayside Zoo|"
            "Prairie Safari Park",
        ),
        ("Enclosure", "Kangaroo Walkabout|Panda Exhibit|Camel Yard|Penguin Cove|Reptile House|Lion Rock"),
        ("Fish", "Tuna|Marlin|Bass|Trout|Salmon|Carp"),
        ("Bone", "Humerus|Radius|Ulna|Femur|Tibia|Fibula"),
    ),
    _family(
        "school",
        (
            "School",
            "Central High|Kingston Secondary|Springfield Primary|Riverside Academy|Lakeside School|"
            "Hilltop Middle School",
        ),
        (
            "Classroom",
            "Marketing Classroom|Political Science Room|Robotics Lab|Chemistry Lab|Art Studio|Music Room|"
            "Debate Hall",
        ),
        (
            "Backpack",
            "Camping Backpack|Overnight Backpack|Hiking Backpack|Laptop Backpack|Sling Backpack|"
            "Rolling Backpack",
        ),
    ),
    _family(
        "aquarium",
        (
            "Insectarium",
            "Insectarium of Chicago|Insectarium of Seattle|Insectarium of Washington DC|"
            "Insectarium of Boston|Insectarium of Denver|Insectarium of Austin",
        ),
        ("Tank", "Shark Tank|Kelp Forest Tank|Coral Tank|Jellyfish Tank|Octopus Tank|Seahorse Tank"),
        ("Sea Creature", "Clownfish|Moray Eel|Pufferfish|Angelfish|Lobster|Starfish"),
    ),
    _family(
        "park",
        (
            "Park",
            "Lumpini Park in Bangkok|Gardens by the Bay in Singapore|Central Park in New York|"
            "Hyde Park in London|Ueno Park in Tokyo|Chapultepec Park in Mexico City",
        ),
        ("Creature", "Hydra|Banshee|Griffin|Phoenix|Kraken|Basilisk"),
        ("Body Part", "Heart|Liver|Spleen|Kidney|Vena Cava|Aorta"),
        ("Cell", "Keratinocytes|Tenocytes|Osteoblasts|Melanocytes|Fibroblasts|Neurons"),
    ),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


class Exhausted(Exception):
    """The world ran out of free parameters; the caller retries with a larger world."""


def param_name(parent: str, child: str) -> str:
    """The parameter "{parent}'s {child}" (child is an item for instance, a category for abstract)."""
    return f"{parent}'s {child}"


@dataclass
class World:
    """Sampled items per layer and parent-child edges; knows its instance and abstract parameters."""

    family: str
    categories: list[tuple[str, list[str]]]
    edges: list[tuple[str, str]]
    instances: list[str] = field(init=False)
    abstract_children: dict[str, list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.instances = [param_name(p, c) for p, c in self.edges]
        self.abstract_children = {}
        category_of = {item: cat for cat, items in self.categories for item in items}
        for parent, child in self.edges:
            key = param_name(parent, category_of[child])
            self.abstract_children.setdefault(key, []).append(param_name(parent, child))

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "categories": [[cat, list(items)] for cat, items in self.categories],
            "edges": [[p, c] for p, c in self.edges],
        }


def sample_world(rng: random.Random, family: Family, min_instances: int) -> World:
    """Pick items per layer and edges so the world has at least ``min_instances`` instance parameters."""
    for items_per_layer in range(3, 9):
        for _ in range(4):
            categories = []
            for cat, vocab in family.layers:
                k = min(len(vocab), items_per_layer + rng.randint(0, 1))
                categories.append((cat, rng.sample(list(vocab), k)))
            edges: list[tuple[str, str]] = []
            density = rng.uniform(0.55, 0.85)
            for (_, parents), (_, children) in zip(categories, categories[1:], strict=False):
                for parent in parents:
                    chosen = [c for c in children if rng.random() < density] or [rng.choice(children)]
                    edges.extend((parent, c) for c in chosen)
            if len(edges) >= min_instances:
                return World(family.name, categories, edges)
    raise Exhausted(f"family {family.name!r} cannot hold {min_instances} parameters")


# ---------------------------------------------------------------- expressions


def refs(expr: Expr) -> list[str]:
    """Parameter names an expression references, in order, without duplicates."""
    op = expr["op"]
    if op == "const":
        return []
    if op == "ref":
        return [expr["name"]]
    if op in ("sum", "diff"):
        out: list[str] = []
        for arg in expr["args"]:
            out += [r for r in refs(arg) if r not in out]
        return out
    return refs(expr["arg"])


def evaluate_expr(expr: Expr, value_of: Callable[[str], int]) -> int:
    """Value of ``expr`` mod 23, looking parameter values up with ``value_of(name)``."""
    op = expr["op"]
    if op == "const":
        return expr["value"] % MOD
    if op == "ref":
        return value_of(expr["name"]) % MOD
    if op == "sum":
        return sum(evaluate_expr(a, value_of) for a in expr["args"]) % MOD
    if op == "diff":
        a, b = expr["args"]
        return (evaluate_expr(a, value_of) - evaluate_expr(b, value_of)) % MOD
    if op == "add":
        return (expr["k"] + evaluate_expr(expr["arg"], value_of)) % MOD
    if op == "mul":
        return (expr["k"] * evaluate_expr(expr["arg"], value_of)) % MOD
    raise ValueError(f"unknown expression op {op!r}")


def _arg_text(name: str, alias: Mapping[str, str]) -> str:
    if name in alias:
        return alias[name]
    return name if name.startswith("[") else f"each {name}"


def render_expr(expr: Expr, alias: Mapping[str, str] | None = None) -> str:
    """The right-hand side of an iGSM sentence; ``alias`` maps parameter names to tokens like ``[variable2]``."""
    alias = alias or {}
    op = expr["op"]
    if op == "const":
        return str(expr["value"])
    if op == "ref":
        return _arg_text(expr["name"], alias)
    if op == "sum":
        parts = [render_expr(a, alias) for a in expr["args"]]
        return "the sum of " + (", ".join(parts[:-1]) + " and " + parts[-1])
    if op == "diff":
        a, b = (render_expr(x, alias) for x in expr["args"])
        return f"the difference of {a} and {b}"
    inner = render_expr(expr["arg"], alias)
    if op == "add":
        return f"{expr['k']} more than {inner}"
    if op == "mul":
        return f"{expr['k']} times as much as {inner}"
    raise ValueError(f"unknown expression op {op!r}")


def render_definition(name: str, expr: Expr, alias: Mapping[str, str] | None = None) -> str:
    """One sentence: "The number of each {name} equals {rhs}."."""
    return f"The number of each {name} equals {render_expr(expr, alias)}."


def random_expr(rng: random.Random, args: Sequence[str]) -> Expr:
    """A random iGSM operation over ``args`` (distinct names), using every one of them."""
    leaves = [{"op": "ref", "name": a} for a in args]
    if len(leaves) == 1:
        kind = rng.choice(["copy", "add", "mul"])
        if kind == "copy":
            return leaves[0]
        return {
            "op": kind,
            "k": rng.randint(1, 22) if kind == "add" else rng.randint(2, 22),
            "arg": leaves[0],
        }
    core = (
        {"op": "diff", "args": leaves}
        if len(leaves) == 2 and rng.random() < 0.4
        else {"op": "sum", "args": leaves}
    )
    wrap = rng.choice(["none", "none", "add", "mul"])
    if wrap == "none":
        return core
    return {"op": wrap, "k": rng.randint(1, 22) if wrap == "add" else rng.randint(2, 22), "arg": core}


# ---------------------------------------------------------------- graph builder


class GraphBuilder:
    """Defines parameters of one world in topological order and tracks depth and in-degree."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.defs: dict[str, Expr] = {}
        self.frozen: set[str] = set()
        self.pending: set[str] = set()
        self.used_abstract: set[str] = set()
        self._parents_of: dict[str, list[str]] = {}
        for abstract, children in world.abstract_children.items():
            for child in children:
                self._parents_of.setdefault(child, []).append(abstract)

    # -- queries about the graph
    def is_abstract(self, name: str) -> bool:
        return name in self.world.abstract_children

    def deps(self, name: str) -> list[str]:
        """Direct dependencies: referenced parameters, or the defined children of an abstract one."""
        if name in self.defs:
            return refs(self.defs[name])
        if self.is_abstract(name):
            return [c for c in self.world.abstract_children[name] if c in self.defs]
        return []

    def depth(self, name: str) -> int:
        """Nodes on the longest dependency chain ending at ``name`` (a leaf has depth 1)."""
        memo: dict[str, int] = {}

        def go(n: str) -> int:
            if n not in memo:
                memo[n] = 1 + max((go(d) for d in self.deps(n)), default=0)
            return memo[n]

        return go(name)

    def ancestors(self, name: str) -> list[str]:
        """``name`` and every parameter it depends on, dependencies first."""
        order: list[str] = []
        seen: set[str] = set()

        def go(n: str) -> None:
            if n in seen:
                return
            seen.add(n)
            for d in self.deps(n):
                go(d)
            order.append(n)

        go(name)
        return order

    def value(self, name: str) -> int:
        """Ground-truth value mod 23 (topological evaluation with default zero)."""
        memo: dict[str, int] = {}

        def go(n: str) -> int:
            if n not in memo:
                if n in self.defs:
                    memo[n] = evaluate_expr(self.defs[n], go)
                else:  # abstract: sum of defined children; undefined instance: zero
                    memo[n] = sum(go(c) for c in self.deps(n)) % MOD
            return memo[n]

        return go(name)

    # -- building
    def free(self) -> list[str]:
        """Instance parameters that may still be taken: not defined, frozen or reserved by ``take``."""
        return [
            p
            for p in self.world.instances
            if p not in self.defs and p not in self.frozen and p not in self.pending
        ]

    def take(self, among: Sequence[str] | None = None) -> str:
        """Reserve a free instance parameter (one of ``among`` when given) to define next."""
        free = set(self.free())
        pool = [p for p in (self.world.instances if among is None else among) if p in free]
        if not pool:
            raise Exhausted
        name = self.rng.choice(pool)
        self.pending.add(name)
        return name

    def use(self, name: str) -> None:
        """Mark ``name`` as referenced: an abstract one freezes its undefined children at zero."""
        if self.is_abstract(name) and name not in self.used_abstract:
            self.used_abstract.add(name)
            self.frozen.update(c for c in self.world.abstract_children[name] if c not in self.defs)
        elif not self.is_abstract(name) and name not in self.defs:
            self.frozen.add(name)

    def can_reference(self, target: str, name: str) -> bool:
        """Whether ``target``'s definition may reference ``name`` without creating a cycle."""
        if name == target:
            return False
        if self.is_abstract(name):
            return target not in self.world.abstract_children[name]
        return True

    def define(self, name: str, expr: Expr) -> str:
        if name in self.defs or name in self.frozen:
            raise ValueError(f"parameter {name!r} is already defined or frozen")
        for r in refs(expr):
            if not r.startswith("[") and not self.can_reference(name, r):
                raise ValueError(f"{name!r} cannot reference {r!r}")
        for r in refs(expr):
            if not r.startswith("["):
                self.use(r)
        self.defs[name] = expr
        self.pending.discard(name)
        return name

    def define_const(self, name: str | None = None) -> str:
        return self.define(name or self.take(), {"op": "const", "value": self.rng.randint(0, 22)})

    def define_op(self, args: Sequence[str], name: str | None = None) -> str:
        target = name or self.take()
        return self.define(target, random_expr(self.rng, args))

    def zero_leaf(self, among: Sequence[str] | None = None) -> str:
        """A free instance parameter left undefined (it reads as zero) and frozen there."""
        name = self.take(among)
        self.pending.discard(name)
        self.frozen.add(name)
        return name

    def max_in_degree(self, names: Sequence[str]) -> int:
        return max((len(self.deps(n)) for n in names), default=0)
