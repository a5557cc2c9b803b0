"""Text fit to show a person or attach to an issue: no token, password or signature.

Secrets reach text three ways, and each has its rule: inside URLs (a user and
password before the host, a presigned signature in the query), in HTTP headers
(``Authorization: Bearer ...``), and as the values of variables a message quotes.
``redact_url`` handles the first, ``redact_text`` all three, given the secret values
the environment holds (``secret_values``). Standard library only: the hook and the
shim may print the same warnings later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
# Names of variables whose values are secrets: tokens, keys, passwords, credentials.
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|SESSION|(?:^|_)(?:API_?)?KEY(?:$|_)"
)
# Shorter values are not scrubbed from free text: "1" or "on" would blank out half a
# report, and a secret that short protects nothing anyway.
_MIN_SECRET = 6
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
# Within one line and one quoted string: the text may be JSON.
_AUTH_HEADER = re.compile(
    r"(?i)\b(authorization[ \t]*[:=][ \t]*)(?:(?:bearer|basic|token)[ \t]+)?[^\s'\",;)]+"
)
_BEARER = re.compile(r"(?i)\bbearer[ \t]+[^\s'\",;)]+")


def is_secret_name(name: str) -> bool:
    """Whether a variable named ``name`` holds a secret (its value is never shown)."""
    return bool(_SECRET_NAME.search(name.upper()))


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of ``environ``'s secret variables worth scrubbing, longest first (so a
    secret that contains another is replaced whole)."""
    found = {v.strip() for k, v in environ.items() if is_secret_name(k)}
    return sorted((v for v in found if len(v) >= _MIN_SECRET), key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` without its user information, query and fragment: ``https://***@host/p?***``.
    The user part goes too, since tokens are often passed as the user name."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    rest = authority + slash + path
    for mark in ("?", "#"):
        if mark in rest:
            rest = rest.split(mark, 1)[0] + mark + "***"
    return f"{scheme}://{rest}"


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL redacted, every ``Authorization`` header's and bearer
    token's value replaced, and every one of ``secrets`` replaced wherever it appears."""
    for secret in secrets:
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, REDACTED)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)
    return _BEARER.sub("Bearer " + REDACTED, text)
