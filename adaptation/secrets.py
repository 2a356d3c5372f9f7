"""Secrets the control plane keeps (an endpoint's API key): Fernet (AES-128-CBC + HMAC-SHA256, from
``cryptography``) under a key derived from Django's SECRET_KEY with HKDF, so a database dump alone reveals no key.
Changing SECRET_KEY makes stored keys unreadable: they must be entered again (the error says so)."""

from __future__ import annotations

import base64

from django.conf import settings

from .errors import SecretUnreadable

INFO = b"d0 serving endpoint api key"


def _fernet():
    from cryptography.fernet import Fernet
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=INFO).derive(settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode()


def decrypt(token: str) -> str:
    from cryptography.fernet import InvalidToken

    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("the stored API key cannot be decrypted (SECRET_KEY changed since it was saved): "
                               "enter it again on the endpoint's page") from None
