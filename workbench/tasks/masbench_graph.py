"""MASBench graph construction: dependency graphs of iGSM parameters built to an axis's exact shape.

Each helper grows a :class:`~workbench.tasks.igsm.GraphBuilder`: a query whose longest chain has
exactly d parameters (Depth), a query of in-degree b over shallow arguments (Breadth), sentences no
query needs (distractors), and the ancestors of a query up to the carried ``[variable k]`` tokens
(Horizon). :mod:`workbench.tasks.masbench_axes` turns the graphs into questions.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.tasks.igsm import Exhausted, GraphBuilder, random_expr


def side_args(b: GraphBuilder, target: str, max_depth: int, count: int, exclude: set[str]) -> list[str]:
    """``count`` distinct extra arguments for ``target`` whose depth is at most ``max_depth``."""
    rng, out = b.rng, []
    for _ in range(count):
        roll = rng.random()
        existing = [
            p
            for p in b.defs
            if not p.startswith("[")
            and p not in out
            and p not in exclude
            and b.can_reference(target, p)
            and b.depth(p) <= max_depth
        ]
        abstract = [
            a
            for a in b.world.abstract_children
            if a not in exclude
            and a not in out
            and b.deps(a)
            and b.can_reference(target, a)
            and b.depth(a) <= max_depth
        ]
        if roll < 0.4 and existing:
            out.append(rng.choice(existing))
        elif roll < 0.55 and abstract:
            out.append(rng.choice(abstract))
        elif roll < 0.65:
            out.append(b.zero_leaf([p for p in b.free() if p not in exclude]))
        else:
            out.append(b.define_const(b.take([p for p in b.free() if p not in exclude])))
    return out


def depth_problem(b: GraphBuilder, d: int) -> str:
    """Build a query whose longest dependency chain has exactly ``d`` nodes; returns the query name."""
    rng = b.rng
    final_abstract = None
    if d >= 2 and rng.random() < 0.5:
        candidates = [
            a
            for a, ch in b.world.abstract_children.items()
            if a not in b.used_abstract and any(c in b.free() for c in ch)
        ]
        final_abstract = rng.choice(candidates) if candidates else None
    reserved = set(b.world.abstract_children[final_abstract]) if final_abstract else set()
    exclude = {final_abstract} if final_abstract else set()
    chain: list[str] = []
    n_chain = d - 1 if final_abstract else d
    for k in range(1, n_chain + 1):
        last = k == n_chain and final_abstract is not None
        name = b.take(
            [c for c in b.free() if c in reserved] if last else [p for p in b.free() if p not in reserved]
        )
        if k == 1:
            b.define_const(name)
        else:
            sides = side_args(b, name, k - 1, rng.choice([0, 0, 1, 1, 2]), exclude | reserved | {chain[-1]})
            b.define_op([chain[-1], *sides], name)
        chain.append(name)
    if final_abstract is None:
        return chain[-1]
    for _ in range(rng.randint(0, 2)):
        free_children = [c for c in b.world.abstract_children[final_abstract] if c in b.free()]
        if not free_children:
            break
        child = b.take(free_children)
        if d <= 2 or rng.random() < 0.5:
            b.define_const(child)
        else:
            b.define_op(side_args(b, child, d - 2, rng.randint(1, 2), exclude | reserved), child)
    b.use(final_abstract)
    return final_abstract


def shallow_argument(b: GraphBuilder, width: int, taken: list[str], avoid: set[str]) -> str:
    """A breadth argument: a constant, a zero leaf, or a one-step function of constants."""
    rng = b.rng

    def fresh() -> str:
        return b.take([p for p in b.free() if p not in avoid])

    roll = rng.random()
    if roll < 0.45:
        return b.define_const(fresh())
    if roll < 0.55 and all(p in b.defs for p in taken):  # at most one zero leaf per query
        return b.zero_leaf([p for p in b.free() if p not in avoid])
    consts = [p for p in b.defs if b.defs[p]["op"] == "const" and p not in taken]
    args: list[str] = []
    for _ in range(rng.randint(1, min(2, width))):
        pool = [p for p in consts if p not in args]
        args.append(rng.choice(pool) if pool and rng.random() < 0.4 else b.define_const(fresh()))
    return b.define_op(args, fresh())


def breadth_problem(b: GraphBuilder, width: int) -> str:
    """Build a query of in-degree ``width`` (a category total or a sum of shallow arguments); returns its name."""
    rng = b.rng
    fitting = [a for a, ch in b.world.abstract_children.items() if sum(c in b.free() for c in ch) >= width]
    if fitting and rng.random() < 0.4:
        query = rng.choice(fitting)
        children = set(b.world.abstract_children[query])
        for child in rng.sample([c for c in b.world.abstract_children[query] if c in b.free()], width):
            b.take([child])
            if rng.random() < 0.6:
                b.define_const(child)
            else:
                b.define_op([b.define_const(b.take([p for p in b.free() if p not in children]))], child)
        b.use(query)
        return query
    query = b.take()
    args: list[str] = []
    while len(args) < width:
        args.append(shallow_argument(b, width, args, {query}))
    return b.define_op(args, query)


def distractors(
    b: GraphBuilder, count: int, pool: Sequence[str] | None = None, max_args: int = 2
) -> list[str]:
    """Define ``count`` sentences nobody needs, over ``pool`` (default: every defined instance parameter)."""
    out = []
    for _ in range(count):
        try:
            name = b.take()
        except Exhausted:
            break
        candidates = [
            p for p in (pool if pool is not None else b.defs) if p in b.defs and not p.startswith("[")
        ]
        n_args = min(b.rng.randint(0, max_args), len(candidates))
        if n_args == 0:
            b.define_const(name)
        else:
            b.define(name, random_expr(b.rng, b.rng.sample(candidates, n_args)))
        out.append(name)
    return out


def cut_ancestors(b: GraphBuilder, query: str) -> list[str]:
    """Ancestors of ``query`` without looking behind ``[variable k]`` tokens (their value is carried)."""
    order: list[str] = []

    def go(n: str) -> None:
        if n in order:
            return
        if not n.startswith("["):
            for d in b.deps(n):
                go(d)
        order.append(n)

    go(query)
    return [n for n in order if n in b.defs]
