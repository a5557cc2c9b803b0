"""The mistakes people make setting neffcache up, found in an environment, each with
its fix: ``neffcache doctor`` prints them, and the hook and the shim may print the
same one-line warnings.

Every one of these leaves neffcache silently off (or the SDK making a directory named
after a URL) rather than failing, which is why they are worth naming:

* ``neffcache://HOST/NS`` (or any other spelling of the scheme): only
  ``neffcache+http://`` and ``neffcache+https://`` turn neffcache on (config.py);
* ``http://HOST/NS`` as a cache URL: the SDK takes it for a directory;
* ``--cache-dir=`` in ``NEURON_CC_FLAGS``: libneuronxla reads ``--cache_dir`` only
  (docs/neuron-sdk.md#cache-location), and the compiler is handed an option it does not know;
* a bare URL in ``NEURON_CC_FLAGS``: the SDK hands it to the compiler as a word;
* a value in quotes or with spaces around it (``docker run --env-file`` and some
  YAML keep quotes as part of the value): the URL then does not start with the
  scheme, and a quoted token is refused by the server;
* a variable name a letter or two off one neffcache reads (``URI`` for ``URL``).

Standard library only, and nothing imported until called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from neffcache.client._cachevars import CACHE_URL_SCHEMES as _PREFIXES
from neffcache.client._cachevars import FLAGS_SETTING as FLAGS_VARIABLE
from neffcache.client._cachevars import URL_SETTINGS as URL_VARIABLES
from neffcache.client._redact import redact_url

TOKEN_VARIABLE = "NEFFCACHE_TOKEN"
# Names whose near misses are worth a warning: the ones that turn neffcache on.
_WATCHED = (*URL_VARIABLES, FLAGS_VARIABLE, TOKEN_VARIABLE, "NEFFCACHE_LOCAL_DIR")
_QUOTES = "\"'"


class Finding(NamedTuple):
    """What was found (never a secret's value) and how to fix it, one line each."""

    found: str
    fix: str


def findings(environ: Mapping[str, str]) -> list[Finding]:
    """Every mistake of the module docstring in ``environ``, in a stable order."""
    found = url_findings(environ)
    token = environ.get(TOKEN_VARIABLE, "")
    if token and (token != token.strip() or _quoted(token.strip())):
        found.append(
            Finding(
                f"{TOKEN_VARIABLE} has quotes or spaces around its value: the server "
                "refuses it as an unknown token",
                f"set {TOKEN_VARIABLE} to the token alone, without quotes or spaces",
            )
        )
    return found + _near_misses(environ)


def url_findings(environ: Mapping[str, str]) -> list[Finding]:
    """The mistakes in the cache URL's variables and ``NEURON_CC_FLAGS``: what the hook
    and the shim warn of (``warning``)."""
    found: list[Finding] = []
    for name in URL_VARIABLES:
        if environ.get(name):
            found += _url_value(name, f"{name}=", environ[name])
    if environ.get(FLAGS_VARIABLE):
        found += _flags(environ[FLAGS_VARIABLE])
    return found


def warning(environ: Mapping[str, str]) -> str | None:
    """The one line a process prints for ``url_findings`` (each with its fix), or None
    when there are none. A cache URL neffcache cannot use is named, never repaired:
    the SDK reads the same variables and would still take the value for a directory."""
    found = url_findings(environ)
    if not found:
        return None
    return "neffcache: " + "; ".join(f"{f.found} (fix: {f.fix})" for f in found)


def _quoted(value: str) -> bool:
    return len(value) >= 2 and value[0] == value[-1] and value[0] in _QUOTES


def _url_value(where: str, spelled: str, value: str) -> list[Finding]:
    """Mistakes in one URL value; ``spelled`` is how the fix writes it (``NAME=``,
    ``--cache_dir=``)."""
    found: list[Finding] = []
    bare = value.strip()
    if bare != value:
        found.append(
            Finding(
                f"{where} has spaces around its value",
                f"{spelled}{redact_url(bare)} (no spaces)",
            )
        )
    if _quoted(bare):
        bare = bare[1:-1].strip()
        found.append(
            Finding(
                f"{where} is in quotes, which are part of the value",
                f"{spelled}{redact_url(bare)} (no quotes: an env file or YAML value keeps them)",
            )
        )
    if bare.startswith(_PREFIXES):
        return found
    lower = bare.lower()
    if lower.startswith("neffcache"):
        found.append(
            Finding(
                f"{where} {redact_url(bare)}: only neffcache+http:// or neffcache+https:// "
                "(in lowercase) turns neffcache on",
                f"{spelled}{redact_url(_with_namespace(_respelled(bare)))}",
            )
        )
    elif lower.startswith(("http://", "https://")):
        found.append(
            Finding(
                f"{where} {redact_url(bare)}: an http URL is no cache URL the SDK knows "
                "(it takes it for a directory), and neffcache needs the neffcache+ prefix",
                f"{spelled}neffcache+{redact_url(_with_namespace(bare))}",
            )
        )
    return found


def _with_namespace(url: str) -> str:
    """``url`` with a ``/NAMESPACE`` placeholder where it names no path: a neffcache URL
    without its namespace would be refused next."""
    from urllib.parse import urlsplit

    return url.rstrip("/") + "/NAMESPACE" if urlsplit(url).path in ("", "/") else url


def _respelled(url: str) -> str:
    """``url`` with its scheme written as neffcache wants it: ``neffcache+https`` when
    the misspelling says https, else ``neffcache+http``."""
    import re

    found = re.match(r"(?i)neffcache[^a-z0-9]*(https?)?[:/]*", url)
    rest = url[found.end() :] if found else url
    secure = bool(found and (found.group(1) or "").lower() == "https")
    return f"neffcache+{'https' if secure else 'http'}://{rest}"


def _flags(flags: str) -> list[Finding]:
    import shlex

    found = _quotes_in_flags(flags)
    try:
        words = shlex.split(flags)
    except ValueError:
        return [*found, Finding(f"{FLAGS_VARIABLE} has an unbalanced quote", "remove it")]
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        if name in _MISSPELLED_CACHE_DIR:
            found.append(
                Finding(
                    f"{FLAGS_VARIABLE} has {name}: libneuronxla reads only --cache_dir (an "
                    "underscore, two dashes), and the compiler gets an option it does not know",
                    f"--cache_dir={redact_url(value) if value else 'URL'}",
                )
            )
        elif name == "--cache_dir" and value:
            found += _url_value(f"--cache_dir in {FLAGS_VARIABLE}", "--cache_dir=", value)
        elif name == "--cache_dir":
            found.append(Finding(f"{FLAGS_VARIABLE} has --cache_dir without a URL", "remove it"))
        elif _is_url(word) and not (i and words[i - 1] in ("--cache_dir", *_MISSPELLED_CACHE_DIR)):
            found.append(
                Finding(
                    f"{FLAGS_VARIABLE} holds a bare URL ({redact_url(word)}): the SDK hands it "
                    "to the compiler as a word and reads no cache URL from it",
                    f"NEFFCACHE_URL={redact_url(_suggested(word))} (and remove it from "
                    f"{FLAGS_VARIABLE})",
                )
            )
    return found


def _quotes_in_flags(flags: str) -> list[Finding]:
    found: list[Finding] = []
    for raw in flags.split():
        # Quotes elsewhere (``--tensorizer-options='...'``) are the compiler's business.
        unquoted = raw.replace('"', "").replace("'", "")
        if unquoted != raw and ("cache" in raw.lower() or _is_url(unquoted)):
            found.append(
                Finding(
                    f"{FLAGS_VARIABLE} has quotes in {redact_url(unquoted)}: how the SDK "
                    "splits it is not documented, so they may become part of the URL",
                    f"{redact_url(unquoted)} without quotes (a URL needs none)",
                )
            )
    return found


# Spellings of --cache_dir that people try; none of them is read by libneuronxla.
_MISSPELLED_CACHE_DIR = ("--cache-dir", "--cachedir", "-cache_dir", "--cache_url", "--cache-url")


def _is_url(word: str) -> bool:
    return word.lower().startswith(("neffcache", "http://", "https://"))


def _suggested(url: str) -> str:
    """The neffcache URL ``url`` was meant to be."""
    if url.startswith(_PREFIXES):
        return url
    lower = url.lower()
    return _respelled(url) if lower.startswith("neffcache") else f"neffcache+{url}"


def _near_misses(environ: Mapping[str, str]) -> list[Finding]:
    """Variables a letter or two off a name neffcache reads (``URI`` for ``URL``). A
    name of a quite different length is another setting (the server's ``blob_url``
    variable is one), not a misspelling."""
    import difflib

    found: list[Finding] = []
    for name in sorted(environ):
        if name in _WATCHED or not environ[name]:
            continue
        close = [w for w in _WATCHED if abs(len(w) - len(name)) <= 2]
        match = difflib.get_close_matches(name.upper(), close, n=1, cutoff=0.85)
        if match:
            found.append(
                Finding(f"{name} is set, and neffcache does not read it", f"{match[0]}=...")
            )
    return found
