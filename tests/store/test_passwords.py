import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lavinpy.wire.passwords import hash_password, verify_password

ALGOS = {
    "rabbit_password_hashing_sha256": hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}


@pytest.mark.parametrize("algorithm", sorted(ALGOS))
def test_fixed_salt_matches_independent_computation(algorithm):
    salt = bytes([1, 2, 3, 250])
    password = "sécret"
    expected = base64.b64encode(salt + ALGOS[algorithm](salt + password.encode("utf-8")).digest()).decode()
    assert hash_password(password, algorithm, salt=salt) == expected
    assert verify_password(password, expected, algorithm)
    assert not verify_password("secret", expected, algorithm)


def test_published_rabbitmq_example():
    # The worked example in RabbitMQ's "Credentials and Passwords" guide: salt 908DC60A, password test12.
    published = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    assert hash_password("test12", salt=bytes.fromhex("908DC60A")) == published
    assert verify_password("test12", published, "rabbit_password_hashing_sha256")
    assert not verify_password("test13", published, "rabbit_password_hashing_sha256")


def test_default_is_sha256_with_random_salt():
    first, second = hash_password("guest"), hash_password("guest")
    assert first != second  # different salts
    for h in (first, second):
        raw = base64.b64decode(h)
        assert len(raw) == 4 + 32
        assert verify_password("guest", h, "rabbit_password_hashing_sha256")


def test_hash_is_algorithm_specific():
    h = hash_password("pw", "rabbit_password_hashing_sha512")
    assert len(base64.b64decode(h)) == 4 + 64
    assert not verify_password("pw", h, "rabbit_password_hashing_sha256")


@pytest.mark.parametrize("bad_hash", ["", "not base64!!", base64.b64encode(b"abcd").decode(), "YQ="])
def test_empty_or_malformed_hash_never_verifies(bad_hash):
    assert not verify_password("", bad_hash, "rabbit_password_hashing_sha256")
    assert not verify_password("x", bad_hash, "rabbit_password_hashing_sha256")


def test_unknown_algorithm_raises():
    # (bcrypt is known: LavinMQ exports bcrypt hashes)
    with pytest.raises(ValueError, match="md4"):
        hash_password("x", "md4")
    with pytest.raises(ValueError, match="md4"):
        verify_password("x", hash_password("x"), "md4")
    with pytest.raises(ValueError, match="md4"):
        verify_password("x", "", "md4")


def test_salt_must_be_four_bytes():
    with pytest.raises(ValueError):
        hash_password("x", salt=b"abc")


@given(password=st.text(max_size=40), other=st.text(max_size=40))
def test_round_trip_property(password, other):
    h = hash_password(password)
    assert verify_password(password, h, "rabbit_password_hashing_sha256")
    assert verify_password(other, h, "rabbit_password_hashing_sha256") == (other == password)
