"""The on-disk cache of built models: one directory per entry, built safely by concurrent processes.

Layout under :func:`cache_root` (``$WORKBENCH_CACHE``, else the user cache directory)::

    models/<name>/                    a complete checkpoint, with MANIFEST listing its files
    models/.<name>.lock               the entry's file lock
    models/.<name>.tmp-XXXX/          a build in progress (removed on failure or, if its
                                      process was killed, by the next build under the lock)

An entry is built into a temporary sibling directory under the lock, the manifest (the
completion marker: file sizes and SHA-256 hashes) is written last, and the directory is then
renamed into place, so readers never see a half-written entry. Reading an entry checks the
manifest and file sizes (cheap); ``deep=True`` also checks the hashes. A corrupt or outdated
entry is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workbench.models.errors import ModelBuildError

MANIFEST = "workbench-manifest.json"
CACHE_ENV = "WORKBENCH_CACHE"

Builder = Callable[[Path], dict[str, Any]]
"""Writes a checkpoint into the given empty directory and returns a description of its source."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The workbench cache directory: ``cache_dir``, else ``$WORKBENCH_CACHE``, else the user cache."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("workbench"))


def models_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding the model entries."""
    return cache_root(cache_dir) / "models"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(entry: Path, name: str, recipe: str, source: dict[str, Any]) -> dict[str, Any]:
    """Record every file of ``entry`` with its size and hash; written last, it marks the entry complete."""
    files = {
        str(p.relative_to(entry)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(entry.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {"name": name, "recipe": recipe, "created": time.time(), "source": source, "files": files}
    tmp = entry / (MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, entry / MANIFEST)
    return manifest


def read_manifest(entry: Path) -> dict[str, Any] | None:
    """The entry's manifest, or None when it is missing or unreadable."""
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def check_entry(entry: Path, recipe: str, deep: bool = False) -> str | None:
    """Why ``entry`` is not a complete build of ``recipe``, or None when it is."""
    if not entry.is_dir():
        return "not built"
    manifest = read_manifest(entry)
    if manifest is None:
        return f"no readable {MANIFEST} (an interrupted or foreign build)"
    if manifest.get("recipe") != recipe:
        return f"built by recipe {manifest.get('recipe')!r}, current is {recipe!r}"
    for rel, meta in manifest["files"].items():
        path = entry / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"missing file {rel}"
        if size != meta.get("size"):
            return f"file {rel} has {size} bytes, expected {meta.get('size')}"
        if deep and sha256_file(path) != meta.get("sha256"):
            return f"file {rel} does not match its recorded SHA-256"
    return None


def _remove_leftovers(directory: Path, name: str) -> None:
    """Remove temporary directories of earlier builds of ``name``; only call this holding its lock."""
    for prefix in (f".{name}.tmp-", f".{name}.old-"):
        for stale in directory.glob(prefix + "*"):
            shutil.rmtree(stale, ignore_errors=True)


def ensure_entry(
    name: str,
    recipe: str,
    build: Builder,
    cache_dir: str | os.PathLike[str] | None = None,
    deep: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> Path:
    """Return the complete cache entry ``name``, building it with ``build`` first when needed.

    Safe against concurrent callers (other threads or processes): one builds, the others wait on
    the lock and then find the finished entry.
    """
    from filelock import FileLock

    directory = models_dir(cache_dir)
    entry = directory / name
    if check_entry(entry, recipe, deep) is None:
        return entry
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelBuildError(
            f"cannot create the model cache {directory} ({exc.strerror}): "
            f"set {CACHE_ENV} to a writable directory"
        ) from None
    with FileLock(directory / f".{name}.lock"):
        problem = check_entry(entry, recipe, deep)
        if problem is None:
            return entry
        _remove_leftovers(directory, name)
        if problem == "not built":
            log(f"{name}: building into {directory}")
        else:
            log(f"{name}: the cached copy at {entry} is unusable ({problem}); rebuilding it")
            old = directory / f".{name}.old-{os.getpid()}"
            os.rename(entry, old)
            shutil.rmtree(old, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=directory))
        try:
            source = build(tmp)
            write_manifest(tmp, name, recipe, source)
            umask = os.umask(0)
            os.umask(umask)
            tmp.chmod(0o777 & ~umask)  # mkdtemp made it private; the entry is as readable as any other file
            os.rename(tmp, entry)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(exc, Exception):
                raise
            was = "" if problem == "not built" else f"the cached copy was unusable ({problem}) and "
            if isinstance(exc, ModelBuildError):
                raise ModelBuildError(f"{was}{exc}" if was else str(exc)) from exc
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise ModelBuildError(
                f"{was}could not build model '{name}' into {directory} ({type(exc).__name__}: {first_line}): "
                f"nothing was cached; fix the cause and retry"
            ) from exc
    return entry
