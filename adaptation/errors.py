"""The control plane's own error types, in one place: every capability raises them and the API, the pages and the
control tasks answer them, so none of those needs to import another capability to catch its errors."""

from __future__ import annotations


class Conflict(Exception):
    """The request is valid but the object's state forbids it (the API answers 409)."""


class Rejected(Exception):
    """A node message that is dropped, not applied: the reason is logged and counted for its cluster (the cluster
    page lists them). ``detail`` says which node or stage run it was about."""

    def __init__(self, reason: str, cluster=None, detail: str = ""):
        super().__init__(reason)
        self.reason, self.cluster, self.detail = reason, cluster, detail


class UnknownKey(Rejected):
    """Signed by a key no node has: a forgery, or a node's first heartbeat overtaking its registration."""


class SecretUnreadable(ValueError):
    """A stored secret (an endpoint's API key) that cannot be decrypted: SECRET_KEY changed since it was saved."""
