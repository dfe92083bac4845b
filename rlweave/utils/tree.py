"""Observations that are either one array or a flat dict of arrays.

Manipulation suites hand out ``{"image": uint8, "state": float32, "instruction": uint8, ...}``;
the gymnasium MLP/CNN paths hand out one array. Every helper here takes either form and treats a
dict leaf by leaf, so the env layer, channels and buffers carry both without branching. A plain
array goes straight to the operation (one ``isinstance`` check), so the existing array paths pay
nothing. Only flat dicts are supported: nesting buys nothing for observations and would make every
helper recursive.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

Array = Any  # a numpy array or a torch tensor
Tree = Union[Array, dict[str, Array]]

__all__ = [
    "Tree", "is_dict", "tree_map", "tree_stack", "tree_concat", "tree_index", "tree_set", "tree_zeros",
    "tree_copy", "tree_to_torch", "tree_len", "tree_items", "tree_shapes",
]


def is_dict(x: Tree) -> bool:
    """True when ``x`` is a dict observation rather than one array."""
    return isinstance(x, Mapping)


def tree_map(fn: Callable[[Array], Array], x: Tree) -> Tree:
    """``fn`` applied to every leaf (to ``x`` itself when it is an array)."""
    if isinstance(x, Mapping):
        return {k: fn(v) for k, v in x.items()}
    return fn(x)


def tree_items(x: Tree) -> Iterable[tuple[str | None, Array]]:
    """``(key, leaf)`` pairs; a plain array is the single pair ``(None, x)``."""
    if isinstance(x, Mapping):
        return x.items()
    return ((None, x),)


def tree_stack(items: Sequence[Tree]) -> Tree:
    """Stacks per-env observations into a batch (per key for dicts)."""
    first = items[0]
    if isinstance(first, Mapping):
        return {k: np.stack([it[k] for it in items]) for k in first}
    return np.stack(items)


def tree_concat(items: Sequence[Tree], axis: int = 0) -> Tree:
    """Concatenates batches along ``axis`` (per key for dicts): micro-batches back to one, or
    trajectories ``[T, N]`` side by side (``axis=1``)."""
    first = items[0]
    if isinstance(first, Mapping):
        return {k: np.concatenate([np.asarray(it[k]) for it in items], axis=axis) for k in first}
    return np.concatenate([np.asarray(it) for it in items], axis=axis)


def tree_index(x: Tree, idx: Any) -> Tree:
    """``x[idx]`` for every leaf (an index, a slice, a mask, an index array)."""
    if isinstance(x, Mapping):
        return {k: v[idx] for k, v in x.items()}
    return x[idx]


def tree_set(x: Tree, idx: Any, value: Tree) -> None:
    """``x[idx] = value`` in place for every leaf; ``value`` has the same keys as ``x`` (or is a
    scalar, set in every leaf)."""
    if isinstance(x, Mapping):
        if isinstance(value, Mapping):
            for k, v in x.items():
                v[idx] = value[k]
        else:
            for v in x.values():
                v[idx] = value
        return
    x[idx] = value


def tree_copy(x: Tree) -> Tree:
    """A copy whose leaves share no memory with ``x`` (numpy ``copy`` or torch ``clone``)."""
    if isinstance(x, Mapping):
        return {k: _copy(v) for k, v in x.items()}
    return _copy(x)


def _copy(v: Array) -> Array:
    return v.copy() if isinstance(v, np.ndarray) else v.clone()


def tree_zeros(batch_shape: int | tuple[int, ...], space: Any) -> Tree:
    """Zeros shaped ``(*batch_shape, *leaf_shape)`` in each leaf's dtype, for a gymnasium ``Box`` or
    flat ``Dict`` of boxes (or a template observation: an array or dict of arrays)."""
    batch = (batch_shape,) if isinstance(batch_shape, int) else tuple(batch_shape)
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        return {k: np.zeros((*batch, *s.shape), dtype=s.dtype) for k, s in spaces.items()}
    if isinstance(space, Mapping):
        return {k: np.zeros((*batch, *np.shape(v)), dtype=np.asarray(v).dtype) for k, v in space.items()}
    return np.zeros((*batch, *space.shape), dtype=space.dtype)


def tree_shapes(x: Tree) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """The shape of ``x``, or of each leaf: what an observation is checked against."""
    if isinstance(x, Mapping):
        return {k: tuple(np.shape(v)) for k, v in x.items()}
    return tuple(np.shape(x))


def tree_len(x: Tree) -> int:
    """The batch size: the first dimension of (any) leaf."""
    if isinstance(x, Mapping):
        return len(next(iter(x.values())))
    return len(x)


def tree_to_torch(x: Tree, device: Any = None, float_keys: Iterable[str] | None = None) -> Tree:
    """Torch tensors (sharing memory where numpy allows) on ``device``.

    A plain array keeps its dtype (the callers cast as before). For a dict, ``float_keys`` names the
    leaves cast to float32 (state-like inputs); by default every floating leaf becomes float32 and
    integer leaves (uint8 images, instruction bytes) keep their dtype, so images travel at a quarter
    of the size and are normalised on the device by the model."""
    import torch

    if not isinstance(x, Mapping):
        return torch.as_tensor(x, device=device)
    keys = None if float_keys is None else set(float_keys)
    out: dict[str, Any] = {}
    for k, v in x.items():
        t = torch.as_tensor(v, device=device)
        if (keys is None and t.is_floating_point()) or (keys is not None and k in keys):
            t = t.float()
        out[k] = t
    return out
