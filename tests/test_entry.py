"""``hvdtrack.entry``: process settings a command supplies, which a user's own values override,
and TensorFlow's CPU allocator chosen by the model a process trains."""

import pytest

from hvdtrack.entry import ALLOCATOR, SUPPLIED, allocator_in_use, choose_allocator, start
from hvdtrack.model.config import ModelConfig


def test_a_command_supplies_what_the_user_did_not_set_and_says_so():
    environ = {"A": "user"}
    start({"A": "1", "B": "2"}, environ)
    assert environ == {"A": "user", "B": "2", SUPPLIED: "B"}


def test_a_child_command_may_choose_again_what_its_parent_supplied():
    environ = {"A": "user", "B": "2", SUPPLIED: "B"}  # as a parent command left it
    start({"A": "3", "B": "3", "C": "3"}, environ)
    assert environ == {"A": "user", "B": "3", "C": "3", SUPPLIED: "B,C"}


@pytest.mark.parametrize(
    "environ, memory_first, chosen",
    [
        ({}, False, "true"),  # the plain step, or recompute with the kept edge term: caching
        ({}, True, "false"),  # recompute, memory first: the system allocator
        ({ALLOCATOR: "true", SUPPLIED: ALLOCATOR}, True, "false"),  # training's default, replaced
        ({ALLOCATOR: "true"}, True, "true"),  # the user's choice stays
        ({ALLOCATOR: "false"}, False, "false"),
    ],
)
def test_the_allocator_follows_the_model_unless_the_user_chose(environ, memory_first, chosen):
    choose_allocator(memory_first, environ)
    assert environ[ALLOCATOR] == chosen


@pytest.mark.parametrize(
    "model, memory_first",
    [
        ({}, False),
        ({"recompute": True}, True),
        ({"recompute": True, "factorized_edge_update": True}, True),
        ({"recompute": True, "factorized_edge_update": True, "keep_edge_term": True}, False),
    ],
)
def test_a_model_is_memory_first_when_it_recomputes_without_keeping_the_edge_term(
    model, memory_first
):
    assert ModelConfig(**model).memory_first is memory_first


@pytest.mark.parametrize(
    "value, name",
    [(None, "system"), ("true", "caching"), ("TRUE", "caching"), ("1", "caching"),
     (" true", "system"), ("false", "system"), ("0", "system")],
)  # fmt: skip
def test_the_allocator_in_use_is_read_as_tensorflow_reads_it(value, name):
    assert allocator_in_use({} if value is None else {ALLOCATOR: value}) == name
