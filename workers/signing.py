"""Identity on the wire, both ways: every node -> control message is signed with the node's own Ed25519 key, every
control -> node message with the control plane's.

Why keys and not a shared HMAC secret: the broker is shared by every node of every team, and whoever can reach
it can read the messages waiting in it. A node's private key never leaves the node (it is made on the node at its
first start, kept in ``--state-dir`` with mode 0600); the control plane only ever sees, and binds to the node, its
public key. The control plane's private key never leaves it (``D0_CONTROL_KEY_FILE``); each node pins its public
half when it joins. A join token (made by a team admin, shown once) is never sent either: the first registration
carries only the token's id and a signature of the registration by a key derived from the token's secret, and the
control plane keeps only that key's public half, so neither a reader of the broker nor of the database can join
with it. Celery's own message signing needs an X.509 certificate per sender and a shared certificate store; a key
pair per node made at join time is the smaller thing that fits.

A node's message is three strings: the sender's key id, the payload (JSON: the task name, the time it was sent
and the task's arguments) and the signature over the payload's exact bytes. A control-plane message is two: the
payload (also naming the node it is for and when it expires) and the signature. The receiver verifies those bytes
before it parses anything in them. Imports nothing from Django: both sides use it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .private_files import create_private_file


class SignatureError(ValueError):
    """The message is not what its claimed sender signed (or not for this receiver, or no longer valid)."""


class Expired(SignatureError):
    """An authentic control-plane message past its signed expiry; ``payload`` is what it said."""

    def __init__(self, payload: dict):
        super().__init__("past its signed expiry")
        self.payload = payload


def key_id(public_key: str) -> str:
    """A short, stable name for a public key (sha256 of its raw bytes, 32 hex digits)."""
    return hashlib.sha256(base64.b64decode(public_key)).hexdigest()[:32]


class SigningKey:
    """An Ed25519 key pair kept in a file. ``load_or_create(path)`` makes one at the first use and reuses it after."""

    def __init__(self, private_key: Ed25519PrivateKey):
        self._private_key = private_key
        raw = private_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode()
        self.key_id = key_id(self.public_key)

    @classmethod
    def generate(cls):
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: Path):
        """(key, created). The file holds the private key in PEM; it is written readable by its owner only."""
        key, created = load_or_create_private_key(path, Ed25519PrivateKey.generate)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return cls(key), created

    def sign(self, payload: str) -> str:
        return base64.b64encode(self._private_key.sign(payload.encode())).decode()


class NodeKey(SigningKey):
    """The node's own key pair, made on the node at its first start."""

    def message(self, task: str, args: list, **extra) -> list[str]:
        """The task's arguments as sent: [key id, payload, signature]."""
        payload = encode_payload({"task": task, "ts": time.time(), "args": args, **extra})
        return [self.key_id, payload, self.sign(payload)]


class ControlKey(SigningKey):
    """The control plane's key pair: every message to a node is signed with it, and each node pinned its public
    half when it joined (workers/control_trust.py)."""

    def message(self, task: str, node: str, args: list, *, max_age: float, **extra) -> list[str]:
        """A message for one node (``node``: its key id) as sent: [payload, signature]. It is void after
        ``max_age`` seconds (the payload's signed ``expires``, the control plane's clock)."""
        now = time.time()
        payload = encode_payload({"task": task, "node": node, "ts": now, "expires": now + max_age, "args": args,
                                  **extra})
        return [payload, self.sign(payload)]


def load_or_create_private_key(path: Path, generate):
    """(private key, created): the key in ``path`` (PEM, PKCS#8), or a new one from ``generate()`` written there
    with mode 0600 (``private_files``: processes starting at once all end up with the same key)."""
    if not path.exists():
        key = generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        if create_private_file(path, pem):
            return key, True
    return serialization.load_pem_private_key(path.read_bytes(), password=None), False


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


def _token_private_key(token_id: str, secret: str) -> Ed25519PrivateKey:
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"d0 join token",
                info=token_id.encode()).derive(secret.encode())
    return Ed25519PrivateKey.from_private_bytes(seed)


def token_verify_key(token_id: str, secret: str) -> str:
    """What the control plane keeps of a token: the public half of an Ed25519 key derived from its secret (HKDF).
    It checks a joining node's proof and cannot make one, so a database reader cannot join a node with it."""
    raw = _token_private_key(token_id, secret).public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def token_proof(token_id: str, secret: str, payload: str) -> str:
    """A joining node's proof that it holds the token: the registration signed with the token's derived key."""
    return base64.b64encode(_token_private_key(token_id, secret).sign(payload.encode())).decode()


def check_token_proof(verify_key: str, payload: str, proof: str) -> bool:
    if not verify_key:
        return False
    try:
        verify(verify_key, payload, proof)
    except SignatureError:
        return False
    return True


# --- control plane -> node ---------------------------------------------------------------------------------


def open_control_message(public_key: str, message, task: str, node: str, now: float | None = None) -> dict:
    """The payload of a control-plane message (``ControlKey.message``) if ``public_key`` signed exactly it, for
    this ``task`` and this ``node`` (key id), and it is not past its signed expiry; SignatureError (saying why)
    otherwise, Expired for an authentic one past its expiry. The signature is checked before anything in the
    payload is read."""
    if not (isinstance(message, list | tuple) and len(message) == 2 and all(isinstance(part, str)
                                                                            for part in message)):
        raise SignatureError("not a signed control-plane message")
    payload, signature = message
    verify(public_key, payload, signature)
    data = json.loads(payload)
    if not isinstance(data, dict) or data.get("task") != task:
        raise SignatureError("signed for another message kind")
    if data.get("node") != node:
        raise SignatureError("signed for another node")
    if not isinstance(data.get("args"), list) or not isinstance(data.get("expires"), int | float):
        raise SignatureError("payload lacks its arguments or its expiry")
    if (time.time() if now is None else now) > data["expires"]:
        raise Expired(data)
    return data
