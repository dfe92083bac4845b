"""The openpi client protocol's message encoding: msgpack with numpy arrays as tagged maps.

Why not the ``msgpack-numpy`` package: openpi's ``openpi_client.msgpack_numpy`` uses its own tags
(``__ndarray__`` with ``data``/``dtype``/``shape``, ``__npgeneric__`` for scalars) and refuses object
arrays, so a server speaking the other package's tags (``nd``/``type``/``kind``) is not understood by
openpi clients. The encoding is the protocol, so it is stated here once, on top of the ``msgpack``
library; ``openpi_client`` itself cannot be imported (it pins numpy < 2).

Decoding is strict because the bytes come from the network: object, void and character dtypes are
refused, and a buffer whose length does not match its declared shape is an error, not a crash.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

__all__ = ["WireError", "packb", "unpackb"]

_REFUSED_KINDS = ("O", "V", "c")


class WireError(ValueError):
    """A message that does not decode; the text says what was wrong with it."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in _REFUSED_KINDS:
        raise TypeError(f"cannot send numpy dtype {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send an object of type {type(obj).__name__}")


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        dtype = _dtype(obj.get(b"dtype"))
        shape = obj.get(b"shape")
        data = obj.get(b"data")
        if not isinstance(data, bytes) or not isinstance(shape, (list, tuple)) or not all(
                isinstance(s, int) and s >= 0 for s in shape):
            raise WireError("array: needs bytes 'data' and a list of non-negative ints 'shape'")
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
            raise WireError(f"array: {len(data)} bytes do not make shape {tuple(shape)} of {dtype}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if b"__npgeneric__" in obj:
        return _dtype(obj.get(b"dtype")).type(obj.get(b"data"))
    return obj


def _dtype(spec: Any) -> np.dtype:
    try:
        dtype = np.dtype(spec)
    except TypeError:
        raise WireError(f"array: unknown dtype {spec!r}") from None
    if dtype.kind in _REFUSED_KINDS:
        raise WireError(f"array: dtype {dtype} is not accepted")
    return dtype


def packb(obj: Any) -> bytes:
    """``obj`` (dicts, lists, scalars, strings, numpy arrays) as one binary message."""
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """One message back as Python objects with numpy arrays (read-only views of the message).
    WireError on anything that is not a well-formed message."""
    try:
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for malformed input
        raise WireError(f"not a msgpack message ({type(e).__name__}: {e})") from None
