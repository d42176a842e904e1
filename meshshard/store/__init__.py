"""The sharded store: format (``run_<i>.zarr``), seal, verify, and atomic publish.

- :mod:`~meshshard.store.format`: write, open, read and inspect stores (rows in partition
  order, schema version);
- :mod:`~meshshard.store.integrity`: seal a finished store (crc32 per chunk file), the checks
  every open makes, and :func:`verify_store`;
- :mod:`~meshshard.store.atomic`: the one "temporary name, then rename" helper, used by
  stores and checkpoints alike.

Depends on :mod:`meshshard.partition` (the record stored with the rows) and on zarr (imported
inside the functions that need it).
"""

from __future__ import annotations

from meshshard.store.atomic import publish
from meshshard.store.format import StoreError, inspect_store, open_store, verify_store

__all__ = ["StoreError", "inspect_store", "open_store", "publish", "verify_store"]
