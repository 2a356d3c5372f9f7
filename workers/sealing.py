"""Secrets sealed to one node, so that they cross the broker as ciphertext only one node can open.

Each node makes an X25519 key pair at its first start (kept in ``--state-dir``, mode 0600, like its signing key)
and registers the public half. The control plane seals a stage's secret parameters (an endpoint's API key) to the
node the stage runs on, just before it sends the stage's message: an ephemeral X25519 key agreed with the node's,
HKDF-SHA256 over the shared secret (salted with both public keys) for a one-time key, and ChaCha20-Poly1305 over
the value, with associated data naming the stage run, the node and the parameter, so a sealed value opens only in
the stage run and on the node it was sealed for. The node opens it just before it runs the stage (the ECIES shape
of RFC 9180's HPKE base mode, with the `cryptography` package's primitives). Imports nothing from Django.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .signing import load_or_create_private_key

INFO = b"d0 sealed stage parameter v1"
SEALED = "sealed"  # a sealed value in a stage's parameters: {"sealed": "<base64>"}
_RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class SealError(ValueError):
    """A sealed value that does not open here (sealed to another node or stage run, or altered)."""


def context(stage_run_id: int, node_key_id: str, name: str) -> bytes:
    """The associated data a sealed parameter is bound to."""
    return f"stage run {stage_run_id}|node {node_key_id}|parameter {name}".encode()


def _key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=INFO).derive(shared)


def seal(public_key: str, value: str, associated: bytes) -> dict:
    """``value`` sealed to the holder of the X25519 ``public_key`` (base64)."""
    recipient = base64.b64decode(public_key, validate=True)
    ephemeral = X25519PrivateKey.generate()
    ephemeral_public = ephemeral.public_key().public_bytes(*_RAW)
    key = _key(ephemeral.exchange(X25519PublicKey.from_public_bytes(recipient)), ephemeral_public, recipient)
    nonce = os.urandom(12)
    box = ChaCha20Poly1305(key).encrypt(nonce, value.encode(), associated)
    return {SEALED: base64.b64encode(ephemeral_public + nonce + box).decode()}


def is_sealed(value) -> bool:
    return isinstance(value, dict) and set(value) == {SEALED} and isinstance(value[SEALED], str)


class SealingKey:
    """The node's X25519 key pair; ``load_or_create(path)`` makes one at the first start and reuses it after."""

    def __init__(self, private_key: X25519PrivateKey):
        self._private_key = private_key
        self._public = private_key.public_key().public_bytes(*_RAW)
        self.public_key = base64.b64encode(self._public).decode()

    @classmethod
    def load_or_create(cls, path: Path) -> SealingKey:
        key, _ = load_or_create_private_key(path, X25519PrivateKey.generate)
        if not isinstance(key, X25519PrivateKey):
            raise ValueError(f"{path} does not hold an X25519 private key")
        return cls(key)

    def open(self, sealed: dict, associated: bytes) -> str:
        try:
            raw = base64.b64decode(sealed[SEALED], validate=True)
            ephemeral, nonce, box = raw[:32], raw[32:44], raw[44:]
            shared = self._private_key.exchange(X25519PublicKey.from_public_bytes(ephemeral))
            return ChaCha20Poly1305(_key(shared, ephemeral, self._public)).decrypt(nonce, box, associated).decode()
        except (InvalidTag, ValueError, KeyError, TypeError) as error:
            raise SealError("a sealed parameter does not open on this node for this stage run") from error
