"""`meshshard train`: the work (options: :mod:`meshshard.commands.train`)."""

from __future__ import annotations

import argparse

import torch.distributed as dist

from meshshard.apps.train_runs import train_main
from meshshard.comm.launch import launch
from meshshard.comm.process import shutdown
from meshshard.commands.train import check_args


def run(args: argparse.Namespace) -> int:
    check_args(args)
    owned = not dist.is_initialized()
    try:
        code = train_main(args)
    except BaseException:
        if owned and dist.is_initialized() and dist.get_world_size() == 1:
            dist.destroy_process_group()  # a world of one made here: nothing waits on it
        raise
    if owned and launch().launched:  # under torchrun: skip the teardown where gloo may abort
        shutdown(exit_code=code)
    return code
