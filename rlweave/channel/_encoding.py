"""How a Ray channel's handle encodes an item before it leaves the producer: cloudpickled bytes
(small items), the item itself (plain values, items holding Ray handles), or a shared-memory
descriptor (large items with numpy buffers, :mod:`rlweave.channel._shm`)."""

from __future__ import annotations

import pickle
from typing import Any

from . import _shm
from ._core import ENC_OBJECT, ENC_PICKLED, PLAIN_TYPES


class _NeedsRaySerialization(Exception):
    pass


_dumps = None


def _cloudpickle(obj: Any, buffer_callback=None) -> bytes:
    """cloudpickle ``obj``; raises _NeedsRaySerialization if it holds Ray handles (ObjectRefs,
    actor handles), which only Ray's own serialisation tracks correctly. With ``buffer_callback``
    (pickle protocol 5), numpy arrays hand their memory to it instead of into the bytes."""
    global _dumps
    if _dumps is None:
        import io

        import ray
        import ray.cloudpickle as cloudpickle

        ray_types = tuple(
            t for t in (ray.ObjectRef, ray.actor.ActorHandle, getattr(ray, "ObjectRefGenerator", None)) if t
        )

        class _Pickler(cloudpickle.CloudPickler):
            def reducer_override(self, obj):
                if isinstance(obj, ray_types):
                    raise _NeedsRaySerialization
                return super().reducer_override(obj)

        def dumps(obj, buffer_callback=None) -> bytes:
            buf = io.BytesIO()
            _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffer_callback).dump(obj)
            return buf.getvalue()

        _dumps = dumps
    return _dumps(obj, buffer_callback)


def _pickle_or_object(item: Any) -> tuple[Any, int]:
    """Small items: cloudpickled bytes, unless they hold Ray handles; those travel as objects."""
    if item is None or type(item) in PLAIN_TYPES:
        return item, ENC_OBJECT  # nothing to gain
    try:
        return _cloudpickle(item), ENC_PICKLED
    except _NeedsRaySerialization:
        return item, ENC_OBJECT


def _shm_or_none(item: Any, min_bytes: int) -> Any:
    """A shared-memory descriptor of ``item``, or None when the shared memory cannot take it: it
    holds Ray handles, less than ``min_bytes`` of it is out-of-band buffers (torch tensors pickle
    their storage in-band), or this process's arena is full."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        meta = _cloudpickle(item, buffers.append)
    except _NeedsRaySerialization:
        return None
    raws = [b.raw() for b in buffers]
    if sum(r.nbytes for r in raws) < min_bytes:
        return None
    return _shm.write(meta, raws)
