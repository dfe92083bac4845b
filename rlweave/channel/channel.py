"""``Channel``: a named, keyed, bounded FIFO between worker groups and the driver.

Two backends behind one interface:

* **Ray** (default): the state lives in a named threaded Ray actor (:class:`~rlweave.channel._actor.
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

The backends live in :mod:`rlweave.channel.ray_channel` (payload transports, pipelined puts) and
:mod:`rlweave.channel.local_channel`.
"""

from __future__ import annotations

from typing import Any, Hashable

from ._core import DEFAULT_REF_THRESHOLD, ChannelClosed, ChannelEmpty, ChannelFull, fmt_timeout

TRANSPORTS = ("auto", "shm", "object_store")


class Channel:
    """A named, keyed, bounded FIFO. Use :meth:`create` / :meth:`connect`, not the constructor."""

    name: str
    maxsize: int
    local: bool = False
    put_window: int = 0
    get_window: int = 0
    views: bool = False

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
        calls: str = "auto",
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
        * ``calls``: how handles reach the channel actor. ``"direct"`` = over a Unix socket
          (:mod:`rlweave.utils.direct`; ~0.1 ms of CPU a call instead of a Ray call's ~1.5 ms
          here), ``"ray"`` = Ray actor calls, ``"auto"`` (default) = ``direct`` with the ``shm``
          transport (one node), else ``ray``.

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
            from .local_channel import LocalChannel

            return LocalChannel._create(name, int(maxsize))
        from .ray_channel import RayChannel

        return RayChannel._create(name, int(maxsize), int(ref_threshold), int(put_window), transport, calls)

    @classmethod
    def connect(cls, name: str) -> "Channel":
        """Find an existing channel: a local one of this process first, then a Ray one.

        Raises ValueError naming the channel if there is none.
        """
        from .local_channel import LocalChannel
        from .ray_channel import RayChannel

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

    def with_put_window(self, put_window: int) -> "Channel":
        """Another handle to the same channel whose puts use ``put_window`` (see :meth:`create`).

        Lets one producer pipeline its puts while other handles keep strict puts. Local channels
        return themselves (their puts never wait on a transfer)."""
        return self

    def with_get_window(self, get_window: int) -> "Channel":
        """Another handle to the same channel whose gets take up to ``get_window`` ready items of
        the requested key per call to the channel, and hand them out one by one.

        Why: on the Ray backend a get is a call to the channel's actor (~2 ms on a 2-core machine),
        more than copying a 10 MB item out of shared memory; a consumer that reads one stream can
        pay that call once per several items, as ``put_window`` does for a producer. What it
        changes: items taken ahead have left the channel (``qsize`` no longer counts them, other
        consumers cannot get them, they are lost if this handle is dropped, like an item in
        transit), and they free their places in a bounded channel early. A handle reads one key
        with its window (asking for another key while items of the first are held raises
        ValueError) and takes no ``get_batch`` while it holds items. 0 = one item per call (the
        default). Local channels return themselves (a get is a function call there)."""
        if get_window < 0:
            raise ValueError(f"channel {self.name!r}: get_window must be >= 0, got {get_window}")
        return self

    def with_views(self, views: bool = True) -> "Channel":
        """Another handle to the same channel whose gets return the numpy arrays of shared-memory
        items as read-only views of the producer's memory instead of copies (``views=False``: copies,
        the default).

        Why: copying a 10 MB item out costs as much as writing it in (~0.9 ms here); Ray's own
        transfers (object store, compiled graphs) hand out read-only views too. What it changes:
        the arrays cannot be written in place (copy first), and the producer cannot reuse an item's
        memory until its arrays are garbage-collected; while a consumer holds many, later items
        travel through the object store. Items of the ``object_store`` transport are read-only
        views either way. Local channels return themselves (a get passes the object itself)."""
        return self

    def flush(self) -> None:
        """Wait until this handle's pipelined puts are stored (see ``put_window``); else a no-op."""

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

    # abstract: put, get_envelope, get_batch_envelopes, qsize, stats, close
