"""RabbitMQ- and LavinMQ-compatible password hashes.

A RabbitMQ hash is base64(salt + H(salt + utf8(password))) with a 4-byte random salt, where H depends
on the ``hashing_algorithm`` name RabbitMQ uses. Using the same format means users exported from
RabbitMQ (definitions JSON) log in to lavinpy unchanged, and the other way round.

LavinMQ exports the same three (its older versions prefixed the hash with ``$5$``/``$6$``/``$1$`` and
some spell the algorithm ``SHA256``, ``sha512``...), and bcrypt (``lavinmq_bcrypt``, a ``$2a$`` hash),
checked with the ``bcrypt`` package when it is installed. ``canonical_algorithm`` maps every spelling
to one name, which is what lavinpy stores and exports.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from typing import Any

DEFAULT_ALGORITHM = "rabbit_password_hashing_sha256"
BCRYPT_ALGORITHM = "lavinmq_bcrypt"
SALT_LENGTH = 4

# RabbitMQ algorithm name -> (hashlib constructor name, LavinMQ's old hash prefix)
_HASHES = {
    "rabbit_password_hashing_sha256": ("sha256", "$5$"),
    "rabbit_password_hashing_sha512": ("sha512", "$6$"),
    "rabbit_password_hashing_md5": ("md5", "$1$"),
}
# Other spellings of the same algorithms (LavinMQ's definitions, its user store, older exports).
_ALIASES = {
    "sha256": "rabbit_password_hashing_sha256",
    "sha512": "rabbit_password_hashing_sha512",
    "md5": "rabbit_password_hashing_md5",
    "bcrypt": BCRYPT_ALGORITHM,
    "lavinmq_bcrypt": BCRYPT_ALGORITHM,
    "lavinmq_password_hashing_bcrypt": BCRYPT_ALGORITHM,
}

ALGORITHMS = (*_HASHES, BCRYPT_ALGORITHM)


def canonical_algorithm(algorithm: str) -> str:
    """The one name of a hashing algorithm however RabbitMQ or LavinMQ spell it; ValueError if unknown."""
    if algorithm in ALGORITHMS:
        return algorithm
    if isinstance(algorithm, str):
        name = _ALIASES.get(algorithm.lower())
        if name is None and algorithm.lower().startswith("rabbit_password_hashing_"):
            name = _ALIASES.get(algorithm.lower().removeprefix("rabbit_password_hashing_"))
        if name is not None:
            return name
    raise ValueError(f"unsupported hashing_algorithm {algorithm!r}; supported: {', '.join(ALGORITHMS)}")


def _hashlib_name(algorithm: str) -> str:
    return _HASHES[canonical_algorithm(algorithm)][0]


def _digest(algorithm: str, salt: bytes, password: str) -> bytes:
    return hashlib.new(_hashlib_name(algorithm), salt + password.encode("utf-8")).digest()


def hash_password(password: str, algorithm: str = DEFAULT_ALGORITHM, salt: bytes | None = None) -> str:
    """Return the base64 salted hash of ``password``; ``salt`` is random unless given (tests)."""
    algorithm = canonical_algorithm(algorithm)
    if algorithm == BCRYPT_ALGORITHM:
        bcrypt = _bcrypt()
        return bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(prefix=b"2a")).decode("ascii")
    if salt is None:
        salt = os.urandom(SALT_LENGTH)
    if len(salt) != SALT_LENGTH:
        raise ValueError(f"salt must be {SALT_LENGTH} bytes, got {len(salt)}")
    return base64.b64encode(salt + _digest(algorithm, salt, password)).decode("ascii")


def normalize_hash(password_hash: str, algorithm: str) -> str:
    """A hash as lavinpy stores it: LavinMQ's old ``$5$``-style prefix dropped (RabbitMQ's form)."""
    algorithm = canonical_algorithm(algorithm)
    if algorithm != BCRYPT_ALGORITHM:
        prefix = _HASHES[algorithm][1]
        if password_hash.startswith(prefix):
            return password_hash[len(prefix):]
    return password_hash


def bcrypt_available() -> bool:
    try:
        _bcrypt()
    except ValueError:
        return False
    return True


def _bcrypt() -> Any:
    try:
        import bcrypt
    except ImportError:
        raise ValueError("bcrypt password hashes (lavinmq_bcrypt) need the 'bcrypt' Python package") from None
    return bcrypt


def verify_password(password: str, password_hash: str, algorithm: str) -> bool:
    """True when ``password`` matches ``password_hash``. An empty or malformed hash never matches."""
    algorithm = canonical_algorithm(algorithm)  # an unknown algorithm is an error even when the hash is empty
    if not password_hash:
        return False
    if algorithm == BCRYPT_ALGORITHM:
        bcrypt = _bcrypt()
        try:
            return bool(bcrypt.checkpw(password.encode("utf-8"), password_hash.encode("ascii")))
        except (ValueError, UnicodeEncodeError):
            return False
    try:
        raw = base64.b64decode(normalize_hash(password_hash, algorithm).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        return False
    # The salt is what precedes the digest: RabbitMQ's is 4 bytes, LavinMQ reads any length.
    digest_size = hashlib.new(_hashlib_name(algorithm)).digest_size
    if len(raw) <= digest_size:
        return False
    salt, expected = raw[:-digest_size], raw[-digest_size:]
    return hmac.compare_digest(_digest(algorithm, salt, password), expected)
