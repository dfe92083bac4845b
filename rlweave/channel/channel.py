"""``Channel``: a named, keyed, bounded FIFO between worker groups and the driver.

Two backends behind one interface:

* **Ray** (default): the state lives in a named async Ray actor (:class:`~rlweave.channel._actor.
  ChannelActor`, ``num_cpus=0``, ``max_concurrency=1000``, default lifetime, i.e. it fate-shares with
  the process that created it, in the current job's namespace). The :class:`Channel` object is a
  small picklable handle (name + actor handle) that can be passed to other Ray actors and tasks and
  used there. ``Channel.connect(name)`` finds an existing channel by name.
* **Local** (``local=True``): in-process and thread-safe (``threading.Condition``), for the runtime's
  single-process debug mode and for workers fused into one process. Same semantics. A local channel
  is registered by name in its process; ``connect(name)`` finds it there first.

Semantics, both backends:

* Every item is stored with a key (any hashable; default ``None``), a weight (default 1.0, e.g. the
  number of samples in a batch), the policy ``version`` that produced it and ``seq``, the channel-wide
  put order. If ``version`` is None and the item is a ``tensordict.TensorDict`` with a
  ``"policy_version"`` entry, the version is taken from it (minimum over the batch if per-sample).
* FIFO per key; ``get(key=None)`` returns the globally oldest item of any key.
* ``maxsize > 0`` bounds the number of items across all keys: ``put`` then blocks (or times out
  with :class:`ChannelFull`) until a ``get`` frees space.
* ``get_batch(target_weight)`` returns, in FIFO order, the shortest run of items whose summed weight
  is >= ``target_weight`` (weights 1, 2, 3 and target 3 give the first two). It takes items as they
  arrive, so a bounded channel keeps flowing while a large batch accumulates; on timeout the items it
  took are put back in front and :class:`ChannelEmpty` is raised. Concurrent ``get_batch`` calls on
  the same key may interleave (each result is still in FIFO order).
* Errors are one line naming the channel, e.g. ``ChannelFull: channel 'obs' is full (maxsize=4)``.

Payloads (Ray backend): small items are cloudpickled by the producer and travel as bytes that the
channel actor stores without looking inside (it never imports the item's classes); items holding
Ray handles (ObjectRefs, actor handles) travel as objects so Ray tracks the references. Items whose
estimated size (:func:`estimate_nbytes`: numpy arrays / torch tensors at top level, in a
TensorDict, or in dicts/lists) is at least ``ref_threshold`` bytes (default 64 KiB) never pass
through the channel actor; they go by the channel's ``transport``:

* ``shm`` (chosen by ``auto`` when the Ray cluster has one node): the producer copies the item's
  numpy buffers into shared memory it owns (:mod:`rlweave.channel._shm`), the actor carries a small
  descriptor, the consumer copies them out into new, writable arrays. Items without numpy buffers
  (torch tensors pickle their storage in-band) and items that find the producer's arena full go
  through the object store instead.
* ``object_store`` (``auto`` on several nodes): the producer ``ray.put``s the item and sends only
  the ObjectRef; the consumer ``ray.get``s it. Numpy arrays then come back zero-copy (read-only
  views of the object store: copy before writing in place). Torch tensors work too but are
  serialised by pickling their storage; convert TensorDicts to numpy (``td.numpy()``) for the
  fastest path.

Either way the item belongs to the producing process: if that process exits before the item is
consumed, ``get`` raises (:class:`~rlweave.channel.ChannelPayloadLost`, or Ray's
``OwnerDiedError``).

Pipelined puts (Ray backend, opt-in): ``Channel.create(..., put_window=W)`` or
``ch.with_put_window(W)`` lets a blocking put without timeout return once sent, with up to W in
flight per handle (order kept by per-handle sequence numbers; the handle's next other call or
``flush()`` waits for them). By default (W=0) a put returns once the item is stored.

A caller that abandons a blocking Ray ``get`` (e.g. Ctrl-C) may lose the item the actor hands out
afterwards; use timeouts for graceful shutdown. Inside async actors use ``aput``/``aget``/
``aget_batch``: the blocking methods would block the event loop.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import uuid
from collections import deque
from typing import Any, Hashable

from . import _shm
from ._actor import OK, ChannelActor
from ._core import (
    DEFAULT_REF_THRESHOLD,
    ENC_OBJECT,
    ENC_PICKLED,
    ENC_REF,
    ENC_SHM,
    ChannelClosed,
    ChannelEmpty,
    ChannelFull,
    Entry,
    Envelope,
    Store,
    check_timeout,
    estimate_nbytes,
    fmt_timeout,
    resolve_version,
)

ACTOR_PREFIX = "rlweave_channel:"
MAX_CONCURRENCY = 1000
TRANSPORTS = ("auto", "shm", "object_store")


def _check_target(name: str, target_weight: float) -> float:
    target = float(target_weight)
    if not target > 0:
        raise ValueError(f"channel {name!r}: get_batch target_weight must be > 0, got {target_weight!r}")
    return target


class Channel:
    """A named, keyed, bounded FIFO. Use :meth:`create` / :meth:`connect`, not the constructor."""

    name: str
    maxsize: int
    local: bool = False
    put_window: int = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        local: bool = False,
        *,
        ref_threshold: int = DEFAULT_REF_THRESHOLD,
        put_window: int = 0,
        transport: str = "auto",
    ) -> "Channel":
        """Create a channel. ``maxsize`` 0 = unbounded; it counts items across all keys.

        Ray backend only (the local backend ignores them):

        * ``ref_threshold``: payloads estimated at this many bytes or more do not travel inline
          through the channel actor but by ``transport``.
        * ``transport``: ``"shm"`` = node-local shared memory (:mod:`rlweave.channel._shm`; the
          consumer gets new, writable arrays), ``"object_store"`` = Ray's object store by reference
          (read-only zero-copy arrays; works across nodes), ``"auto"`` (default) = ``shm`` when
          the Ray cluster has one node (on Linux), else ``object_store``. Items
          the shared memory cannot take (no out-of-band buffers, e.g. torch tensors; arena full)
          go through the object store.
        * ``put_window``: 0 (default) = a put returns once the item is stored. ``W > 0`` = pipelined
          puts: a blocking put without timeout returns once *sent*, with up to W per handle in
          flight, so the producer overlaps the next item with the transfer. Order per handle is
          kept (sequence numbers); the handle's next non-put call (get, qsize, stats, a put with a
          timeout or non-blocking) and :meth:`flush` wait until they are stored and raise their
          errors; backpressure still holds, with a slack of W items per producer.

        Raises ValueError if a channel of that name exists.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"channel name must be a non-empty string, got {name!r}")
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        if put_window < 0:
            raise ValueError(f"channel {name!r}: put_window must be >= 0, got {put_window}")
        if transport not in TRANSPORTS:
            raise ValueError(f"channel {name!r}: transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if local:
            return LocalChannel._create(name, int(maxsize))
        return RayChannel._create(name, int(maxsize), int(ref_threshold), int(put_window), transport)

    @classmethod
    def connect(cls, name: str) -> "Channel":
        """Find an existing channel: a local one of this process first, then a Ray one.

        Raises ValueError naming the channel if there is none.
        """
        ch = LocalChannel._registry_get(name)
        if ch is not None:
            return ch
        return RayChannel._connect(name)

    # ------------------------------------------------------------------ shared sugar
    def put_nowait(self, item: Any, key: Hashable = None, **kw) -> None:
        kw["block"] = False
        self.put(item, key, **kw)

    def get(self, key: Hashable = None, *, block: bool = True, timeout: float | None = None) -> Any:
        """The oldest item of ``key`` (``None``: of any key). Raises ChannelEmpty on timeout / empty."""
        return self.get_envelope(key, block=block, timeout=timeout).item

    def get_nowait(self, key: Hashable = None) -> Any:
        return self.get(key, block=False)

    def get_batch(self, target_weight: float, key: Hashable = None, *, timeout: float | None = None) -> list:
        """Items (FIFO) whose summed weight first reaches ``target_weight``; blocks until available."""
        return [e.item for e in self.get_batch_envelopes(target_weight, key, timeout=timeout)]

    async def aget(self, key: Hashable = None, *, block: bool = True, timeout: float | None = None) -> Any:
        return (await self.aget_envelope(key, block=block, timeout=timeout)).item

    async def aget_batch(self, target_weight: float, key: Hashable = None, *, timeout: float | None = None) -> list:
        return [e.item for e in await self.aget_batch_envelopes(target_weight, key, timeout=timeout)]

    def with_put_window(self, put_window: int) -> "Channel":
        """Another handle to the same channel whose puts use ``put_window`` (see :meth:`create`).

        Lets one producer pipeline its puts while other handles keep strict puts. Local channels
        return themselves (their puts never wait on a transfer)."""
        return self

    def flush(self) -> None:
        """Wait until this handle's pipelined puts are stored (see ``put_window``); else a no-op."""

    async def aflush(self) -> None:
        """Awaitable :meth:`flush`."""

    # ------------------------------------------------------------------ error text
    def _full_error(self, timeout: float | None) -> ChannelFull:
        msg = f"channel {self.name!r} is full (maxsize={self.maxsize})"
        if timeout:
            msg += f"; put timed out after {fmt_timeout(timeout)}"
        return ChannelFull(msg)

    def _empty_error(self, key: Hashable, timeout: float | None) -> ChannelEmpty:
        what = "is empty" if key is None else f"has no item for key {key!r}"
        msg = f"channel {self.name!r} {what}"
        if timeout:
            msg += f"; get timed out after {fmt_timeout(timeout)}"
        return ChannelEmpty(msg)

    def _batch_error(self, key: Hashable, target: float, have: float, timeout: float | None) -> ChannelEmpty:
        where = "" if key is None else f" for key {key!r}"
        msg = f"channel {self.name!r} holds weight {have:g} of the {target:g} asked{where}"
        if timeout:
            msg += f"; get_batch timed out after {fmt_timeout(timeout)}"
        return ChannelEmpty(msg)

    def _closed_error(self) -> ChannelClosed:
        return ChannelClosed(f"channel {self.name!r} is closed")

    def __repr__(self) -> str:
        kind = "local" if self.local else "ray"
        return f"Channel({self.name!r}, maxsize={self.maxsize}, backend={kind})"

    # abstract: put, get_envelope, get_batch_envelopes, aput, aget_envelope, aget_batch_envelopes,
    # qsize, stats, close


# ====================================================================== Ray backend


_remote_actor_cls = None


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
    if item is None or type(item) in (int, float, bool, str, bytes):
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


def _actor_class():
    global _remote_actor_cls
    if _remote_actor_cls is None:
        import ray

        _remote_actor_cls = ray.remote(ChannelActor)
    return _remote_actor_cls


def _rebuild_ray_channel(name, actor, maxsize, ref_threshold, put_window=0, transport="object_store"):
    return RayChannel(name, actor, maxsize, ref_threshold, put_window, transport)


def _resolve_transport(name: str, transport: str) -> str:
    """``auto`` -> ``shm`` on a one-node cluster where memfd segments work (Linux), else
    ``object_store``; an explicit ``shm`` that cannot work is refused."""
    if transport == "object_store":
        return transport
    import ray

    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    if _shm.available() and nodes == 1:
        return "shm"
    if transport == "shm":
        why = f"the Ray cluster has {nodes} nodes" if nodes != 1 else "this system has no memfd_create or /proc"
        raise ValueError(f"channel {name!r}: transport='shm' needs one node and Linux shared memory; {why}")
    return "object_store"


class RayChannel(Channel):
    """Handle to a channel whose state lives in a named :class:`ChannelActor`."""

    local = False

    def __init__(
        self, name: str, actor, maxsize: int, ref_threshold: int, put_window: int = 0, transport: str = "object_store"
    ):
        self.name = name
        self.maxsize = maxsize
        self.ref_threshold = ref_threshold
        self.put_window = put_window
        self.transport = transport
        self._actor = actor
        self._closed = False
        # pipelined puts (put_window > 0): replies not yet collected, this handle's producer id
        self._pending: deque = deque()
        self._lock = threading.Lock()
        self._producer: str | None = None
        self._pseq = 0

    def __reduce__(self):  # a copy is a new producer: it gets its own id and sequence
        return _rebuild_ray_channel, (
            self.name, self._actor, self.maxsize, self.ref_threshold, self.put_window, self.transport
        )

    def with_put_window(self, put_window: int) -> "RayChannel":
        if put_window < 0:
            raise ValueError(f"channel {self.name!r}: put_window must be >= 0, got {put_window}")
        return RayChannel(self.name, self._actor, self.maxsize, self.ref_threshold, int(put_window), self.transport)

    @classmethod
    def _create(
        cls, name: str, maxsize: int, ref_threshold: int, put_window: int = 0, transport: str = "auto"
    ) -> "RayChannel":
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                f"channel {name!r}: Ray is not initialised; call ray.init() first or create it with local=True"
            )
        transport = _resolve_transport(name, transport)
        namespace = ray.get_runtime_context().namespace
        try:
            actor = (
                _actor_class()
                .options(
                    name=ACTOR_PREFIX + name,
                    namespace=namespace,
                    num_cpus=0,
                    max_concurrency=MAX_CONCURRENCY,
                    max_restarts=0,
                )
                .remote(name, maxsize, ref_threshold, put_window, transport)
            )
        except ValueError as e:
            raise ValueError(f"channel {name!r} already exists (use Channel.connect): {e}") from None
        return cls(name, actor, maxsize, ref_threshold, put_window, transport)

    @classmethod
    def _connect(cls, name: str) -> "RayChannel":
        import ray

        if not ray.is_initialized():
            raise ValueError(f"no channel named {name!r}: Ray is not initialised and no local channel has that name")
        try:
            actor = ray.get_actor(ACTOR_PREFIX + name)
        except ValueError:
            raise ValueError(f"no channel named {name!r} (namespace {ray.get_runtime_context().namespace!r})") from None
        try:
            cfg = ray.get(actor.config.remote())
        except ray.exceptions.RayActorError:
            raise ValueError(f"no channel named {name!r} (its actor is dead)") from None
        return cls(name, actor, cfg["maxsize"], cfg["ref_threshold"], cfg["put_window"], cfg["transport"])

    # ---------------------------------------------------------------- encoding
    def _encode(self, item: Any) -> tuple[Any, int]:
        if self.ref_threshold > 0 and estimate_nbytes(item) >= self.ref_threshold:
            if self.transport == "shm":
                desc = _shm_or_none(item, self.ref_threshold)
                if desc is not None:
                    return desc, ENC_SHM
            import ray

            return [ray.put(item)], ENC_REF
        return _pickle_or_object(item)

    def _put_failed(self, payload: Any, enc: int) -> None:
        """The item was not stored: its shared-memory block (if any) is free again."""
        if enc == ENC_SHM:
            _shm.release(payload)

    def _envelopes(self, entries: list[Entry], refs_values: list) -> list[Envelope]:
        values = iter(refs_values)
        out = []
        for e in entries:
            if e.enc == ENC_REF:
                item = next(values)
            elif e.enc == ENC_SHM:
                item = _shm.read(e.payload, self.name)
            elif e.enc == ENC_PICKLED:
                item = pickle.loads(e.payload)
            else:
                item = e.payload
            out.append(Envelope(item, e.key, e.weight, e.version, e.seq))
        return out

    def _decode(self, entries: list[Entry]) -> list[Envelope]:
        refs = [e.payload[0] for e in entries if e.enc == ENC_REF]
        if refs:
            import ray

            return self._envelopes(entries, ray.get(refs))
        return self._envelopes(entries, [])

    async def _adecode(self, entries: list[Entry]) -> list[Envelope]:
        refs = [e.payload[0] for e in entries if e.enc == ENC_REF]
        return self._envelopes(entries, list(await asyncio.gather(*refs)) if refs else [])

    def _call(self, ref):
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            self._closed = True
            raise self._closed_error() from None

    async def _acall(self, ref):
        import ray

        try:
            return await ref
        except ray.exceptions.RayActorError:
            self._closed = True
            raise self._closed_error() from None

    def _check_open(self):
        if self._closed:
            raise self._closed_error()

    # ---------------------------------------------------------------- pipelined puts
    def _submit_pipelined(self, payload, key, weight, version, enc):
        """Under self._lock: send one put tagged with this handle's producer id and sequence."""
        if self._producer is None:
            self._producer = uuid.uuid4().hex
        ref = self._actor.put.remote((payload, key, weight, version, enc, None, self._producer, self._pseq))
        self._pseq += 1
        self._pending.append(ref)

    def _pop_pending(self, keep: int):
        with self._lock:
            return self._pending.popleft() if len(self._pending) > keep else None

    def flush(self) -> None:
        """Wait until every put sent through this handle is stored in the channel (pipelined puts,
        ``put_window > 0``); raises ChannelClosed if the channel died meanwhile. A no-op otherwise."""
        while (ref := self._pop_pending(0)) is not None:
            self._call(ref)

    async def aflush(self) -> None:
        while (ref := self._pop_pending(0)) is not None:
            await self._acall(ref)

    # ---------------------------------------------------------------- sync API
    def put(
        self,
        item: Any,
        key: Hashable = None,
        *,
        weight: float = 1.0,
        version: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        self._check_open()
        timeout = check_timeout(block, timeout)
        version = resolve_version(item, version)
        payload, enc = self._encode(item)
        if self.put_window > 0 and timeout is None:
            while True:
                with self._lock:
                    if len(self._pending) < self.put_window:
                        self._submit_pipelined(payload, key, float(weight), version, enc)
                        return
                    ref = self._pending.popleft()
                self._call(ref)
        try:
            self.flush()
            status = self._call(self._actor.put.remote((payload, key, float(weight), version, enc, timeout, None, 0)))
        except BaseException:
            self._put_failed(payload, enc)
            raise
        if status != OK:
            self._put_failed(payload, enc)
            raise self._full_error(timeout)

    def get_envelope(self, key: Hashable = None, *, block: bool = True, timeout: float | None = None) -> Envelope:
        self._check_open()
        self.flush()
        timeout = check_timeout(block, timeout)
        status, entry = self._call(self._actor.get.remote(key, timeout))
        if status != OK:
            raise self._empty_error(key, timeout)
        return self._decode([entry])[0]

    def get_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        self._check_open()
        self.flush()
        target = _check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        status, result = self._call(self._actor.get_batch.remote(key, target, timeout))
        if status != OK:
            raise self._batch_error(key, target, result, timeout)
        return self._decode(result)

    def qsize(self, key: Hashable = None) -> int:
        self._check_open()
        self.flush()
        return self._call(self._actor.qsize.remote(key))

    def stats(self) -> dict:
        """Debug counters from the channel actor (``puts_inline``, ``puts_by_ref``, ``gets``, ...)."""
        self._check_open()
        self.flush()
        return self._call(self._actor.stats.remote())

    def close(self) -> None:
        """Kill the channel actor (idempotent). Items still inside are dropped."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._pending.clear()
        import ray

        try:
            ray.kill(self._actor, no_restart=True)
        except Exception:
            return
        # ray.kill returns before the actor is gone: wait for it, so that no other handle's call
        # can still be served (and get an item) after close() returned
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                ray.get(self._actor.ping.remote(), timeout=1.0)
            except Exception:  # noqa: BLE001 - the actor is dead: closed
                return
            time.sleep(0.01)

    # ---------------------------------------------------------------- async API
    async def aput(
        self,
        item: Any,
        key: Hashable = None,
        *,
        weight: float = 1.0,
        version: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        self._check_open()
        timeout = check_timeout(block, timeout)
        version = resolve_version(item, version)
        payload, enc = self._encode(item)
        if self.put_window > 0 and timeout is None:
            while True:
                with self._lock:
                    if len(self._pending) < self.put_window:
                        self._submit_pipelined(payload, key, float(weight), version, enc)
                        return
                    ref = self._pending.popleft()
                await self._acall(ref)
        try:
            await self.aflush()
            status = await self._acall(
                self._actor.put.remote((payload, key, float(weight), version, enc, timeout, None, 0))
            )
        except BaseException:
            self._put_failed(payload, enc)
            raise
        if status != OK:
            self._put_failed(payload, enc)
            raise self._full_error(timeout)

    async def aget_envelope(
        self, key: Hashable = None, *, block: bool = True, timeout: float | None = None
    ) -> Envelope:
        self._check_open()
        await self.aflush()
        timeout = check_timeout(block, timeout)
        status, entry = await self._acall(self._actor.get.remote(key, timeout))
        if status != OK:
            raise self._empty_error(key, timeout)
        return (await self._adecode([entry]))[0]

    async def aget_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        self._check_open()
        await self.aflush()
        target = _check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        status, result = await self._acall(self._actor.get_batch.remote(key, target, timeout))
        if status != OK:
            raise self._batch_error(key, target, result, timeout)
        return await self._adecode(result)


# ====================================================================== local backend


class _LocalRegistry:
    lock = threading.Lock()
    channels: dict[str, "LocalChannel"] = {}


def _rebuild_local_channel(name):
    ch = LocalChannel._registry_get(name)
    if ch is None:
        raise ValueError(
            f"local channel {name!r} does not exist in this process (local channels cannot cross processes)"
        )
    return ch


def _wake(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class LocalChannel(Channel):
    """In-process, thread-safe channel; the async methods never block the event loop."""

    local = True
    ref_threshold = 0

    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.maxsize = maxsize
        self._store = Store(maxsize)
        self._cond = threading.Condition(threading.Lock())
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self._closed = False
        self._blocked_puts = 0

    def __reduce__(self):  # same-process copies (deepcopy, pickling to a thread) resolve to this channel
        return _rebuild_local_channel, (self.name,)

    @classmethod
    def _create(cls, name: str, maxsize: int) -> "LocalChannel":
        with _LocalRegistry.lock:
            if name in _LocalRegistry.channels:
                raise ValueError(f"channel {name!r} already exists (use Channel.connect)")
            ch = _LocalRegistry.channels[name] = cls(name, maxsize)
        return ch

    @staticmethod
    def _registry_get(name: str) -> "LocalChannel | None":
        with _LocalRegistry.lock:
            return _LocalRegistry.channels.get(name)

    # ---------------------------------------------------------------- waiting machinery
    def _notify(self) -> None:  # caller holds self._cond
        self._cond.notify_all()
        if self._async_waiters:
            for loop, fut in self._async_waiters:
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # loop closed
                    pass
            self._async_waiters.clear()

    def _run_sync(self, attempt, timeout: float | None) -> bool:
        """Retry ``attempt()`` (under the lock) until it returns True or ``timeout`` runs out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise self._closed_error()
                if attempt():
                    return True
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)

    async def _run_async(self, attempt, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            with self._cond:
                if self._closed:
                    raise self._closed_error()
                if attempt():
                    return True
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return False
                fut = loop.create_future()
                waiter = (loop, fut)
                self._async_waiters.add(waiter)
            try:
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                with self._cond:
                    self._async_waiters.discard(waiter)

    # ---------------------------------------------------------------- attempts (run under the lock)
    def _put_attempt(self, item, key, weight, version, timeout: float | None):
        counted = timeout == 0  # a non-blocking put that fails is not a blocked put

        def attempt() -> bool:
            nonlocal counted
            if self._store.full():
                if not counted:
                    counted = True
                    self._blocked_puts += 1
                return False
            self._store.push(key, weight, version, item, False)
            self._notify()
            return True

        return attempt

    def _get_attempt(self, key, out: list):
        def attempt() -> bool:
            entry = self._store.pop(key)
            if entry is None:
                return False
            out.append(entry)
            self._notify()
            return True

        return attempt

    def _batch_attempt(self, key, target, taken: list, state: list):
        def attempt() -> bool:
            n = len(taken)
            state[0] = self._store.drain_batch(key, target, taken, state[0])
            if len(taken) != n:
                self._notify()
            return state[0] >= target

        return attempt

    def _restore(self, taken: list) -> None:
        if taken:
            with self._cond:
                self._store.restore(taken)
                self._notify()

    @staticmethod
    def _envelope(e: Entry) -> Envelope:
        return Envelope(e.payload, e.key, e.weight, e.version, e.seq)

    # ---------------------------------------------------------------- sync API
    def put(
        self,
        item: Any,
        key: Hashable = None,
        *,
        weight: float = 1.0,
        version: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        timeout = check_timeout(block, timeout)
        version = resolve_version(item, version)
        if not self._run_sync(self._put_attempt(item, key, float(weight), version, timeout), timeout):
            raise self._full_error(timeout)

    def get_envelope(self, key: Hashable = None, *, block: bool = True, timeout: float | None = None) -> Envelope:
        timeout = check_timeout(block, timeout)
        out: list[Entry] = []
        if not self._run_sync(self._get_attempt(key, out), timeout):
            raise self._empty_error(key, timeout)
        return self._envelope(out[0])

    def get_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        target = _check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        taken: list[Entry] = []
        state = [0.0]
        ok = False
        try:
            ok = self._run_sync(self._batch_attempt(key, target, taken, state), timeout)
        finally:
            if not ok:
                self._restore(taken)
        if not ok:
            raise self._batch_error(key, target, state[0], timeout)
        return [self._envelope(e) for e in taken]

    def qsize(self, key: Hashable = None) -> int:
        with self._cond:
            if self._closed:
                raise self._closed_error()
            return self._store.qsize(key)

    def stats(self) -> dict:
        with self._cond:
            if self._closed:
                raise self._closed_error()
            return {**self._store.stats(), "blocked_puts": self._blocked_puts, "backend": "local"}

    def close(self) -> None:
        """Close the channel (idempotent): waiting and later calls raise ChannelClosed; the name is freed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._store.clear()
            self._notify()
        with _LocalRegistry.lock:
            if _LocalRegistry.channels.get(self.name) is self:
                del _LocalRegistry.channels[self.name]

    # ---------------------------------------------------------------- async API
    async def aput(
        self,
        item: Any,
        key: Hashable = None,
        *,
        weight: float = 1.0,
        version: int | None = None,
        block: bool = True,
        timeout: float | None = None,
    ) -> None:
        timeout = check_timeout(block, timeout)
        version = resolve_version(item, version)
        if not await self._run_async(self._put_attempt(item, key, float(weight), version, timeout), timeout):
            raise self._full_error(timeout)

    async def aget_envelope(
        self, key: Hashable = None, *, block: bool = True, timeout: float | None = None
    ) -> Envelope:
        timeout = check_timeout(block, timeout)
        out: list[Entry] = []
        if not await self._run_async(self._get_attempt(key, out), timeout):
            raise self._empty_error(key, timeout)
        return self._envelope(out[0])

    async def aget_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        target = _check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        taken: list[Entry] = []
        state = [0.0]
        ok = False
        try:
            ok = await self._run_async(self._batch_attempt(key, target, taken, state), timeout)
        finally:
            if not ok:
                self._restore(taken)
        if not ok:
            raise self._batch_error(key, target, state[0], timeout)
        return [self._envelope(e) for e in taken]
