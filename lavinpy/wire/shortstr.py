"""AMQP's short string: at most 255 bytes of UTF-8. Texts that may be longer (close texts, the model's
refusals, consumer tags made from names) are cut to fit here, the one rule for every layer."""

from __future__ import annotations

SHORTSTR_MAX = 255


def fit_shortstr(text: str) -> str:
    """``text`` cut to what a short string holds (255 bytes of UTF-8), never inside a character."""
    # Names decoded from a client's non-UTF-8 bytes hold surrogates: show them escaped.
    encoded = text.encode("utf-8", "backslashreplace")
    if len(encoded) <= SHORTSTR_MAX:
        return encoded.decode("utf-8")
    # Cut on a byte boundary; "ignore" drops a multi-byte character split at the end.
    return encoded[:SHORTSTR_MAX].decode("utf-8", "ignore")
