"""Oracle cases for the grid rules, run inside real gloo ranks.

A *layout* shards the first one or two spatial dims of every grid input: ``((2,), ((3, 5),))``
is a 1-D mesh of 2 ranks splitting dim 2 as (3, 5); ``((2, 2), ((3, 5), (1, 6)))`` a 2x2 mesh
splitting dims 2 and 3. Every case builds the same inputs on every rank, runs ``f`` on
ShardTensors and on plain tensors, and compares the output (``full_tensor()``), every input
gradient and any extra returned tensors (e.g. running statistics) with one process.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import torch.nn.functional as F

RTOL, ATOL = 1e-4, 1e-5
CASES: list = []
ATOLS: dict = {}  # case key -> absolute tolerance, where sums are long (float32 rounding)


def case(family, name, nsp, make, f, *, max_split=3, atol=None):
    """``make(sp)`` -> list of (tensor, is_grid); ``sp`` is the size of each spatial dim.
    ``max_split``: the most spatial dims the case may be split along."""
    CASES.append((family, name, nsp, make, f, min(nsp, max_split)))
    if atol is not None:
        ATOLS[f"{family}/{name}"] = atol


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def grid(sp, c=3, b=2, seed=0):
    return torch.randn(b, c, *sp, generator=_g(seed))


def w(*shape, seed=1):
    return torch.randn(*shape, generator=_g(seed)) * 0.3


def _grid_weight_bias(c_in, weight_shape, c_out, bias):
    """``make(sp)``: a grid of ``c_in`` channels, a weight, and a bias of ``c_out`` if ``bias``."""
    def make(sp):
        out = [(grid(sp, c=c_in), True), (w(*weight_shape), False)]
        if bias:
            out.append((w(c_out, seed=2), False))
        return out

    return make


def conv_inputs(c_in, c_out, k, groups=1, bias=True):
    return _grid_weight_bias(c_in, (c_out, c_in // groups, *k), c_out, bias)


# conv ----------------------------------------------------------------------------------------
case("conv", "conv1d_k3_p1", 1, conv_inputs(3, 4, (3,)),
     lambda x, wt, b: F.conv1d(x, wt, b, padding=1))
case("conv", "conv1d_k5_s2_d2_p3", 1, conv_inputs(3, 4, (5,)),
     lambda x, wt, b: F.conv1d(x, wt, b, stride=2, padding=3, dilation=2))
case("conv", "conv2d_k5_same", 2, conv_inputs(3, 4, (5, 5)),
     lambda x, wt, b: F.conv2d(x, wt, b, padding="same"))
case("conv", "conv2d_k4_same_even", 2, conv_inputs(3, 2, (4, 2)),
     lambda x, wt, b: F.conv2d(x, wt, b, padding="same"))
case("conv", "conv2d_k3_s2_p1", 2, conv_inputs(3, 4, (3, 3)),
     lambda x, wt, b: F.conv2d(x, wt, b, stride=2, padding=1))
case("conv", "conv2d_k3_s3_valid_groups", 2, conv_inputs(4, 6, (3, 2), groups=2, bias=False),
     lambda x, wt: F.conv2d(x, wt, None, stride=(3, 1), groups=2))
case("conv", "conv2d_k3_d2_p2_nobias", 2, conv_inputs(3, 2, (3, 3), bias=False),
     lambda x, wt: F.conv2d(x, wt, padding=2, dilation=2))
case("conv", "conv3d_k3_p1", 3, conv_inputs(2, 3, (3, 3, 3)),
     lambda x, wt, b: F.conv3d(x, wt, b, padding=1))
case("conv", "conv3d_k2_s2", 3, conv_inputs(2, 3, (2, 2, 2)),
     lambda x, wt, b: F.conv3d(x, wt, b, stride=2))
case("conv", "patch_embed_tokens", 2, conv_inputs(3, 6, (2, 2)),
     lambda x, wt, b: F.conv2d(x, wt, b, stride=2).flatten(2).transpose(1, 2) * 2, max_split=1)
case("conv", "conv2d_twice_relu", 2, conv_inputs(3, 3, (3, 3)),
     lambda x, wt, b: F.conv2d(F.relu(F.conv2d(x, wt, b, padding=1)), wt, b, padding=1) + x)


def _mod_conv(mode, nd=2, k=3, pad=1, stride=1):
    def f(x):
        torch.manual_seed(3)
        cls = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[nd - 1]
        m = cls(3, 2, k, padding=pad, stride=stride, padding_mode=mode)
        return m(x)

    return f


for _mode in ("zeros", "reflect", "replicate", "circular"):
    case("conv", f"nn_conv2d_{_mode}", 2, lambda sp: [(grid(sp), True)], _mod_conv(_mode))
case("conv", "nn_conv2d_circular_k5_s2", 2, lambda sp: [(grid(sp), True)],
     _mod_conv("circular", k=5, pad=2, stride=2))
case("conv", "nn_conv1d_reflect_k5", 1, lambda sp: [(grid(sp), True)],
     _mod_conv("reflect", nd=1, k=5, pad=2))
case("conv", "nn_conv3d_replicate", 3, lambda sp: [(grid(sp, c=3), True)],
     _mod_conv("replicate", nd=3))


def onednn_inputs():
    """Batch 1, float32, 16 channels, a tall second dim: the *global* conv runs on oneDNN
    (N*C*D1*D2 > 20480) while thin shards' windows fall below torch's line, so the rule's
    oneDNN backward (split into a batch of two halves) is what gets checked."""

    def make(sp):
        return [(torch.randn(1, 16, sp[0], 200, 4, generator=_g(0)), True),
                (w(4, 16, 3, 3, 3), False), (w(4, seed=2), False)]

    return make


# weight gradients sum 6,400 float32 products (values up to ~100): atol 1e-3
case("conv", "conv3d_b1_onednn_k3_p1", 3, onednn_inputs(),
     lambda x, wt, b: F.conv3d(x, wt, b, padding=1), max_split=1, atol=1e-3)
case("conv", "conv3d_b1_onednn_k3_s2_p1", 3, onednn_inputs(),
     lambda x, wt, b: F.conv3d(x, wt, b, stride=2, padding=1), max_split=1, atol=1e-3)


# conv_transpose ------------------------------------------------------------------------------
def ct_inputs(c_in, c_out, k, groups=1, bias=True):
    return _grid_weight_bias(c_in, (c_in, c_out // groups, *k), c_out, bias)


case("conv_transpose", "ct1d_k3_s2_p1_op1", 1, ct_inputs(3, 2, (3,)),
     lambda x, wt, b: F.conv_transpose1d(x, wt, b, stride=2, padding=1, output_padding=1))
case("conv_transpose", "ct2d_k2_s2", 2, ct_inputs(3, 2, (2, 2)),
     lambda x, wt, b: F.conv_transpose2d(x, wt, b, stride=2))
case("conv_transpose", "ct2d_k3_s1_p1", 2, ct_inputs(3, 2, (3, 3)),
     lambda x, wt, b: F.conv_transpose2d(x, wt, b, padding=1))
case("conv_transpose", "ct2d_k4_s3_p2_d2_groups", 2, ct_inputs(4, 4, (4, 3), groups=2),
     lambda x, wt, b: F.conv_transpose2d(x, wt, b, stride=3, padding=2, groups=2, dilation=2,
                                         output_padding=1))
case("conv_transpose", "ct2d_k1_s3_nobias", 2, ct_inputs(3, 2, (1, 1), bias=False),
     lambda x, wt: F.conv_transpose2d(x, wt, stride=3))
case("conv_transpose", "ct3d_k2_s2", 3, ct_inputs(2, 3, (2, 2, 2)),
     lambda x, wt, b: F.conv_transpose3d(x, wt, b, stride=2))
case("conv_transpose", "ct3d_k3_s2_p1", 3, ct_inputs(2, 2, (3, 3, 3)),
     lambda x, wt, b: F.conv_transpose3d(x, wt, b, stride=2, padding=1))


# interpolate ---------------------------------------------------------------------------------
for _ac in (False, True):
    case("interpolate", f"linear_x2_ac{_ac}", 1, lambda sp: [(grid(sp), True)],
         lambda x, ac=_ac: F.interpolate(x, scale_factor=2, mode="linear", align_corners=ac))
    case("interpolate", f"bilinear_size_ac{_ac}", 2, lambda sp: [(grid(sp), True)],
         lambda x, ac=_ac: F.interpolate(x, size=(2 * x.shape[2] + 3, 4), mode="bilinear",
                                         align_corners=ac))
    case("interpolate", f"bilinear_down_ac{_ac}", 2, lambda sp: [(grid(sp), True)],
         lambda x, ac=_ac: F.interpolate(x, size=(x.shape[2] // 2 + 1, 7), mode="bilinear",
                                         align_corners=ac))
    case("interpolate", f"trilinear_sf2.5_ac{_ac}", 3, lambda sp: [(grid(sp, c=2), True)],
         lambda x, ac=_ac: F.interpolate(x, scale_factor=(2.5, 1.5, 2), mode="trilinear",
                                         align_corners=ac))
case("interpolate", "nearest_x2", 2, lambda sp: [(grid(sp), True)],
     lambda x: F.interpolate(x, scale_factor=2))
case("interpolate", "nearest_sf1.7", 2, lambda sp: [(grid(sp), True)],
     lambda x: F.interpolate(x, scale_factor=1.7))
case("interpolate", "nearest_size_down", 3, lambda sp: [(grid(sp, c=2), True)],
     lambda x: F.interpolate(x, size=(3, 4, 9)))
case("interpolate", "bilinear_recompute", 2, lambda sp: [(grid(sp), True)],
     lambda x: F.interpolate(x, scale_factor=1.6, mode="bilinear", recompute_scale_factor=True))


# pool ----------------------------------------------------------------------------------------
def _x(sp):
    return [(grid(sp), True)]


case("pool", "max_pool1d_k3_s2_p1", 1, _x, lambda x: F.max_pool1d(x, 3, 2, 1))
case("pool", "max_pool2d_k2", 2, _x, lambda x: F.max_pool2d(x, 2))
case("pool", "max_pool2d_k3_s2_ceil_dil", 2, _x,
     lambda x: F.max_pool2d(x, 3, stride=2, padding=1, dilation=1, ceil_mode=True))
case("pool", "max_pool2d_k2_d2", 2, _x, lambda x: F.max_pool2d(x, 2, stride=1, dilation=2))
case("pool", "max_pool3d_k2", 3, _x, lambda x: F.max_pool3d(x, 2))
case("pool", "avg_pool1d_k3_s2_p1_ceil", 1, _x,
     lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True))
case("pool", "avg_pool2d_k3_s2_p1_nopad", 2, _x,
     lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False))
case("pool", "avg_pool2d_k2", 2, _x, lambda x: F.avg_pool2d(x, 2))
case("pool", "avg_pool2d_divisor", 2, _x, lambda x: F.avg_pool2d(x, 3, 1, 1, divisor_override=4))
case("pool", "avg_pool3d_k3_s2_p1", 3, _x, lambda x: F.avg_pool3d(x, 3, 2, 1))
case("pool", "adaptive_avg_pool2d", 2, _x,
     lambda x: F.adaptive_avg_pool2d(x, (x.shape[2] // 2 if x.shape[2] % 2 == 0 else x.shape[2],
                                         x.shape[3] if x.shape[3] % 2 else x.shape[3] // 2)))
case("pool", "adaptive_max_pool3d", 3, _x,
     lambda x: F.adaptive_max_pool3d(x, (x.shape[2] // 4 if x.shape[2] % 4 == 0 else x.shape[2],
                                         x.shape[3], 2)))
case("pool", "nn_maxpool_then_conv", 2, lambda sp: [(grid(sp), True), (w(2, 3, 3, 3), False)],
     lambda x, wt: F.conv2d(torch.nn.MaxPool2d(2)(x), wt, padding=1))


# norm ----------------------------------------------------------------------------------------
def _norm_in(sp):
    return [(grid(sp, c=4) * 2 + 1, True), (w(4, seed=3) + 1, False), (w(4, seed=4), False)]


def _bn_train(x, wt, b):
    rm, rv = torch.zeros(4), torch.ones(4)
    y = F.batch_norm(x, rm, rv, wt, b, training=True, momentum=0.3)
    return y, rm, rv


def _bn_module(x, wt, b):
    torch.manual_seed(5)
    m = torch.nn.BatchNorm2d(4, momentum=None)
    y = m(x)
    y = m(y * 2)
    m.eval()
    return m(y) * wt[None, :, None, None] + b[None, :, None, None], m.running_mean, m.running_var


def _in_running(x, wt, b):
    rm, rv = torch.zeros(4), torch.ones(4)
    y = F.instance_norm(x, rm, rv, wt, b, use_input_stats=True, momentum=0.2)
    return y, rm, rv


case("norm", "batch_norm_train_running", 2, _norm_in, _bn_train)
case("norm", "batch_norm3d_train", 3, _norm_in,
     lambda x, wt, b: F.batch_norm(x, None, None, wt, b, training=True))
case("norm", "batch_norm_eval", 2, _norm_in,
     lambda x, wt, b: F.batch_norm(x, torch.ones(4) * 0.5, torch.ones(4) * 2, wt, b))
case("norm", "nn_batchnorm2d_train_then_eval", 2, _norm_in, _bn_module)
case("norm", "instance_norm_running", 2, _norm_in, _in_running)
case("norm", "instance_norm3d_affine", 3, _norm_in,
     lambda x, wt, b: F.instance_norm(x, weight=wt, bias=b))
case("norm", "group_norm", 2, _norm_in, lambda x, wt, b: F.group_norm(x, 2, wt, b))
case("norm", "group_norm3d", 3, _norm_in, lambda x, wt, b: F.group_norm(x, 4, wt, b))
case("norm", "layer_norm_spatial", 2, _norm_in,
     lambda x, wt, b: F.layer_norm(x, x.shape[1:]) * wt[None, :, None, None])
case("norm", "nn_groupnorm_conv", 3, lambda sp: [(grid(sp, c=4), True), (w(4, 4, 3, 3, 3), False)],
     lambda x, wt: F.relu(torch.nn.GroupNorm(2, 4)(F.conv3d(x, wt, padding=1))))


# ------------------------------------------------------------------------------------------
def _split(full, dims, sizes, coord):
    out = full
    for d, s, c in zip(dims, sizes, coord):
        out = out.narrow(d, sum(s[:c]), s[c])
    return out


def _sp(nsp, layout_sizes, other=5):
    sp = [other] * nsp
    for k, s in enumerate(layout_sizes[:nsp]):
        sp[k] = sum(s)
    return sp


def _to_full(v):
    from meshshard.shardtensor import ShardTensor

    return v.full_tensor() if isinstance(v, ShardTensor) else v


def run_grid_cases(rank, world_size, mesh_shape, layout_sizes, families=None):
    """Rank function: run every applicable case; return {case: None | error text | 'n/a'}."""
    from torch.distributed.device_mesh import init_device_mesh

    from meshshard.shardtensor import Shard, from_local

    mesh = init_device_mesh("cpu", tuple(mesh_shape))
    coord = mesh.get_coordinate()
    results = {}
    for family, name, nsp, make, f, max_split in CASES:
        if families and family not in families:
            continue
        key = f"{family}/{name}"
        if len(layout_sizes) > max_split:
            results[key] = "n/a"
            continue
        if os.environ.get("GRID_CASES_DEBUG"):
            print(f"rank {rank}: {key}", file=sys.stderr, flush=True)
        try:
            sp = _sp(nsp, layout_sizes)
            atol = ATOLS.get(key, ATOL)
            inputs = make(sp)
            ref_in = [t.clone().requires_grad_(t.dtype.is_floating_point) for t, _ in inputs]
            ref_all = f(*ref_in)
            ref_all = ref_all if isinstance(ref_all, tuple) else (ref_all,)
            ref = ref_all[0]
            R = torch.randn(ref.shape, generator=_g(7))
            (ref * R).sum().backward()
            dist_in, leaves = [], []
            for (t, is_grid), r in zip(inputs, ref_in):
                if not is_grid:
                    leaf = t.clone().requires_grad_(t.dtype.is_floating_point)
                    dist_in.append(leaf)
                    leaves.append((leaf, False, r))
                    continue
                dims = list(range(2, 2 + len(layout_sizes)))
                leaf = _split(t, dims, layout_sizes, coord).clone().requires_grad_(True)
                placements = [Shard(d) for d in dims]
                dist_in.append(from_local(leaf, mesh, placements, [list(s) for s in
                                                                    layout_sizes]))
                leaves.append((leaf, True, r))
            got_all = f(*dist_in)
            got_all = got_all if isinstance(got_all, tuple) else (got_all,)
            full = _to_full(got_all[0])
            torch.testing.assert_close(full, ref.detach(), rtol=RTOL, atol=atol)
            for k, (g, r) in enumerate(zip(got_all[1:], ref_all[1:])):
                torch.testing.assert_close(_to_full(g), r, rtol=RTOL, atol=atol,
                                           msg=lambda m, k=k: f"extra output {k + 1}: {m}")
            (full * R).sum().backward()
            for k, (leaf, is_grid, r) in enumerate(leaves):
                if not leaf.requires_grad:
                    continue
                want = r.grad
                if is_grid:
                    want = _split(r.grad, list(range(2, 2 + len(layout_sizes))), layout_sizes,
                                  coord)
                got = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                if want is None:
                    want = torch.zeros_like(got)
                torch.testing.assert_close(got, want, rtol=RTOL, atol=atol,
                                           msg=lambda m, k=k: f"grad of input {k}: {m}")
            results[key] = None
        except Exception:
            results[key] = traceback.format_exc()
    return results
