"""``hvdtrack.entry``: process settings a command supplies, which a user's own values override,
and TensorFlow's CPU allocator chosen by the model a process trains."""

import pytest

from hvdtrack.entry import ALLOCATOR, SUPPLIED, choose_allocator, start


def test_a_command_supplies_what_the_user_did_not_set_and_says_so():
    environ = {"A": "user"}
    start({"A": "1", "B": "2"}, environ)
    assert environ == {"A": "user", "B": "2", SUPPLIED: "B"}


def test_a_child_command_may_choose_again_what_its_parent_supplied():
    environ = {"A": "user", "B": "2", SUPPLIED: "B"}  # as a parent command left it
    start({"A": "3", "B": "3", "C": "3"}, environ)
    assert environ == {"A": "user", "B": "3", "C": "3", SUPPLIED: "B,C"}


@pytest.mark.parametrize(
    "environ, recompute, chosen",
    [
        ({}, False, "true"),  # the plain step: the caching allocator
        ({}, True, "false"),  # recompute: the system allocator
        ({ALLOCATOR: "true", SUPPLIED: ALLOCATOR}, True, "false"),  # training's default, replaced
        ({ALLOCATOR: "true"}, True, "true"),  # the user's choice stays
        ({ALLOCATOR: "false"}, False, "false"),
    ],
)
def test_the_allocator_follows_the_model_unless_the_user_chose(environ, recompute, chosen):
    choose_allocator(recompute, environ)
    assert environ[ALLOCATOR] == chosen
