"""The domain-parallel ops behind :class:`meshshard.models.DoMINO` (its ``ops=`` hook).

The model is plain torch and calls six ops (``grid_nodes``, ``ball_query``, ``knn``, ``gather``,
``halo``, ``sample``; ``ball_query_sets`` when the ops have it: the ball queries of the grid
nodes and of the sampled points, every radius, from one kNN and one gather);
:class:`ShardedDominoOps` answers them on this rank's rows with meshshard's exact distributed
kernels: the STL points and the sampled points are sharded (uneven, empty shards allowed), the
latent grid is either replicated, cut in slabs along ``D`` on a 1-D mesh, or cut in blocks along
``D`` (mesh dim 0) and ``H`` (mesh dim 1) on a 2-D mesh (uneven, one-row and empty slabs
allowed; halos reach across several ranks when a slab is thinner than the conv). On a 2-D mesh
the points are cut over all its ranks (rank order).

Gradients. With ShardTensor inputs (:meth:`ShardedDominoOps.run`) the loss is global (a
ShardTensor reduction) and the parameters' gradients after a plain ``loss.backward()`` are one
process's: the forward runs on aliases of the parameters whose backward sums their gradients
over the ranks in one flattened all-reduce. With this rank's local tensors, each rank's loss is
its share of the global loss (its rows' sum divided by the global count); after ``backward``
sum every parameter's gradient over the ranks with :func:`allreduce_grads`.

Every method is collective over the group (forward and backward).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as tF
from torch.autograd.function import once_differentiable

from meshshard.comm.rows import all_gather_rows
from meshshard.ops import functional as Fn
from meshshard.ops import halo as H
from meshshard.ops._domino_parts import _halo_rows, _split_radii
from meshshard.ops._gathered import gather_all, gathered_knn, gathered_rows
from meshshard.ops.api import _is_st, _layout, _one_class, _wrap
from meshshard.ops.gridpoint import GridLayout
from meshshard.ops.gridsample import grid_sample
from meshshard.shardtensor import Replicate, Shard, from_local
from meshshard.shardtensor._aten.layout_args import comm_device

__all__ = ["ShardedDominoOps", "allreduce_grads"]

_ROLES = ("stl_points", "sdf_grid", "points", "point_features")  # DoMINO.forward's inputs


class ShardedDominoOps:
    """DoMINO's ops on shards.

    Parameters
    ----------
    mesh : DeviceMesh
        The ranks sharing one sample: 1-D, or 2-D (spanning the whole default group) for a grid
        cut along two axes.
    grid_sizes : optional
        1-D mesh: rows of the latent grid's ``D`` per rank (sum ``D``; zeros allowed), or
        ``None``: every rank holds the whole grid (replicated; no grid communication, redundant
        grid compute). 2-D mesh: ``(d_sizes, h_sizes)``, the rows of ``D`` per coordinate of
        mesh dim 0 and of ``H`` per coordinate of mesh dim 1; rank ``(a, b)`` holds rows
        ``d_sizes[a]`` x ``h_sizes[b]`` x all of ``W``.
    backend : str
        Local neighbour kernel (see :mod:`meshshard.ops.kernels`).
    validate : bool
        Check in every forward that the grid covers the sampled points (one all-gather and
        one host sync). Default on; a training loop whose loader checked its samples once
        (``apps.domino_train.domino_sample`` does) turns it off for a step with fewer syncs.
    search : {"forward", "gathered"}
        How ``ball_query_sets``, ``knn``, ``gather`` and ``sample`` cross ranks.
        ``"forward"`` (default): queries go only to the ranks that may answer them, rows are
        fetched only where referenced; least traffic, but the exchanges' sizes come from the
        data (read back: host syncs). ``"gathered"``: the points, features and grid are
        all-gathered (sizes from the ShardTensor inputs' layouts, padded to the largest
        shard) and searched here: the same answers with static shapes, no read-back with
        ``backend="brute"`` (a step runs on the meta device), at ``O(N)`` memory and traffic
        per rank for ``N`` points. Local-tensor inputs add one count all-gather (host sync).
    """

    def __init__(self, mesh, grid_sizes=None, *, backend: str = "auto", validate: bool = True,
                 search: str = "forward"):
        if search not in ("forward", "gathered"):
            msg = f"ShardedDominoOps: search={search!r} must be 'forward' or 'gathered'"
            raise ValueError(msg)
        self.search = search
        self._searched: tuple | None = None  # (local rows, every rank's rows) last searched
        self.mesh = mesh
        self.backend = backend
        self.validate = bool(validate)
        self._ranks = tuple(mesh.mesh.reshape(-1).tolist())
        self._known: dict[int, tuple] = {}  # id(local piece) -> (piece, every rank's rows)
        if mesh.ndim == 1:
            self.group = mesh.get_group(0)
            self.grid_sizes = None if grid_sizes is None else tuple(int(s) for s in grid_sizes)
            cuts = [] if grid_sizes is None else [self.grid_sizes]
        elif mesh.ndim == 2:
            if mesh.size() != dist.get_world_size():
                msg = (f"ShardedDominoOps: a 2-D mesh must span the default group "
                       f"({mesh.size()} of {dist.get_world_size()} ranks)")
                raise ValueError(msg)
            if grid_sizes is None or len(grid_sizes) != 2:
                msg = ("ShardedDominoOps: on a 2-D mesh grid_sizes must be (d_sizes, h_sizes), "
                       f"got {grid_sizes!r}")
                raise ValueError(msg)
            self.group = None  # the points are cut over every rank
            self.grid_sizes = tuple(tuple(int(s) for s in g) for g in grid_sizes)
            cuts = list(self.grid_sizes)
        else:
            msg = f"ShardedDominoOps: the mesh must be 1-D or 2-D, got {mesh.ndim}-D"
            raise ValueError(msg)
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        for dim, sizes in enumerate(cuts):
            if len(sizes) != mesh.size(dim) or any(s < 0 for s in sizes):
                msg = (f"ShardedDominoOps: grid sizes {list(sizes)} for mesh dim {dim} must be "
                       f"{mesh.size(dim)} counts >= 0")
                raise ValueError(msg)
        self.coord = mesh.get_coordinate()
        self.grads_summed = False  # the last forward summed the parameters' gradients itself

    def run(self, module, stl_points, sdf_grid, points, point_features=None):
        """Run ``module`` (a DoMINO using these ops) on ShardTensor inputs; ``NotImplemented``
        for local tensors (the model then runs its own forward on them).

        Takes each input's local piece (:meth:`enter`), runs the model's forward on aliases of
        its parameters (:func:`torch.func.functional_call`) and wraps the output like
        ``points`` (:meth:`leave`). The aliases' backward sums the parameters' gradients over
        the ranks in one flattened all-reduce (one per dtype), so a plain ``loss.backward()`` of
        a global loss gives one process's gradients, for every backward (``retain_graph``,
        accumulation over several forwards, ``torch.autograd.grad``). Collective.

        Raises
        ------
        TypeError
            Some inputs are ShardTensors and others are not.
        ValueError
            An input's mesh or layout is not the ops' (see :meth:`enter`).
        """
        inputs = (stl_points, sdf_grid, points, point_features)
        given = [(n, x) for n, x in zip(_ROLES, inputs) if x is not None]
        if not any(_is_st(x) for _, x in given):
            self.grads_summed = False
            return NotImplemented
        plain = [n for n, x in given if not _is_st(x)]
        if plain:
            msg = (f"DoMINO: {', '.join(plain)} "
                   f"{'is a local tensor' if len(plain) == 1 else 'are local tensors'} but the "
                   "other inputs are ShardTensors; pass all inputs as ShardTensors or all as "
                   "this rank's local tensors")
            raise TypeError(msg)
        _one_class("DoMINO", *(x for _, x in given))
        from torch.func import functional_call

        # the aliases first: autograd runs the node with the lowest sequence number last among
        # those ready, so the all-reduce comes after every other node of this forward's
        # backward, in the same place on every rank
        names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = [module.get_parameter(n) for n in names]
        aliases = _SumGrads.apply(self.group, *params) if params else ()
        if isinstance(aliases, torch.Tensor):
            aliases = (aliases,)
        local = tuple(None if x is None else self.enter(x, n, grid=n == "sdf_grid")
                      for n, x in zip(_ROLES, inputs))
        # every rank's rows of the point inputs are known from their layouts: the forward
        # needs no count exchange for them
        for name, x, piece in zip(_ROLES, inputs, local):
            if x is not None and name != "sdf_grid":
                self._known[id(piece)] = (piece, tuple(int(v) for v in x.sharding_sizes(0)))
        try:
            out = functional_call(module, dict(zip(names, aliases)), local)
        finally:
            self._known.clear()
            self._searched = None
        self.grads_summed = True  # after the inner forward (local inputs) reset it
        return self.leave(out, points)

    def _sizes(self, piece) -> tuple | None:
        """Every rank's rows of ``piece`` when a ShardTensor input's layout gave them."""
        hit = self._known.get(id(piece))
        return hit[1] if hit is not None and hit[0] is piece else None

    def _same_mesh(self, got) -> bool:
        return got is self.mesh or tuple(got.mesh.reshape(-1).tolist()) == self._ranks

    def enter(self, x, name: str, grid: bool = False):
        """This rank's piece of a model input: ``x`` itself, or a ShardTensor's local piece
        after checking its layout. Points (``stl_points``, ``points``, ``point_features``):
        ``[Shard(0)]`` on the ops' mesh (1-D), or on a 1-D mesh of all ranks in rank order
        when the ops' mesh is 2-D (a tensor dim cut over two mesh dims is not a ShardTensor
        layout). The grid: ``[Shard(0)]`` in the ops' slabs (1-D mesh), ``[Shard(0),
        Shard(1)]`` in its blocks (2-D mesh), or all ``Replicate`` when it is replicated."""
        if not _is_st(x):
            return x
        if grid:
            return self._enter_grid(x, name)
        got = x.device_mesh
        if self.mesh.ndim == 1:
            if not self._same_mesh(got):
                msg = f"DoMINO: {name} lives on mesh {got}, the ops on {self.mesh}"
                raise ValueError(msg)
        else:
            ranks = list(range(dist.get_world_size()))
            if got.ndim != 1 or tuple(got.mesh.tolist()) != tuple(ranks):
                msg = (f"DoMINO: {name} lives on mesh {got}; on the ops' 2-D mesh the points "
                       f"are cut over all ranks: put them on a 1-D mesh of ranks {ranks} "
                       f"(e.g. init_device_mesh({self.mesh.device_type!r}, ({len(ranks)},)))")
                raise ValueError(msg)
        return _layout(x, name, "DoMINO")[0]

    def _enter_grid(self, x, name: str) -> torch.Tensor:
        if not self._same_mesh(x.device_mesh):
            msg = f"DoMINO: {name} lives on mesh {x.device_mesh}, the ops on {self.mesh}"
            raise ValueError(msg)
        pl = tuple(x.placements)
        if self.grid_sizes is None:
            if not all(isinstance(p, Replicate) for p in pl):
                msg = f"DoMINO: the grid is replicated here, but {name} has placements {pl}"
                raise ValueError(msg)
            return x.to_local()
        want = (Shard(0),) if self.mesh.ndim == 1 else (Shard(0), Shard(1))
        if pl != want:
            msg = (f"DoMINO: {name} has placements {pl}; the ops cut the grid "
                   f"{list(want)} (D{', H' if len(want) == 2 else ''} over the mesh dims)")
            raise ValueError(msg)
        sizes = [list(x.sharding_sizes(i)) for i in range(len(want))]
        if self.mesh.ndim == 1 and tuple(sizes[0]) != self.grid_sizes:
            msg = (f"DoMINO: {name} is cut {sizes[0]} along D, the ops' grid_sizes are "
                   f"{list(self.grid_sizes)}")
            raise ValueError(msg)
        if self.mesh.ndim == 2 and tuple(map(tuple, sizes)) != self.grid_sizes:
            msg = (f"DoMINO: {name} is cut {sizes[0]} along D and {sizes[1]} along H, the "
                   f"ops' grid_sizes are {[list(g) for g in self.grid_sizes]}")
            raise ValueError(msg)
        return x.to_local()

    def leave(self, out: torch.Tensor, like):
        """The output rows, as a ShardTensor laid out like ``like`` (the points) when that is
        one."""
        if not _is_st(like):
            return out
        _, mesh, pl, _, sizes, _ = _layout(like, "points", "DoMINO")
        return _wrap(out, mesh, pl, sizes)

    def _block(self, shape) -> list[tuple[int, int]]:
        """``(first row, rows)`` of this rank's block along D, H and W."""
        out = [(0, int(n)) for n in shape]
        cuts = [] if self.grid_sizes is None else (
            [self.grid_sizes] if self.mesh.ndim == 1 else list(self.grid_sizes))
        for axis, sizes in enumerate(cuts):
            if sum(sizes) != shape[axis]:
                msg = (f"ShardedDominoOps: grid sizes {list(sizes)} do not sum to the grid's "
                       f"{'DHW'[axis]}={shape[axis]}")
                raise ValueError(msg)
            c = self.coord[axis]
            out[axis] = (sum(sizes[:c]), sizes[c])
        return out

    def layout(self, shape, origin, spacing) -> GridLayout:
        """The :class:`GridLayout` of this ops' grid cut (for ``grid_sdf``, ``grid_radius``):
        slabs along ``D`` over the mesh, or on a 2-D mesh blocks along ``D`` and ``H`` over
        all ranks (the mesh must hold the ranks in row-major order, as ``init_device_mesh``
        makes it)."""
        if self.mesh.ndim == 1:
            return GridLayout(shape, origin, spacing, sizes=self.grid_sizes, axis=0)
        if self.mesh.mesh.reshape(-1).tolist() != list(range(self.world)):
            msg = (f"ShardedDominoOps.layout: the 2-D mesh holds ranks {self.mesh.mesh.tolist()}"
                   "; a GridLayout numbers blocks in rank order (row-major)")
            raise ValueError(msg)
        return GridLayout(shape, origin, spacing, sizes=self.grid_sizes, axis=(0, 1))

    def grid_nodes(self, shape, origin, spacing, dtype, device=None) -> torch.Tensor:
        """This rank's nodes (C order of its block) as (n, 3) coordinates on ``device``
        (default: the mesh's)."""
        device = comm_device(self.mesh) if device is None else device
        axes = [torch.arange(r0, r0 + n, device=device) for r0, n in self._block(shape)]
        idx = torch.stack([m.reshape(-1) for m in torch.meshgrid(*axes, indexing="ij")], 1)
        return GridLayout(shape, origin, spacing).coords(idx, dtype)

    def ball_query(self, points, queries, r: float, k: int) -> torch.Tensor:
        """The nearest ``<= k`` points within ``r``: the ``k`` nearest, those beyond ``r``
        dropped. Equal to a capped radius query (ties by index alike), but the pruned kNN
        never enumerates every point in the ball (DoMINO's balls hold thousands)."""
        return self.ball_queries(points, queries, [r], [k])[1][0]

    def _global_rows(self, points) -> int:
        """Rows of ``points`` over the group: from the ShardTensor input's layout, else one
        all-reduce and one host sync (the kNN's cap is a shape). Collective."""
        known = self._sizes(points)
        if known is not None:
            return sum(known)
        n = torch.tensor([points.shape[0]], dtype=torch.int64, device=points.device)
        dist.all_reduce(n, group=self.group)
        return int(n)

    def ball_queries(self, points, queries, radii, ks):
        """:meth:`ball_query` for several ``(r, k)`` pairs over the same points and queries,
        from one kNN with the largest ``k`` (the nearest ``<= k_i`` within ``r_i`` are the
        first ``k_i`` of the nearest ``max k``, those beyond ``r_i`` dropped): one neighbour
        search and one count instead of one each per radius.

        Returns ``(union, [index_i])``: ``union`` (m, max k) holds the nearest ``max k``
        within the largest radius (-1 pad), and every ``index_i`` (m, k_i) is its first
        ``k_i`` columns with the points beyond ``r_i`` dropped, so one gather by ``union``
        serves every radius. Collective.
        """
        return self.ball_query_sets(points, [(queries, radii, ks)])[0]

    def ball_query_sets(self, points, sets):
        """:meth:`ball_queries` for several query sets ``(queries, radii, ks)`` over the same
        points (DoMINO's grid nodes and sampled points against the STL points), from one kNN
        of all the queries with the largest ``k`` of any set: one search and one count for
        the whole forward. Returns ``[(union, [index_i])]`` per set. Collective."""
        for _, radii, _ in sets:
            for r in radii:
                if not r > 0:
                    msg = f"ball_query: r={r} must be > 0"
                    raise ValueError(msg)
        kmax = max(int(k) for _, _, ks in sets for k in ks)
        if self.search == "gathered":
            sizes = self._rows(points)
            kk = min(kmax, sum(sizes))
        else:
            kk = min(kmax, self._global_rows(points))
        if kk:
            queries = torch.cat([q.detach() for q, _, _ in sets])
            if self.search == "gathered":
                d, idx = gathered_knn(points, kk, queries, sizes, self.group, self.backend)
            else:
                d, idx = Fn.knn(points.detach(), kk, queries, group=self.group,
                                backend=self.backend)
        out, at = [], 0
        for q, radii, ks in sets:
            ks = [int(k) for k in ks]
            m = q.shape[0]
            if kk == 0:
                none = torch.full((m, max(ks)), -1, dtype=torch.int64, device=q.device)
                out.append((none, [none[:, :k] for k in ks]))
                continue
            out.append(_split_radii(d[at : at + m, : max(ks)], idx[at : at + m, : max(ks)],
                                    radii, ks))
            at += m
        return out

    def knn(self, points, k: int) -> torch.Tensor:
        if self.search == "gathered":
            sizes = self._rows(points)
            return gathered_knn(points, k, points, sizes, self.group, self.backend)[1]
        _, idx = Fn.knn(points.detach(), k, group=self.group, backend=self.backend)
        return idx

    def gather(self, features, index) -> torch.Tensor:
        """Rows of the distributed ``features`` at global ``index`` (-1: zeros). With
        ``search="gathered"`` the features are rows of a point set the layouts gave (an input,
        or the last searched set: DoMINO gathers by the indices of its last search)."""
        if self.search == "gathered":
            return gather_all(features, index, self._rows(features, searched=True), self.group)
        return H.gather_neighbors(features, index, group=self.group)

    def _rows(self, x, searched: bool = False) -> tuple:
        """Every rank's rows of ``x``: from a ShardTensor input's layout, from the last
        searched set (``searched``, same local rows), else one all-gather and one host
        sync. Collective."""
        sizes = self._sizes(x)
        last = self._searched
        if sizes is None and searched and last is not None and last[0] == x.shape[0]:
            sizes = last[1]
        if sizes is None:
            n = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
            sizes = tuple(all_gather_rows(n, self.group).reshape(-1).tolist())  # host sync
        self._searched = (x.shape[0], sizes)
        return sizes

    def halo(self, grid, width: int) -> torch.Tensor:
        """Pad (C, D, H, W) by ``width`` on every side: the neighbours' rows across a cut
        (several ranks deep when their blocks are thin), zeros at the domain's boundary."""
        if self.grid_sizes is None:
            return tF.pad(grid, (width,) * 6)
        if self.mesh.ndim == 1:
            out = _halo_rows(grid, 1, width, self.grid_sizes, self.coord[0], self.mesh, 0)
            return tF.pad(out, (width, width, width, width))
        out = _halo_rows(grid, 1, width, self.grid_sizes[0], self.coord[0], self.mesh, 0)
        out = _halo_rows(out, 2, width, self.grid_sizes[1], self.coord[1], self.mesh, 1)
        return tF.pad(out, (width, width))

    def sample(self, grid, points, origin, spacing, shape) -> torch.Tensor:
        """Trilinear values of the sharded grid at this rank's points (border padding).
        Raises ``ValueError`` on every rank when any rank's point lies outside the grid."""
        lay = GridLayout(shape, origin, spacing)
        if self.validate:
            lay.check_covers(points, self.group, what="sampled points")
        c = lay.normalize(points, align_corners=True)
        if self.grid_sizes is None:  # whole grid here: purely local (partial gradients)
            return grid_sample(grid[None], c[None], align_corners=True,
                               padding_mode="border")[0]
        if self.mesh.ndim == 2:
            return self._sample_blocks(grid, c, shape)
        if self.search == "gathered":  # the whole grid here (static shapes), sampled locally
            whole = gathered_rows(grid.transpose(0, 1), self.grid_sizes, self.group)
            return grid_sample(whole.transpose(0, 1)[None], c[None], align_corners=True,
                               padding_mode="border")[0]
        G = from_local(grid[None], self.mesh, [Shard(2)], [list(self.grid_sizes)],
                       validate=False)
        sizes = self._sizes(points)  # known from the input layout, else one all-gather
        Cc = from_local(c[None], self.mesh, [Shard(1)], None if sizes is None else [list(sizes)],
                        validate=sizes is None)
        out = grid_sample(G, Cc, align_corners=True, padding_mode="border")
        return out.to_local()[0]

    def _sample_blocks(self, grid, c, shape) -> torch.Tensor:
        """Trilinear sampling (``align_corners=True``, border) of a grid cut in 2-D blocks:
        each point fetches its cell's 8 corner nodes from their owners (one gather)."""
        ds, hs = self.grid_sizes
        W = int(shape[2])
        dev = c.device
        size = torch.tensor([W, shape[1], shape[0]], dtype=c.dtype, device=dev)
        u = ((c + 1) / 2 * (size - 1)).clamp(min=0)
        u = torch.minimum(u, size - 1)  # (x, y, z) = (w, h, d) node coordinates
        i0 = torch.minimum(u.detach().floor(), (size - 2).clamp(min=0)).long()
        frac = u - i0.to(u.dtype)
        i1 = torch.minimum(i0 + 1, (size - 1).long())
        ds_t = torch.tensor(ds, device=dev)
        hs_t = torch.tensor(hs, device=dev)
        dcut = ds_t.cumsum(0)
        hcut = hs_t.cumsum(0)
        ranks = self.mesh.mesh.to(dev)  # (len(ds), len(hs)) global ranks
        counts_host = torch.zeros(self.world, dtype=torch.int64)
        counts_host[self.mesh.mesh.reshape(-1)] = (torch.tensor(ds)[:, None]
                                                   * torch.tensor(hs)[None] * W).reshape(-1)
        counts = counts_host.to(dev)
        offset = counts.cumsum(0) - counts
        rows, wts = [], []
        for corner in range(8):
            pick = [(corner >> bit) & 1 for bit in range(3)]  # x, y, z
            idx = [i1[:, a] if pick[a] else i0[:, a] for a in range(3)]
            wgt = 1
            for a in range(3):
                wgt = wgt * (frac[:, a] if pick[a] else 1 - frac[:, a])
            w_, h_, d_ = (i.contiguous() for i in idx)
            a_ = torch.bucketize(d_, dcut, right=True)
            b_ = torch.bucketize(h_, hcut, right=True)
            local = ((d_ - (dcut - ds_t)[a_]) * hs_t[b_]
                     + (h_ - (hcut - hs_t)[b_])) * W + w_
            rows.append(offset[ranks[a_, b_]] + local)
            wts.append(wgt)
        C = grid.shape[0]
        flat = grid.permute(1, 2, 3, 0).reshape(-1, C)
        if self.search == "gathered":
            vals = gather_all(flat, torch.stack(rows, 1), counts_host.tolist(), self.group)
        else:
            vals = H.gather_neighbors(flat, torch.stack(rows, 1), group=self.group,
                                      sizes=counts_host.tolist())  # (m, 8, C)
        return (vals * torch.stack(wts, 1)[..., None]).sum(1)

    def reduce_mean_count(self, n: int) -> int:
        """The global number of rows (one all-reduce and one host sync). Collective."""
        t = torch.tensor([n], dtype=torch.int64, device=comm_device(self.mesh))
        dist.all_reduce(t, group=self.group)
        return int(t)


class _SumGrads(torch.autograd.Function):
    """Aliases of the parameters (views, no copy); backward: their gradients summed over
    ``group`` in one flattened all-reduce per dtype (one for a single-dtype model). A gradient
    that did not reach an alias counts as zero (autograd materializes it), so every rank joins
    the all-reduce. Collective in backward."""

    @staticmethod
    def forward(ctx, group, *params):
        ctx.group = group
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        out = list(grads)
        kinds: dict = {}  # insertion order = parameter order: the same on every rank
        for i, g in enumerate(grads):
            kinds.setdefault((g.dtype, g.device), []).append(i)
        for idx in kinds.values():
            flat = torch.cat([grads[i].reshape(-1) for i in idx])
            dist.all_reduce(flat, group=ctx.group)
            for i, piece in zip(idx, flat.split([grads[i].numel() for i in idx])):
                out[i] = piece.view(grads[i].shape)
        return (None, *out)


def allreduce_grads(module: torch.nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Sum every parameter's gradient over ``group`` (missing gradients count as zero): the
    local-tensor form's step after ``backward``. Not after a forward on ShardTensor inputs,
    whose gradients are summed already (that raises ``ValueError``).

    Collective: every rank of ``group`` must call this with the same module structure.
    """
    for m in module.modules():
        ops = getattr(m, "ops", None)
        if isinstance(ops, ShardedDominoOps) and ops.grads_summed:
            msg = ("allreduce_grads: the last forward took ShardTensor inputs, so the "
                   "parameters' gradients are summed over the ranks already; drop this call")
            raise ValueError(msg)
    for p in module.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)
