"""Grid rules: tensors (N, C, D1[, D2[, D3]]) sharded along one or two spatial dims, uneven,
on a 1-D or 2-D domain mesh. One file per op family; :mod:`.halo` moves the boundary rows."""

from meshshard.shardtensor.handlers.grid import (  # noqa: F401
    conv,
    conv_transpose,
    interpolate,
    norm,
    pad,
    pool,
)
from meshshard.shardtensor.handlers.grid.halo import (
    HaloError,
    count_halo_bytes,
    fetch_rows,
    halo_limit,
)

__all__ = ["HaloError", "count_halo_bytes", "fetch_rows", "halo_limit"]
