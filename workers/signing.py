"""Node identity on the wire: every node -> control message is signed with the node's own Ed25519 key.

Why keys and not a shared HMAC secret: the broker is shared by every node of every team, and whoever can reach
it can read the messages waiting in it. A node's private key never leaves the node (it is made on the node at its
first start, kept in ``--state-dir`` with mode 0600); the control plane only ever sees, and binds to the node, its
public key. A join token (made by a team admin, shown once) is never sent either: the first registration carries
only the token's id and an HMAC of the registration made with the token's secret, so a reader of the broker can
neither join with it nor forge a node's messages. Celery's own message signing needs an X.509 certificate per
sender and a shared certificate store; a key pair per node made at join time is the smaller thing that fits.

A signed message is three strings: the sender's key id, the payload (JSON: the task name, the time it was sent
and the task's arguments) and the signature over the payload's exact bytes. The control plane verifies those
bytes before it parses anything in them. Imports nothing from Django: both sides use it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class SignatureError(ValueError):
    """The message is not what a known node signed."""


def key_id(public_key: str) -> str:
    """A short, stable name for a public key (sha256 of its raw bytes, 32 hex digits)."""
    return hashlib.sha256(base64.b64decode(public_key)).hexdigest()[:32]


class NodeKey:
    """The node's own key pair. ``load_or_create(path)`` makes one at the first start and reuses it after."""

    def __init__(self, private_key: Ed25519PrivateKey):
        self._private_key = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls) -> NodeKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path) -> tuple[NodeKey, bool]:
        """(key, created). The file holds the private key in PEM; it is written readable by its owner only."""
        if path.exists():
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError(f"{path} does not hold an Ed25519 private key")
            return cls(key), False
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        node_key = cls.generate()
        pem = node_key._private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption())
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
        return node_key, True

    def sign(self, payload: str) -> str:
        return base64.b64encode(self._private_key.sign(payload.encode())).decode()

    def message(self, task: str, args: list, **extra) -> list[str]:
        """The task's arguments as sent: [key id, payload, signature]."""
        payload = encode_payload({"task": task, "ts": time.time(), "args": args, **extra})
        return [self.key_id, payload, self.sign(payload)]


def encode_payload(payload: dict) -> str:
    # allow_nan: engine results carry NaN/Infinity where a measurement has none; json reads them back.
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)


def verify(public_key: str, payload: str, signature: str) -> None:
    """Raises SignatureError unless ``signature`` is the key's signature of exactly ``payload``."""
    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True)).verify(
            base64.b64decode(signature, validate=True), payload.encode())
    except (InvalidSignature, ValueError, TypeError) as error:
        raise SignatureError("bad signature") from error


# --- join tokens ------------------------------------------------------------------------------------------


def new_join_token() -> tuple[str, str]:
    """(token id, secret); a person copies ``<id>.<secret>`` (kubeadm's bootstrap-token shape)."""
    return secrets.token_hex(4), secrets.token_hex(16)


def split_join_token(token: str) -> tuple[str, str]:
    token_id, dot, secret = token.strip().partition(".")
    if not dot or not token_id or not secret:
        raise ValueError("a join token looks like abcd1234.0123456789abcdef0123456789abcdef")
    return token_id, secret


def token_key(secret: str) -> str:
    """What the control plane keeps of a token's secret, and the HMAC key a joining node proves it with."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_proof(key: str, payload: str) -> str:
    return hmac.new(bytes.fromhex(key), payload.encode(), hashlib.sha256).hexdigest()


def check_token_proof(key: str, payload: str, proof: str) -> bool:
    return hmac.compare_digest(token_proof(key, payload), str(proof))
