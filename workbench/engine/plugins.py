"""Plugins: tool kinds, verifiers, parsers, selectors and judge prompts of your own, in every process a run uses.

A researcher registers a tool kind (``workbench.tools.register_tool_kind``) or a verifier
(``workbench.rewards.register``) in a notebook cell; a run then goes on in other processes: ``wb.train``'s
background process, a resume, ``workbench train``, Ray rollout workers and trainer ranks. Two ways carry
what was registered there, as the ecosystem does it:

- **by value** (how Ray ships a notebook's functions): :func:`snapshot` cloudpickles every registry entry
  whose code is not the workbench's own (a class or function defined in a cell travels with its code; one
  from an importable module travels by reference). ``wb.train`` and ``wb.rollout(background=True)`` store
  it in the run directory (``plugins.pkl``); the run's processes :func:`restore` it before they read the spec,
  so a resumed run gets the same plugins.
- **by name**: modules listed in ``TrainConfig.plugins`` (``workbench topology validate --plugins``) are
  imported first, in every process; importing them registers what they define. The way for code kept in
  files, and for ``workbench train config.yaml`` from a shell.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

PLUGINS_FILE = "plugins.pkl"


def registries() -> dict[str, dict[str, Any]]:
    """The registries a spec names entries of, by what they hold."""
    from workbench.engine.parsers import PARSERS, POSTPROCESS
    from workbench.engine.selectors import SELECTORS
    from workbench.rewards.judge import JUDGE_PROMPTS
    from workbench.rewards.verifiers import VERIFIERS
    from workbench.tools import TOOL_KINDS

    return {
        "tool kinds": TOOL_KINDS,
        "verifiers": VERIFIERS,
        "parsers": PARSERS,
        "postprocessors": POSTPROCESS,
        "selectors": SELECTORS,
        "judge prompts": JUDGE_PROMPTS,
    }


def _is_ours(entry: Any) -> bool:
    """Whether the workbench defines ``entry``: a function's or class's module; for an object (a judge prompt),
    the module of its code (its first function-valued field)."""
    if not (callable(entry) and hasattr(entry, "__qualname__")):
        code = [v for v in vars(entry).values() if callable(v)] if hasattr(entry, "__dict__") else []
        entry = code[0] if code else type(entry)
    module = getattr(entry, "__module__", None) or ""
    return module == "workbench" or module.startswith("workbench.")


def registered() -> dict[str, dict[str, Any]]:
    """The entries registered from outside the workbench, by registry (empty registries left out)."""
    out = {}
    for name, registry in registries().items():
        theirs = {key: entry for key, entry in registry.items() if not _is_ours(entry)}
        if theirs:
            out[name] = theirs
    return out


def snapshot() -> bytes | None:
    """Everything :func:`registered` holds, cloudpickled entry by entry; None when nothing is. An entry that
    cannot be pickled (a closure over a lock or an open model, say) is left out with a warning naming it: a
    run whose spec uses it then fails in its own process with that name unknown."""
    import warnings

    import cloudpickle

    entries: dict[str, dict[str, bytes]] = {}
    for kind, found in registered().items():
        for key, entry in found.items():
            try:
                entries.setdefault(kind, {})[key] = cloudpickle.dumps(entry)
            except Exception as error:  # noqa: BLE001 - named in the warning
                warnings.warn(
                    f"the {kind[:-1]} {key!r} registered here cannot be sent to a run's process ({error}); define it "
                    "in a module and list it in the config's plugins",
                    stacklevel=2,
                )
    return cloudpickle.dumps(entries) if entries else None


def restore(data: bytes | None) -> list[str]:
    """Register the entries of a :func:`snapshot` here; returns what was registered (``kind: name``).

    An entry that cannot be loaded here (pickled by reference to a module this process cannot import) is left
    out with a warning naming it: only a spec that uses it fails, with that name unknown."""
    if not data:
        return []
    import warnings

    import cloudpickle

    targets = registries()
    added = []
    for kind, found in cloudpickle.loads(data).items():
        for key, pickled in found.items():
            try:
                targets[kind][key] = cloudpickle.loads(pickled)
            except Exception as error:  # noqa: BLE001 - named in the warning
                warnings.warn(
                    f"the {kind[:-1]} {key!r} of this run cannot be loaded here: {error}", stacklevel=2
                )
                continue
            added.append(f"{kind}: {key}")
    return added


def import_modules(names: list[str] | tuple[str, ...]) -> None:
    """Import each module of ``names`` (its import registers its plugins); a ``ValueError`` names one that fails."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - the plugin's own error, named
            raise ValueError(
                f"plugin module {name!r} could not be imported: {type(error).__name__}: {error}"
            ) from error


def save(run_dir: str | Path) -> bool:
    """Store this process's plugins in ``run_dir`` (``plugins.pkl``); False when there are none."""
    data = snapshot()
    if data is None:
        return False
    (Path(run_dir) / PLUGINS_FILE).write_bytes(data)
    return True


def load(run_dir: str | Path, modules: list[str] | tuple[str, ...] = ()) -> bytes | None:
    """Make a run's plugins available in this process: its plugin modules, then what ``run_dir`` stores.
    Returns the stored snapshot (for processes further on, such as Ray workers), or None."""
    import_modules(modules)
    path = Path(run_dir) / PLUGINS_FILE
    data = path.read_bytes() if path.is_file() else None
    restore(data)
    return data
