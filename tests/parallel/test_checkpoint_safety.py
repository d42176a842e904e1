"""Loading a checkpoint never runs code from it: a crafted DCP ``.metadata`` or a crafted
non-tensor item in a ``.distcp`` file is refused with a one-line error naming the file, and the
payload's marker file is never created."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from meshshard.parallel import CheckpointError, load_checkpoint, save_checkpoint
from meshshard.parallel._safe_dcp import read_metadata
from meshshard.testing import run_ranks


class _Payload:
    """Unpickling this creates ``marker`` (stands for any code an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _model_opt(seed: int = 0):
    torch.manual_seed(seed)
    m = nn.Linear(4, 3)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    return m, opt


def _saved(tmp_path: Path) -> Path:
    m, opt = _model_opt()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in one process"
        return save_checkpoint(tmp_path / "ck", m, opt, step=6)


def _load(path: Path):
    m, opt = _model_opt(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_checkpoint(path, m, opt)


def _poison_metadata(path: Path, marker: Path) -> None:
    meta = read_metadata(path / ".metadata")
    meta.planner_data = _Payload(marker)  # any reachable field will do
    (path / ".metadata").write_bytes(pickle.dumps(meta))


def test_clean_checkpoint_still_loads(tmp_path):
    assert _load(_saved(tmp_path))["step"] == 6


def test_crafted_metadata_is_refused_and_never_runs(tmp_path):
    path, marker = _saved(tmp_path), tmp_path / "PWNED"
    _poison_metadata(path, marker)
    with pytest.raises(CheckpointError) as info:
        _load(path)
    text = str(info.value)
    assert str(path / ".metadata") in text and ".open, which is not part of DCP" in text
    assert "\n" not in text
    assert not marker.exists()
    # torch's own reader would have run it: the test's payload is real
    torch.distributed.checkpoint.FileSystemReader(path).read_metadata()
    assert marker.exists()


def test_crafted_bytes_item_is_refused_and_never_runs(tmp_path):
    """A non-tensor item (an optimizer hyper-parameter) rewritten to a pickle with a payload:
    torch's DefaultLoadPlanner would ``torch.load(weights_only=False)`` it."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    path, marker = _saved(tmp_path), tmp_path / "PWNED"
    meta = read_metadata(path / ".metadata")
    fqn = next(k for k, v in meta.state_dict_metadata.items()
               if isinstance(v, BytesStorageMetadata) and k.endswith(".lr"))
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    blob = buf.getvalue()
    (path / "__evil.distcp").write_bytes(blob)
    for index, info in meta.storage_data.items():
        if index.fqn == fqn:
            info.relative_path, info.offset, info.length = "__evil.distcp", 0, len(blob)
            info.transform_descriptors = None
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    assert read_metadata(path / ".metadata")  # the metadata itself is clean
    with pytest.raises(CheckpointError) as err:
        _load(path)
    text = str(err.value)
    assert f"{path}: checkpoint item '{fqn}' refused" in text and "io.open" in text
    assert "\n" not in text
    assert not marker.exists()


def test_garbage_metadata_is_a_clear_error(tmp_path):
    path = _saved(tmp_path)
    (path / ".metadata").write_bytes(b"\x80\x05not a pickle at all")
    with pytest.raises(CheckpointError, match="corrupt checkpoint metadata"):
        _load(path)


def _load_poisoned(rank, world_size, root):
    from pathlib import Path

    from meshshard.parallel import data_parallel, load_checkpoint, save_checkpoint
    from tests.parallel._ckpt_fns import _mesh
    from tests.parallel._fns import model

    mesh = _mesh(1)
    path = Path(root) / "ck"
    save_checkpoint(path, data_parallel(model(), mesh, mode="fsdp"), step=6)
    torch.distributed.barrier()
    if rank == 0:
        _poison_metadata(path, Path(root) / "PWNED")
    torch.distributed.barrier()
    try:
        load_checkpoint(path, data_parallel(model(), mesh, mode="fsdp"))
    except CheckpointError as exc:
        return str(exc)
    return None


def test_crafted_metadata_is_refused_on_every_rank(tmp_path):
    for err in run_ranks(_load_poisoned, 2, tmp_path, timeout=120):
        assert err is not None and "refused to load" in err
    assert not (tmp_path / "PWNED").exists()
