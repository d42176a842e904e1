"""Same-layout unary ops (clone, detach, .to, *_like, dropout), autograd entry points, and
conversions to Python values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor import Partial, Replicate

from meshshard.shardtensor._generic import pointwise_apply
from meshshard.shardtensor._layout import reduce_partials, wrap
from meshshard.shardtensor.api import ShardTensor
from meshshard.shardtensor.registry import register_handler


def _same_layout(fn):
    def handler(x, *args, **kwargs):
        out = fn(x._local, *args, **kwargs)
        if out is x._local:
            return x
        return wrap(out, x._spec)

    return handler


# layout-preserving and linear (Partial may pass through)
_LINEAR = [
    torch.Tensor.clone,
    torch.clone,
    torch.Tensor.detach,
    torch.detach,
    torch.Tensor.contiguous,
    torch.Tensor.to,
    torch.Tensor.float,
    torch.Tensor.double,
    torch.Tensor.half,
    torch.Tensor.bfloat16,
    torch.Tensor.cpu,
    torch.Tensor.cuda,
    torch.Tensor.type,
    torch.Tensor.requires_grad_,
    torch.Tensor.detach_,
]
for _f in _LINEAR:
    register_handler(_f)(_same_layout(lambda t, *a, _f=_f, **k: _f(t, *a, **k)))


@register_handler(torch.Tensor.type_as)
def _type_as(x, other):
    return wrap(x._local.to(other.dtype), x._spec)


def _fresh_layout(fn):
    """*_like factories: same layout, but Partial becomes Replicate (fresh values)."""

    def handler(x, *args, **kwargs):
        spec = x._spec
        if spec.has_partial():
            spec = spec.with_changes(
                placements=tuple(
                    Replicate() if isinstance(p, Partial) else p for p in spec.placements
                )
            )
        return wrap(fn(x._local, *args, **kwargs), spec)

    return handler


for _f in (
    torch.zeros_like,
    torch.ones_like,
    torch.empty_like,
    torch.full_like,
    torch.rand_like,
    torch.randn_like,
):
    register_handler(_f)(_fresh_layout(_f))


@register_handler(F.dropout, torch.dropout)
def _dropout(x, p=0.5, training=True, inplace=False):
    """Dropout is local (each rank draws its own mask); Partial inputs are reduced first."""
    x = reduce_partials(x)
    out = F.dropout(x._local, p=p, training=training, inplace=inplace)
    return x if out is x._local else wrap(out, x._spec)


@register_handler(torch.Tensor.backward)
def _backward(x, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """``loss.backward()`` runs autograd on the local pieces. For a Replicate or Partial scalar
    every rank starts from gradient 1 (the convention of meshshard.shardtensor.collectives)."""
    if gradient is None:
        if x._local.numel() != 1:
            msg = "grad can be implicitly created only for scalar outputs; pass gradient="
            raise RuntimeError(msg)
        g = torch.ones_like(x._local)
    elif isinstance(gradient, ShardTensor):
        g = gradient._local
    else:
        g = gradient
    if inputs is not None:
        inputs = [i._local if isinstance(i, ShardTensor) else i for i in inputs]
    torch.autograd.backward(
        x._local, g, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs
    )


def _value_local(x):
    x = reduce_partials(x)
    if not x._spec.is_replicated():
        msg = (
            "this ShardTensor is sharded: its values differ per rank; call .full_tensor() "
            "(collective) before converting it to Python values"
        )
        raise ValueError(msg)
    return x._local


@register_handler(torch.Tensor.item)
def _item(x):
    return _value_local(x).item()


@register_handler(torch.Tensor.tolist)
def _tolist(x):
    return _value_local(x).tolist()


@register_handler(torch.Tensor.numpy)
def _numpy(x, *a, **k):
    return _value_local(x).numpy(*a, **k)


@register_handler(torch.Tensor.__float__)
def _float(x):
    return float(_value_local(x))


@register_handler(torch.Tensor.__int__)
def _int(x):
    return int(_value_local(x))


@register_handler(torch.Tensor.__bool__)
def _bool(x):
    return bool(_value_local(x))


@register_handler(torch.Tensor.__format__)
def _format(x, spec):
    """Formats a scalar's value (a Partial scalar is reduced: collective); else the repr."""
    x = reduce_partials(x)
    if x._local.numel() == 1 and x._spec.is_replicated():
        return x._local.item().__format__(spec)
    return repr(x)



def _masked_fill_rule(fn):
    """Elementwise with broadcasting (aten does not tag it pointwise): e.g. the additive masks
    ``F._canonical_mask`` builds inside ``nn.MultiheadAttention``."""

    def handler(x, mask, value):
        return pointwise_apply(fn, (x, mask, value), {})

    return handler


for _f in (torch.Tensor.masked_fill, torch.Tensor.masked_fill_, torch.masked_fill):
    register_handler(_f)(_masked_fill_rule(_f))
