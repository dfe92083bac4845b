"""Channels: named, keyed, bounded FIFOs between worker groups and the driver.

See :mod:`rlweave.channel.channel` for the semantics shared by both backends,
:mod:`rlweave.channel.ray_channel` (a named Ray actor; payload transports) and
:mod:`rlweave.channel.local_channel` (in-process).
"""

from ._core import (
    DEFAULT_REF_THRESHOLD,
    ChannelClosed,
    ChannelEmpty,
    ChannelError,
    ChannelFull,
    Envelope,
    estimate_nbytes,
    resolve_version,
)
from ._actor import ChannelActor
from ._shm import ChannelPayloadLost
from .channel import Channel
from .local_channel import LocalChannel
from .ray_channel import RayChannel

__all__ = [
    "Channel",
    "ChannelActor",
    "ChannelClosed",
    "ChannelEmpty",
    "ChannelError",
    "ChannelFull",
    "ChannelPayloadLost",
    "DEFAULT_REF_THRESHOLD",
    "Envelope",
    "LocalChannel",
    "RayChannel",
    "estimate_nbytes",
    "resolve_version",
]
