"""RabbitMQ-compatible password hashes.

A hash is base64(salt + H(salt + utf8(password))) with a 4-byte random salt, where H depends on the
``hashing_algorithm`` name RabbitMQ uses. Using the same format means users exported from RabbitMQ
(definitions JSON) log in to lavinpy unchanged, and the other way round.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

DEFAULT_ALGORITHM = "rabbit_password_hashing_sha256"
SALT_LENGTH = 4

# RabbitMQ algorithm name -> hashlib constructor name
_HASHES = {
    "rabbit_password_hashing_sha256": "sha256",
    "rabbit_password_hashing_sha512": "sha512",
    "rabbit_password_hashing_md5": "md5",
}

ALGORITHMS = tuple(_HASHES)


def _hashlib_name(algorithm: str) -> str:
    try:
        return _HASHES[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown password hashing algorithm {algorithm!r}; supported: {', '.join(ALGORITHMS)}"
        ) from None


def _digest(algorithm: str, salt: bytes, password: str) -> bytes:
    return hashlib.new(_hashlib_name(algorithm), salt + password.encode("utf-8")).digest()


def hash_password(password: str, algorithm: str = DEFAULT_ALGORITHM, salt: bytes | None = None) -> str:
    """Return the base64 salted hash of ``password``; ``salt`` is random unless given (tests)."""
    if salt is None:
        salt = os.urandom(SALT_LENGTH)
    if len(salt) != SALT_LENGTH:
        raise ValueError(f"salt must be {SALT_LENGTH} bytes, got {len(salt)}")
    return base64.b64encode(salt + _digest(algorithm, salt, password)).decode("ascii")


def verify_password(password: str, password_hash: str, algorithm: str) -> bool:
    """True when ``password`` matches ``password_hash``. An empty or malformed hash never matches."""
    _hashlib_name(algorithm)  # an unknown algorithm is an error even when the hash is empty
    if not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    if len(raw) <= SALT_LENGTH:
        return False
    salt, expected = raw[:SALT_LENGTH], raw[SALT_LENGTH:]
    return hmac.compare_digest(_digest(algorithm, salt, password), expected)
