"""Fixtures of the distributed tests: the network-namespace hosts, one instance for the session
(a session fixture imported into several test modules would be made once per module)."""

from tests.hosts import hosts  # noqa: F401
