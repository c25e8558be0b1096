"""The cluster's own exceptions."""


class LeadershipLost(Exception):
    """This node no longer holds the leader key (its lease expired or was revoked): it must stop serving."""


class ReplicationRefused(Exception):
    """The leader refused this follower (wrong shared secret or unknown node)."""
