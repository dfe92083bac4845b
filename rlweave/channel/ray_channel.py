"""The Ray backend of :class:`~rlweave.channel.channel.Channel`: a handle to a channel whose state
lives in a named :class:`~rlweave.channel._actor.ChannelActor`.

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

Calls (Ray backend): with the ``shm`` transport (one node) a handle reaches the channel actor over a
Unix socket (``calls="direct"``, :mod:`rlweave.utils.direct`) rather than by Ray calls: a put or get
then costs ~0.1 ms of CPU on each side instead of ~1.5 ms. Each handle opens one connection per
calling thread (requests of one thread run in order, as a handle's pipelined puts must; two handles
used from one thread never wait on each other). Puts whose payload holds Ray handles (an item that
fell back to the object store) still go by a Ray call, and the actor hands such entries to a direct
get by one Ray call, so Ray's reference counting sees every handle. ``calls="ray"`` keeps Ray calls.

A caller that abandons a blocking Ray ``get`` (e.g. Ctrl-C) may lose the item the actor hands out
afterwards; use timeouts for graceful shutdown.
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from collections import deque
from typing import Any, Hashable

from . import _shm
from ._actor import OK, ChannelActor
from ._core import (
    ENC_HELD,
    ENC_PICKLED,
    ENC_REF,
    ENC_SHM,
    ChannelClosed,
    Entry,
    Envelope,
    check_target,
    check_timeout,
    estimate_nbytes,
    holds_ray_handles,
    resolve_version,
)
from ._encoding import _pickle_or_object, _shm_or_none
from .channel import Channel
from rlweave.utils import direct

ACTOR_PREFIX = "rlweave_channel:"
MAX_CONCURRENCY = 1000
CALLS = ("auto", "direct", "ray")

_remote_actor_cls = None


def _actor_class():
    global _remote_actor_cls
    if _remote_actor_cls is None:
        import ray

        _remote_actor_cls = ray.remote(ChannelActor)
    return _remote_actor_cls


def _rebuild_ray_channel(name, actor, maxsize, ref_threshold, put_window=0, transport="object_store", get_window=0,
                         direct_address=None, views=False):
    return RayChannel(name, actor, maxsize, ref_threshold, put_window, transport, get_window, direct_address, views)


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


def _resolve_calls(name: str, calls: str, transport: str) -> str:
    """``auto`` -> ``direct`` with the node-local ``shm`` transport, else ``ray``; an explicit
    ``direct`` without it is refused (a Unix socket reaches this node only)."""
    if calls not in CALLS:
        raise ValueError(f"channel {name!r}: calls must be one of {', '.join(CALLS)}, got {calls!r}")
    if calls == "auto":
        return "direct" if transport == "shm" else "ray"
    if calls == "direct" and transport != "shm":
        raise ValueError(f"channel {name!r}: calls='direct' needs the node-local transport 'shm' (one node), not {transport!r}")
    return calls


class RayChannel(Channel):
    """Handle to a channel whose state lives in a named :class:`ChannelActor`."""

    local = False

    def __init__(
        self, name: str, actor, maxsize: int, ref_threshold: int, put_window: int = 0, transport: str = "object_store",
        get_window: int = 0, direct_address: tuple[str, bytes] | None = None, views: bool = False,
    ):
        self.name = name
        self.views = views
        # direct calls: the actor's socket, and this handle's connection per calling thread
        self._direct_address = direct_address
        self._connections: dict[int, direct.DirectConnection] = {}
        self.get_window = get_window
        # get window (get_window > 0): entries taken ahead, not decoded yet, and the key they were taken for
        self._ahead: deque = deque()
        self._ahead_key: Hashable = None
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

    def __reduce__(self):  # a copy is a new producer (its own id and sequence) and a new consumer (nothing taken ahead)
        return _rebuild_ray_channel, (
            self.name, self._actor, self.maxsize, self.ref_threshold, self.put_window, self.transport, self.get_window,
            self._direct_address, self.views,
        )

    def with_put_window(self, put_window: int) -> "RayChannel":
        if put_window < 0:
            raise ValueError(f"channel {self.name!r}: put_window must be >= 0, got {put_window}")
        return self._variant(put_window=int(put_window))

    def with_get_window(self, get_window: int) -> "RayChannel":
        super().with_get_window(get_window)  # validates
        return self._variant(get_window=int(get_window))

    def with_views(self, views: bool = True) -> "RayChannel":
        return self._variant(views=bool(views))

    def _variant(self, **changes) -> "RayChannel":
        """A new handle to the same channel with some of this handle's options changed."""
        options = {"put_window": self.put_window, "transport": self.transport, "get_window": self.get_window,
                   "direct_address": self._direct_address, "views": self.views, **changes}
        return RayChannel(self.name, self._actor, self.maxsize, self.ref_threshold, **options)

    @classmethod
    def _create(
        cls, name: str, maxsize: int, ref_threshold: int, put_window: int = 0, transport: str = "auto", calls: str = "auto"
    ) -> "RayChannel":
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                f"channel {name!r}: Ray is not initialised; call ray.init() first or create it with local=True"
            )
        transport = _resolve_transport(name, transport)
        calls = _resolve_calls(name, calls, transport)
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
                .remote(name, maxsize, ref_threshold, put_window, transport, calls)
            )
        except ValueError as e:
            raise ValueError(f"channel {name!r} already exists (use Channel.connect): {e}") from None
        address = ray.get(actor.config.remote())["direct"] if calls == "direct" else None
        return cls(name, actor, maxsize, ref_threshold, put_window, transport, 0, address)

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
        return cls(name, actor, cfg["maxsize"], cfg["ref_threshold"], cfg["put_window"], cfg["transport"], 0, cfg.get("direct"))

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
                item = _shm.read(e.payload, self.name, copy=not self.views)
            elif e.enc == ENC_PICKLED:
                item = pickle.loads(e.payload)
            else:
                item = e.payload
            out.append(Envelope(item, e.key, e.weight, e.version, e.seq))
        return out

    def _decode(self, entries: list[Entry]) -> list[Envelope]:
        entries = [self._take_held(e) if e.enc == ENC_HELD else e for e in entries]
        refs = [e.payload[0] for e in entries if e.enc == ENC_REF]
        if refs:
            import ray

            return self._envelopes(entries, ray.get(refs))
        return self._envelopes(entries, [])

    def _take_held(self, entry: Entry) -> Entry:
        """An entry a direct get left in the actor (its payload holds Ray handles), by a Ray call."""
        enc, payload = self._call(self._actor.take_held.remote(entry.payload))
        return entry._replace(payload=payload, enc=enc)

    # ---------------------------------------------------------------- calls to the actor
    def _submit(self, method: str, *args, by_ray: bool = False):
        """Send one call to the channel actor: over this thread's direct connection, or as a Ray
        call (``by_ray``: arguments holding Ray handles; or a handle without direct calls, or
        arguments plain pickle cannot carry). Returns what :meth:`_call` waits on."""
        if self._direct_address is not None and not by_ray:
            try:
                return self._connection().submit("channel", method, args)
            except direct.PeerGone:
                self._closed = True
                raise self._closed_error() from None
            except (pickle.PicklingError, TypeError, AttributeError):
                pass  # e.g. a key of a class defined in a function: cloudpickle (Ray) can send it
        return getattr(self._actor, method).remote(*args)

    def _connection(self) -> direct.DirectConnection:
        thread = threading.get_ident()
        conn = self._connections.get(thread)
        if conn is None:
            try:
                conn = direct.DirectConnection(*self._direct_address)
            except (OSError, EOFError):
                self._closed = True
                raise self._closed_error() from None
            self._connections[thread] = conn
        return conn

    def _call(self, pending):
        """The reply of one call sent by :meth:`_submit`; the channel's death is ChannelClosed."""
        if isinstance(pending, direct.DirectPending):
            try:
                ok, payload = pending.connection.result(pending.rid)
            except direct.PeerGone:
                self._closed = True
                raise self._closed_error() from None
            if ok:
                return payload[0]
            if isinstance(payload, ChannelClosed):  # the actor was closed by another handle
                self._closed = True
                raise self._closed_error() from None
            raise payload
        import ray

        try:
            return ray.get(pending)
        except (ray.exceptions.RayActorError, ChannelClosed):  # dead, or closed (Ray raises the actor's error as its class)
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
        ref = self._submit("put", (payload, key, weight, version, enc, None, self._producer, self._pseq),
                           by_ray=holds_ray_handles(payload, enc))
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
            status = self._call(self._submit("put", (payload, key, float(weight), version, enc, timeout, None, 0),
                                             by_ray=holds_ray_handles(payload, enc)))
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
        if self.get_window:
            return self._get_windowed(key, timeout)
        status, entry = self._call(self._submit("get", key, timeout))
        if status != OK:
            raise self._empty_error(key, timeout)
        return self._decode([entry])[0]

    def _get_windowed(self, key: Hashable, timeout: float | None) -> Envelope:
        """A get through the get window: one item taken ahead earlier, else one call for up to
        ``get_window`` ready items. Each is decoded when handed out, so a shared-memory block is
        copied out (and released) in order, one item at a time."""
        if self._ahead and key != self._ahead_key:
            raise ValueError(f"channel {self.name!r}: this handle's get window holds items of key {self._ahead_key!r}; "
                             f"it cannot get key {key!r} before they are consumed")
        if not self._ahead:
            status, entries = self._call(self._submit("get_up_to", key, self.get_window, timeout))
            if status != OK:
                raise self._empty_error(key, timeout)
            self._ahead.extend(entries)
            self._ahead_key = key
        return self._decode([self._ahead.popleft()])[0]

    def get_batch_envelopes(
        self, target_weight: float, key: Hashable = None, *, timeout: float | None = None
    ) -> list[Envelope]:
        self._check_open()
        self.flush()
        if self._ahead:
            raise ValueError(f"channel {self.name!r}: get_batch on a handle whose get window holds {len(self._ahead)} item(s)")
        target = check_target(self.name, target_weight)
        timeout = check_timeout(True, timeout)
        status, result = self._call(self._submit("get_batch", key, target, timeout))
        if status != OK:
            raise self._batch_error(key, target, result, timeout)
        return self._decode(result)

    def qsize(self, key: Hashable = None) -> int:
        self._check_open()
        self.flush()
        return self._call(self._submit("qsize", key))

    def stats(self) -> dict:
        """Debug counters from the channel actor (``puts_inline``, ``puts_by_ref``, ``gets``, ...)."""
        self._check_open()
        self.flush()
        return self._call(self._submit("stats"))

    def close(self) -> None:
        """Kill the channel actor (idempotent). Items still inside are dropped."""
        if self._closed:
            return
        self._closed = True
        self._ahead.clear()
        with self._lock:
            self._pending.clear()
        for conn in self._connections.values():
            conn.conn.close()
        self._connections.clear()
        import ray

        try:  # refuse every call first: the killed process may still serve another handle's direct call a moment
            ray.get(self._actor.close.remote(), timeout=2.0)
        except Exception:  # noqa: BLE001 - dead already, or all its threads blocked: the kill below still ends it
            pass
        try:
            ray.kill(self._actor, no_restart=True)
        except Exception:
            return
        # ray.kill returns before the actor is gone: wait for it, so that no other handle's call
        # can still be served (and get an item) after close() returned
        # (a ping that merely times out on a loaded machine proves nothing: only the actor's death ends the wait)
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            try:
                ray.get(self._actor.ping.remote(), timeout=1.0)
            except ray.exceptions.GetTimeoutError:
                continue
            except Exception:  # noqa: BLE001 - the actor is dead: closed
                return
            time.sleep(0.01)
