"""Checks of a grid op's arguments against the *global* shapes, made before any plan or
exchange, so bad input gives the same clear error on every rank.

Without them, each rank's local kernel would see only its window: a kernel larger than the
grid or a reflect pad wider than it would give an empty output or wrong rows instead of an
error, and where torch's kernel does raise, ranks with an empty slab (which skip the kernel)
would not, leaving the ranks out of step. The messages are torch's own (the error one process
gives), except that they describe the global tensor; the errors are RuntimeErrors as torch's.
Pure Python on ints: nothing is traced.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshshard.errors import LayoutError

__all__ = ["check_conv", "check_mesh", "check_pad", "check_pool"]


def _x(v: Sequence[int]) -> str:
    return " x ".join(str(int(a)) for a in v)


def check_mesh(op: str, mesh, *ts) -> None:
    """Every ShardTensor among ``ts`` lives on ``mesh`` (else a LayoutError)."""
    for t in ts:
        spec = getattr(t, "_spec", None)
        if spec is None:
            continue
        if spec.mesh is not mesh and spec.mesh != mesh:
            msg = (f"{op}: ShardTensors live on different DeviceMeshes ({mesh} and "
                   f"{spec.mesh}); move one with from_local(t.full_tensor(), mesh, ...) or "
                   "build both on the same mesh")
            raise LayoutError(msg)


def check_conv(x_shape, w_shape, padding, dilation, transposed: bool, groups: int,
               gout: Sequence[int]) -> None:
    """Channels, kernel size and output size of ``aten.convolution`` on the global input."""
    x_shape, w_shape = [int(v) for v in x_shape], [int(v) for v in w_shape]
    nsp = len(w_shape) - 2
    c = x_shape[-nsp - 1]
    want = w_shape[0] if transposed else w_shape[1] * groups
    if c != want:
        kind = "transposed=1" if transposed else f"groups={groups}"
        msg = (f"Given {kind}, weight of size {w_shape}, expected input{x_shape} to have "
               f"{want} channels, but got {c} channels instead")
        raise RuntimeError(msg)
    spatial = x_shape[-nsp:]
    if transposed:
        if any(v <= 0 for v in gout):
            msg = (f"Given input size per channel: ({_x(spatial)}). Calculated output size per "
                   f"channel: ({_x(gout)}). Output size is too small")
            raise RuntimeError(msg)
        return
    padded = [n + 2 * p for n, p in zip(spatial, padding)]
    kernel = [d * (k - 1) + 1 for k, d in zip(w_shape[2:], dilation)]
    if any(a < b for a, b in zip(padded, kernel)):
        msg = (f"Calculated padded input size per channel: ({_x(padded)}). Kernel size: "
               f"({_x(kernel)}). Kernel size can't be greater than actual input size")
        raise RuntimeError(msg)


def check_pool(x_shape, k, s, p, dl, gout: Sequence[int]) -> None:
    """Padding and output size of a max / average pool on the global input."""
    nsp = len(k)
    for ka, pa, da in zip(k, p, dl):
        if pa > ka // 2:
            msg = (f"pad should be at most half of effective kernel size, but got pad={pa}, "
                   f"kernel_size={ka} and dilation={da}")
            raise RuntimeError(msg)
    if any(v <= 0 for v in gout):
        c = int(x_shape[-nsp - 1])
        spatial = [int(v) for v in x_shape[-nsp:]]
        msg = (f"Given input size: ({'x'.join(map(str, [c, *spatial]))}). Calculated output "
               f"size: ({'x'.join(map(str, [c, *gout]))}). Output size is too small")
        raise RuntimeError(msg)


def check_pad(x_shape, pad: Sequence[int], mode: str) -> None:
    """``F.pad``'s limits per padded dim of the global input (reflect: each pad smaller than
    the dim; circular: at most the dim; constant: no negative output size)."""
    x_shape = [int(v) for v in x_shape]
    nd = len(x_shape)
    for kk in range(len(pad) // 2):
        d = nd - 1 - kk
        lo, hi = int(pad[2 * kk]), int(pad[2 * kk + 1])
        n = x_shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            msg = ("Padding size should be less than the corresponding input dimension, but "
                   f"got: padding ({lo}, {hi}) at dimension {d} of input {x_shape}")
            raise RuntimeError(msg)
        if mode == "circular" and (lo > n or hi > n):
            msg = (f"Padding value causes wrapping around more than once (padding ({lo}, {hi}) "
                   f"at dimension {d} of input {x_shape}).")
            raise RuntimeError(msg)
        if n + lo + hi < 0:
            msg = (f"The input size {n}, plus negative padding {lo} and {hi} resulted in a "
                   f"negative output size, which is invalid. Check dimension {d} of your input.")
            raise RuntimeError(msg)
