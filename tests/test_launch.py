"""meshshard.comm.launch: the one reader of torchrun's RANK / WORLD_SIZE / LOCAL_RANK."""

from __future__ import annotations

import pytest

from meshshard.comm.launch import Launch, launch
from meshshard.errors import InputError


def test_alone_is_a_world_of_one():
    job = launch({})
    assert job == Launch(rank=0, world_size=1, local_rank=0, launched=False, rendezvous=False)
    assert job.label() == ""


def test_under_torchrun():
    env = {"RANK": "2", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "MASTER_ADDR": "h",
           "MASTER_PORT": "29500"}  # fmt: skip
    job = launch(env)
    assert (job.rank, job.world_size, job.local_rank) == (2, 8, 0)
    assert job.launched and job.rendezvous and job.label() == " [rank 2/8]"
    assert not launch({"RANK": "0", "WORLD_SIZE": "2"}).rendezvous  # set by hand


@pytest.mark.parametrize(("env", "match"), [
    ({"RANK": "one"}, "RANK='one' must be an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2x"}, "WORLD_SIZE='2x' must be an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, r"RANK=4 must be in \[0, WORLD_SIZE=4\)"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "must be in"),
])  # fmt: skip
def test_bad_values_are_one_clear_input_error(env, match):
    with pytest.raises(InputError, match=match):
        launch(env)
