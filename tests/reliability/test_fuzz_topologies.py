"""Topology specs fuzzed by random mutation of the shipped ones (hypothesis).

Every built-in topology is turned into its dict form and damaged one to three times at random places: a
key deleted, a value replaced by one of another type (numbers huge or negative, NaN, None, lists, dicts,
deep garbage, unicode), a role renamed so that references dangle, a reference pointed at a name that does
not exist, an unknown key added, a list or dict emptied. Loading the result must give either a valid
topology (which then survives ``to_dict``/``from_dict`` unchanged) or a ``TopologyError`` listing each
problem with the path of the field and the reason: never another exception, which is what a user would
meet as a traceback from deep inside the workbench.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.topology import TopologyError, from_dict, library, load, to_dict

NAMES = library()
SPECS = {name: to_dict(load(name)) for name in NAMES}

garbage = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats()
    | st.text(max_size=30)
    | st.sampled_from(["", "{{ undefined }}", "{% if %}", "\x00", "ä" * 200, "END", "solver", "1e999"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``value`` (dict keys and list indices), the root included."""
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += paths(item, (*prefix, i))
    return out


def get(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def names_in(spec: dict) -> list[str]:
    return [
        *spec.get("roles", {}),
        *spec.get("tools", {}),
        *spec.get("policies", {}),
        *spec.get("subflows", {}),
    ]


@st.composite
def mutated(draw, name: str) -> tuple[dict, list[str]]:
    spec = copy.deepcopy(SPECS[name])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths(spec)))
        target = get(spec, path)
        parent = get(spec, path[:-1]) if path else None
        kind = draw(st.sampled_from(["delete", "retype", "rename", "dangle", "unknown", "empty"]))
        if kind == "delete" and path:
            del parent[path[-1]]
        elif kind == "retype" and path:
            parent[path[-1]] = draw(garbage)
        elif kind == "rename" and isinstance(target, dict) and target:
            old = draw(st.sampled_from(sorted(target, key=str)))
            target[draw(st.text(min_size=1, max_size=10))] = target.pop(old)
        elif kind == "dangle" and path and isinstance(target, str):
            parent[path[-1]] = draw(st.sampled_from(["nobody", "", *names_in(spec)]))
        elif kind == "unknown" and isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=10))] = draw(garbage)
        elif kind == "empty" and path and isinstance(target, dict | list):
            parent[path[-1]] = type(target)()
        else:
            continue
        done.append(f"{kind} {'.'.join(map(str, path))}")
    return spec, done


@pytest.mark.parametrize("name", NAMES)
def test_every_shipped_topology_loads_and_round_trips(name):
    assert to_dict(from_dict(SPECS[name], name)) == SPECS[name]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_topology_loads_or_names_each_problem_and_never_raises_anything_else(name, data):
    spec, done = data.draw(mutated(name))
    try:
        topology = from_dict(spec, name)
    except TopologyError as error:
        assert error.problems, done
        for problem in error.problems:
            assert problem.path and problem.message, (done, str(problem))
        assert all(str(p) in str(error) for p in error.problems)
        return
    except Exception as error:  # noqa: BLE001 - the assertion below is the test
        pytest.fail(f"{type(error).__name__} after {done}: {error}")
    again = to_dict(topology)
    assert to_dict(from_dict(again, name)) == again, done


@pytest.mark.parametrize(
    ("where", "value", "path"),
    [
        (("roles",), None, "roles"),
        (("flow",), [], "flow"),
        (("policies",), 5, "policies"),
        (("params",), math.nan, "params"),
        (("tools",), "search", "tools"),
    ],
)
def test_a_wrong_type_at_the_top_names_the_field(where, value, path):
    spec = copy.deepcopy(SPECS["marsrl"])
    spec[where[0]] = value
    with pytest.raises(TopologyError) as error:
        from_dict(spec, "marsrl")
    assert any(p.path.startswith(path) for p in error.value.problems), str(error.value)


def test_a_renamed_role_names_every_dangling_reference():
    spec = copy.deepcopy(SPECS["marsrl"])
    spec["roles"]["the_solver"] = spec["roles"].pop("solver")
    with pytest.raises(TopologyError) as error:
        from_dict(spec, "marsrl")
    assert "solver" in str(error.value)
    assert all(p.path.startswith(("flow", "subflows", "roles", "tools")) for p in error.value.problems)
