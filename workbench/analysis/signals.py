"""A run's RL signals on its topology's graph: per role and per edge, at one step, for the diagram.

    signals = graph_signals(run_dir)                          # the last complete step, coloured by reward/mean
    signals = graph_signals(run_dir, step=3, colour_by="accuracy")
    topology_diagram(run_dir, step=3)                         # the run's topology drawn with them (HTML)
    workbench topology diagram --run RUN_DIR --step 3 --out graph.html   # the same from a shell
    [graph_signals(run_dir, step=s) for s in steps]           # one a step: an animation's frames

Per role, the run's per-role metrics at that step (``ROLE_MEASURES`` where recorded) and, where replays of the
run's calls exist beside it (``wb.replay``), ``replay/advantage``: the mean Q - V of the replays made from that
role's calls. Per edge, read from the step's stored calls (the call after a call is the one linked to it as
``previous`` in a grouped rollout, else the episode's next top-level call): ``taken``, the share of the source
node's calls followed by a call of the target node (``<end>``: the last of its episode), and where both roles
are rewarded on their answer and the later call read the earlier one's (its ``source``), ``fixed`` and
``broke``: the shares of those calls that turned a wrong answer into a right one, or a right one into a wrong
one. A role that runs at several nodes of the main flow gets node colours but no edge figures.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from workbench.analysis.replay_runs import replays_of, stored_estimate
from workbench.store import RunReader
from workbench.store.codec import int_from_cell
from workbench.topology import Topology
from workbench.topology.diagram import Signals, to_html
from workbench.topology.spec import END, AgentNode, CallNode

#: Per-role metrics drawn on a node, where the run recorded them.
ROLE_MEASURES = ("reward/mean", "accuracy", "format/rate", "grad_share", "kl")
#: The call columns an edge's figures are read from.
_CALL_COLUMNS = ["episode_id", "role", "position", "parent_id", "source_id", "previous_id", "rewards"]


def graph_signals(
    run_dir: str | Path,
    step: int | None = None,
    colour_by: str = "reward/mean",
    topology: Topology | None = None,
    advantages: dict[str, float] | None = None,
) -> Signals:
    """The signals of the run in ``run_dir`` at ``step`` (default: its last complete step with something to draw), its nodes
    coloured by ``colour_by`` (a role measure, e.g. ``accuracy`` or ``replay/advantage``). ``topology`` and
    ``advantages`` (``replay_advantages``), where given, are not read again (they do not change by step)."""
    with RunReader(run_dir) as reader:
        topology = topology or _topology(reader)
        complete = complete_steps(reader)
        if not complete:
            raise ValueError(f"the run in {run_dir} has no complete step yet")
        step = complete[-1] if step is None else step
        if step not in complete:
            raise ValueError(f"the run in {run_dir} has no complete step {step}; it has {complete}")
        wide = reader.metrics_wide()
        row = wide.loc[step] if step in wide.index else None
        roles = {
            role: {m: float(row[f"{role}/{m}"]) for m in ROLE_MEASURES if f"{role}/{m}" in row.index}
            for role in topology.roles
        } if row is not None else {}  # fmt: skip
        advantages = replay_advantages(reader) if advantages is None else advantages
        for role, advantage in advantages.items():
            roles.setdefault(role, {})["replay/advantage"] = advantage
        edges = _edges(topology, reader.calls(step=step, columns=_CALL_COLUMNS))
        run_id = reader.run_id
    low, high = (-1.0, 1.0) if colour_by == "replay/advantage" else (0.0, 1.0)
    roles = {role: values for role, values in roles.items() if values}
    return Signals(f"{run_id}, step {step}: colour = {colour_by}", roles, colour_by, edges, low, high)


def topology_diagram(run_dir: str | Path, step: int | None = None, colour_by: str = "reward/mean") -> Any:
    """The run's topology drawn with its signals at ``step``, as a notebook's HTML output."""
    from IPython.display import HTML

    topology = run_topology_of(run_dir)
    signals = graph_signals(run_dir, step, colour_by, topology)
    return HTML(to_html(topology, standalone=False, signals=signals))


def complete_steps(reader: RunReader) -> list[int]:
    """The run's complete steps with something to draw (episodes, or per-role metrics), in order: a training
    run's last step may hold only its final held-out evaluation."""
    return reader.sql(
        "SELECT step FROM steps s WHERE status = 'complete' AND (EXISTS (SELECT 1 FROM episodes e WHERE "
        "e.step = s.step) OR EXISTS (SELECT 1 FROM metrics m WHERE m.step = s.step AND m.role IS NOT NULL)) "
        "ORDER BY step"
    )["step"].tolist()


def run_topology_of(run_dir: str | Path) -> Topology:
    """The topology the run in ``run_dir`` ran."""
    with RunReader(run_dir) as reader:
        return _topology(reader)


def _topology(reader: RunReader) -> Topology:
    from workbench.analysis.replay_source import run_topology

    info = reader.info()
    config = dict(reader.config)
    if not config.get("topology"):  # a run that named its topology only in the runs table
        config["topology"] = info.get("topology")
    if not config["topology"]:
        raise ValueError(f"the run in {info['run_dir']} names no topology")
    return run_topology(Path(info["run_dir"]), config, registries=False)  # drawn: no plugin need be known


def _nodes_by_role(topology: Topology) -> dict[str, str]:
    """Role -> its node in the main flow, for the roles that run at exactly one node."""
    found: dict[str, list[str]] = defaultdict(list)
    for name, node in topology.flow.nodes.items():
        role = (
            node.call if isinstance(node, CallNode) else node.agent if isinstance(node, AgentNode) else None
        )
        if role is not None:
            found[role].append(name)
    return {role: names[0] for role, names in found.items() if len(names) == 1}


def _edges(topology: Topology, calls: Any) -> dict[tuple[str, str], dict[str, float]]:
    """Each edge's ``taken`` share (and ``fixed``/``broke`` between two answers) over ``calls`` of one step."""
    node_of = _nodes_by_role(topology)
    answers = {role for role, spec in topology.roles.items() if spec.reward.kind == "answer"}
    top = calls[calls["parent_id"].isna()]
    by_id = {int(i): row for i, row in zip(top["id"], top.itertuples(index=False), strict=True)}
    after = _calls_after(top)
    out_of: Counter[str] = Counter()
    taken: Counter[tuple[str, str]] = Counter()
    changed: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for call_id, row in by_id.items():
        node = node_of.get(row.role)
        if node is None:
            continue
        out_of[node] += 1
        following = [by_id[i] for i in after.get(call_id, [])]
        targets = {node_of.get(f.role) for f in following} if following else {"<end>"}
        for target in targets - {None}:
            taken[(node, target)] += 1  # once a call: the share of this node's calls that went there
        for nxt in following:
            source = by_id.get(int_from_cell(nxt.source_id))
            target = node_of.get(nxt.role)
            if target is None or source is None or source.role not in answers or nxt.role not in answers:
                continue
            before, now = _reward(source), _reward(nxt)
            if before is not None and now is not None:
                changed[(node, target)]["n"] += 1
                changed[(node, target)]["fixed"] += before < 0.5 <= now
                changed[(node, target)]["broke"] += now < 0.5 <= before
    edges: dict[tuple[str, str], dict[str, float]] = {}
    for (node, target), n in taken.items():
        edges[(node, target)] = {"taken": n / out_of[node], "calls": float(n)}
        counts = changed.get((node, target))
        if counts:
            edges[(node, target)].update(
                fixed=counts["fixed"] / counts["n"], broke=counts["broke"] / counts["n"]
            )
    if topology.flow.start != END and topology.flow.start in out_of:
        edges[("<start>", topology.flow.start)] = {"calls": float(out_of[topology.flow.start])}
    return edges


def _calls_after(top: Any) -> dict[int, list[int]]:
    """Call id -> the ids of the calls right after it: those linked to it as ``previous`` (a grouped rollout
    fans out), else the episode's next top-level call."""
    after: dict[int, list[int]] = defaultdict(list)
    if top["previous_id"].notna().any():
        for call_id, previous in zip(top["id"], top["previous_id"], strict=True):
            if int_from_cell(previous) is not None:
                after[int_from_cell(previous)].append(int(call_id))
    else:
        for _, episode in top.sort_values("position").groupby("episode_id"):
            ids = [int(i) for i in episode["id"]]
            for a, b in zip(ids, ids[1:], strict=False):
                after[a].append(b)
    return after


def _reward(row: Any) -> float | None:
    rewards = row.rewards if isinstance(row.rewards, dict) else {}
    value = rewards.get("reward")
    return None if value is None else float(value)


def replay_advantages(reader: RunReader) -> dict[str, float]:
    """Role -> the mean Q - V (keep arm minus resample arm) of the finished replays made from this run's calls
    that are stored beside it (in the same runs directory), on each call's own role's reward where the role is
    rewarded (with agent-specific rewards, what its GRPO advantage was computed from), else the episode's."""
    found: dict[str, list[float]] = defaultdict(list)
    for path in replays_of(reader.info()["run_dir"]):
        estimate = stored_estimate(path)
        if estimate is not None:
            found[estimate.role].append(estimate.advantage_of(estimate.own_outcome).mean)
    return {role: sum(v) / len(v) for role, v in found.items()}
