"""Sharding rules, one file per op family. Importing this package registers them."""

from meshshard.shardtensor.handlers import (  # noqa: F401
    attention,
    basic,
    cat,
    grid,
    indexing,
    linalg,
    mha,
    nn,
    reductions,
    shape,
)
