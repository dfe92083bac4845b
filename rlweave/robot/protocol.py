"""The robot wire protocol: msgpack messages over websockets, numpy arrays in msgpack-numpy's
layout, camera frames as JPEG/PNG bytes (Pillow), every request checked against a schema.

Requests (trainer -> robot) are maps with ``op`` and an optional integer ``id`` the reply echoes:

===========  ===========================================  ==============================================
op           fields                                        reply
===========  ===========================================  ==============================================
spec         -                                             ``spec``: spaces, limits, who controls
claim        session (str), name (str)                     control granted, or refused naming the holder
release      -                                             control given up (the robot is held)
reset        seed (int or nil)                             ``episode``, ``obs``
step         episode, seq (int), action (array),           ``obs``, ``reward``, ``terminated``,
             recover (bool, optional)                      ``truncated``, ``aborted``, ``clipped``
hold         -                                             the robot is held (e-stop; any client may)
heartbeat    -                                             none (one-way)
===========  ===========================================  ==============================================

A reply is ``{"ok": True, ...}`` or ``{"ok": False, "code": ..., "error": one line}``.

Why a strict decoder of its own for arrays: msgpack-numpy's ``decode`` unpickles arrays of kind
``O`` (object), i.e. it would run code chosen by whoever sends a message. :func:`unpack` rebuilds
only plain numeric arrays (bool, int, uint, float) whose byte count matches their shape, and
refuses anything else as malformed.
"""

from __future__ import annotations

import io
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np

__all__ = ["PROTOCOL_VERSION", "ProtocolError", "pack", "unpack", "check_request", "encode_frame", "decode_frame",
           "array_spec", "space_from_spec", "check_array"]

PROTOCOL_VERSION = 1
_NUMERIC = "biuf"


class ProtocolError(ValueError):
    """A message that does not follow the protocol; ``code`` says which rule it broke."""

    def __init__(self, message: str, code: str = "malformed"):
        super().__init__(message)
        self.code = code


def pack(message: dict) -> bytes:
    """One message as msgpack bytes (numpy arrays in msgpack-numpy's layout)."""
    return msgpack.packb(message, default=msgpack_numpy.encode, use_bin_type=True)


def _decode_array(obj: dict) -> Any:
    if obj.get(b"nd") is not True:
        return obj
    kind, descr, shape, data = obj.get(b"kind", b""), obj.get(b"type"), obj.get(b"shape"), obj.get(b"data")
    if kind not in (b"", None) or not isinstance(descr, str) or not isinstance(data, bytes):
        raise ProtocolError("array: only plain numeric arrays are accepted")
    try:
        dtype = np.dtype(descr)
    except TypeError:
        raise ProtocolError(f"array: unknown dtype {descr!r}") from None
    if dtype.kind not in _NUMERIC or not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"array: dtype {dtype} / shape {shape!r} not accepted (numeric arrays only)")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(data):
        raise ProtocolError(f"array: {len(data)} bytes do not make shape {tuple(shape)} of {dtype}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def unpack(data: Any, max_bytes: int | None = None) -> dict:
    """A received message as a dict; :class:`ProtocolError` for anything else (text frames, bad
    msgpack, non-map messages, unsafe arrays, too many bytes)."""
    if not isinstance(data, (bytes, bytearray)):
        raise ProtocolError("messages are binary msgpack frames, not text")
    if max_bytes is not None and len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes is over the limit of {max_bytes}", "oversize")
    try:
        message = msgpack.unpackb(bytes(data), object_hook=_decode_array, raw=False, strict_map_key=True)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - msgpack raises several types for bad input
        raise ProtocolError(f"not a msgpack message ({type(e).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"a message is a map, got {type(message).__name__}")
    return message


# ------------------------------------------------------------------------------ request schema
_INT, _STR, _BOOL = (int,), (str,), (bool,)
REQUESTS: dict[str, dict[str, tuple[tuple, bool]]] = {  # op -> field -> (accepted types, required)
    "spec": {},
    "claim": {"session": (_STR, True), "name": (_STR, True)},
    "release": {},
    "reset": {"seed": ((int, type(None)), False)},
    "step": {"episode": (_INT, True), "seq": (_INT, True), "action": ((np.ndarray,), True), "recover": (_BOOL, False)},
    "hold": {},
    "heartbeat": {},
}


def check_request(message: dict) -> str:
    """The request's op, after checking its fields' names and types (one-line :class:`ProtocolError`)."""
    op = message.get("op")
    if op not in REQUESTS:
        raise ProtocolError(f"op: unknown {op!r} (known: {', '.join(REQUESTS)})")
    if "id" in message and (not isinstance(message["id"], int) or isinstance(message["id"], bool)):
        raise ProtocolError("id: must be an integer")
    fields = REQUESTS[op]
    unknown = set(message) - set(fields) - {"op", "id"}
    if unknown:
        raise ProtocolError(f"{op}: unknown field(s) {sorted(unknown)}")
    for name, (types, required) in fields.items():
        if name not in message:
            if required:
                raise ProtocolError(f"{op}: missing field '{name}'")
            continue
        value = message[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ProtocolError(f"{op}.{name}: expected {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    return op


def array_spec(shape, dtype, low=None, high=None) -> dict:
    """How a spec message describes one array (a Box's shape, dtype and bounds)."""
    spec: dict[str, Any] = {"shape": [int(d) for d in shape], "dtype": np.dtype(dtype).str}
    if low is not None:
        spec["low"] = np.asarray(low, dtype=np.float64)
        spec["high"] = np.asarray(high, dtype=np.float64)
    return spec


def space_from_spec(spec: dict):
    """The ``gymnasium.spaces.Box`` a spec entry describes (images: 0..255)."""
    import gymnasium as gym

    dtype = np.dtype(spec["dtype"])
    if "low" in spec:
        return gym.spaces.Box(np.asarray(spec["low"]).astype(dtype), np.asarray(spec["high"]).astype(dtype), tuple(spec["shape"]), dtype)
    return gym.spaces.Box(0, 255, tuple(spec["shape"]), dtype)


def check_array(name: str, value: Any, spec: dict) -> np.ndarray:
    """``value`` as an array of exactly ``spec``'s shape and dtype, else :class:`ProtocolError`
    (code ``schema``). No silent casting: a float64 action for a float32 robot is a client bug."""
    if not isinstance(value, np.ndarray):
        raise ProtocolError(f"{name}: expected an array, got {type(value).__name__}", "schema")
    if list(value.shape) != list(spec["shape"]) or value.dtype != np.dtype(spec["dtype"]):
        raise ProtocolError(f"{name}: expected shape {tuple(spec['shape'])} {np.dtype(spec['dtype'])}, "
                            f"got {tuple(value.shape)} {value.dtype}", "schema")
    return value


# ------------------------------------------------------------------------------ camera frames
def encode_frame(image: np.ndarray, fmt: str = "jpeg", quality: int = 90) -> bytes:
    """An HxWx3 uint8 image compressed (``jpeg``: lossy and small; ``png``: exact)."""
    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    if fmt == "jpeg":
        img.save(buf, format="JPEG", quality=int(quality))
    elif fmt == "png":
        img.save(buf, format="PNG", compress_level=1)
    else:
        raise ValueError(f"camera format: 'jpeg' or 'png', got {fmt!r}")
    return buf.getvalue()


def decode_frame(data: Any, shape: list[int]) -> np.ndarray:
    """A compressed frame back to an HxWx3 uint8 array, checked against the spec's shape BEFORE
    the pixels are decoded (so a forged header cannot make the client allocate a huge image)."""
    from PIL import Image

    if not isinstance(data, bytes):
        raise ProtocolError(f"camera frame: expected bytes, got {type(data).__name__}", "schema")
    try:
        img = Image.open(io.BytesIO(data))
        if img.format not in ("JPEG", "PNG") or (img.height, img.width) != tuple(shape[:2]):
            raise ProtocolError(f"camera frame: {img.format} {img.height}x{img.width}, expected {shape[0]}x{shape[1]}", "schema")
        out = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - Pillow raises several types for corrupt data
        raise ProtocolError(f"camera frame: cannot decode ({type(e).__name__})", "schema") from None
    return out
