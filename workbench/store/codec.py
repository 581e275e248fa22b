"""Compact encodings for what the run store keeps: token arrays as BLOBs, structured fields as JSON.

Token ids are stored as little-endian int32, logprobs and per-token advantages as float32, and the
ownership mask as one unsigned byte per completion token holding a `TokenOwner` code. Readers get
numpy arrays (or lists) back; nothing is ever re-tokenised.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Literal

import numpy as np

from .errors import InvalidRecordError

IDS_DTYPE = np.dtype("<i4")
FLOAT_DTYPE = np.dtype("<f4")
MASK_DTYPE = np.dtype("u1")

ArrayFormat = Literal["numpy", "list", "bytes"]


class TokenOwner(enum.IntEnum):
    """Who owns a completion token; the codes stored in a call's `mask` (one byte per token).

    MASKED (0): kept out of the loss (padding, truncated or otherwise excluded text).
    TRAINABLE (1): sampled by this call's policy and trained on.
    TOOL (2): text a tool returned, spliced into the completion; never trained on.
    OTHER_ROLE (3): text another role produced inside this sequence; never trained on here.
    """

    MASKED = 0
    TRAINABLE = 1
    TOOL = 2
    OTHER_ROLE = 3


_MAX_OWNER = max(TokenOwner)


def _as_1d(value: Any, field: str) -> np.ndarray:
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        raise InvalidRecordError(
            f"{field} must be a sequence of numbers (list or numpy array), got {type(value).__name__}"
        )
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(
            f"{field} is not a flat sequence of numbers ({exc}); pass a 1-D list"
        ) from None
    if arr.ndim != 1:
        raise InvalidRecordError(f"{field} must be 1-D, got shape {arr.shape}; flatten it or pass one row")
    return arr


def encode_ids(value: Any, field: str) -> bytes | None:
    """Token ids (list, numpy or CPU tensor) -> int32 bytes; None stays None."""
    if value is None:
        return None
    arr = _as_1d(value, field)
    if arr.dtype != IDS_DTYPE:
        if arr.size == 0:
            return b""
        if arr.dtype.kind not in "iu":
            raise InvalidRecordError(f"{field} must hold integer token ids, got dtype {arr.dtype}")
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > np.iinfo(IDS_DTYPE).max:
            raise InvalidRecordError(f"{field} has token id {lo if lo < 0 else hi} outside 0..2**31-1")
        arr = arr.astype(IDS_DTYPE)
    return arr.tobytes()


def encode_floats(value: Any, field: str) -> bytes | None:
    """Logprobs or per-token advantages -> float32 bytes; None stays None."""
    if value is None:
        return None
    arr = _as_1d(value, field)
    if arr.dtype != FLOAT_DTYPE:
        if arr.size == 0:
            return b""
        if arr.dtype.kind not in "fiu":
            raise InvalidRecordError(f"{field} must hold numbers, got dtype {arr.dtype}")
        arr = arr.astype(FLOAT_DTYPE)
    return arr.tobytes()


def encode_mask(value: Any, field: str = "mask") -> bytes | None:
    """Ownership mask of `TokenOwner` codes -> one byte per token (booleans: 1 trainable, 0 masked)."""
    if value is None:
        return None
    arr = _as_1d(value, field)
    if arr.size == 0:
        return b""
    if arr.dtype == np.bool_:
        arr = arr.astype(MASK_DTYPE)
    elif arr.dtype.kind not in "iu":
        raise InvalidRecordError(f"{field} must hold TokenOwner codes 0-3, got dtype {arr.dtype}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _MAX_OWNER:
        bad = lo if lo < 0 else hi
        raise InvalidRecordError(
            f"{field} has code {bad}; use TokenOwner codes 0 masked, 1 trainable, 2 tool, 3 other role"
        )
    if arr.dtype != MASK_DTYPE:
        arr = arr.astype(MASK_DTYPE)
    return arr.tobytes()


def n_items(blob: bytes | None, dtype: np.dtype) -> int | None:
    """Number of elements in an encoded array (None for a missing array)."""
    return None if blob is None else len(blob) // dtype.itemsize


def decode_array(blob: bytes | None, dtype: np.dtype, fmt: ArrayFormat = "numpy") -> Any:
    """Encoded bytes -> a fresh, writable numpy array (or list, or the bytes themselves)."""
    if blob is None or fmt == "bytes":
        return blob
    arr = np.frombuffer(blob, dtype=dtype)
    if fmt == "list":
        return arr.tolist()
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def dumps(value: Any, field: str) -> str | None:
    """A JSON field -> text (numpy scalars and arrays, paths and pydantic models converted); None stays None."""
    if value is None:
        return None
    try:
        return json.dumps(value, default=_json_default, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidRecordError(
            f"{field} is not JSON data ({exc}); pass dicts, lists, str and numbers"
        ) from None


def loads(text: str | None) -> Any:
    """JSON text -> Python value; None stays None."""
    return None if text is None else json.loads(text)


def plain(value: Any, where: str = "config") -> Any:
    """Deep-copy `value` into plain YAML/JSON data (dict, list, str, int, float, bool, None).

    Tuples become lists, numpy scalars Python numbers, paths strings; anything else raises an error
    naming the key path where it sits.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRecordError(f"{where} has non-string key {key!r}; use string keys")
            out[key] = plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(mode="json"), where)
    raise InvalidRecordError(
        f"{where} holds a {type(value).__name__}, which is not plain data; convert it to dict/list/str/number"
    )


def as_number(value: Any, field: str) -> float:
    """A metric or reward value -> float (numpy and 0-d tensors accepted; NaN allowed)."""
    if isinstance(value, bool) or value is None:
        raise InvalidRecordError(f"{field} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InvalidRecordError(
            f"{field} must be a number, got {type(value).__name__} {value!r:.40}"
        ) from None
    return out


def rewards_json(value: Any, field: str = "rewards") -> str | None:
    """A call's named rewards ({name: number or None}) -> JSON text; NaN and infinities become null."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidRecordError(f"{field} must be a dict of name -> number, e.g. {{'correct': 1.0}}")
    clean = {}
    for name, v in value.items():
        if not isinstance(name, str):
            raise InvalidRecordError(f"{field} has non-string name {name!r}; name each reward with a string")
        number = None if v is None else as_number(v, f"{field}[{name!r}]")
        clean[name] = number if number is None or math.isfinite(number) else None
    return json.dumps(clean, separators=(",", ":"))


def from_cell(value: Any) -> Any:
    """A cell read back (a pandas frame's) as plain Python: arrays as lists, numpy scalars as Python ones,
    NULL (None, NA, NaN) as None."""
    import pandas as pd

    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def int_from_cell(value: Any) -> int | None:
    """A stored nullable INTEGER (an id, a step) read back: an int, or None for NULL."""
    value = from_cell(value)
    return None if value is None else int(value)
