"""The client's logger, loaded on first use: ``logging``'s import costs about 3 ms, and
the compiler wrapper's cache hits log nothing (one start-up per graph).

Also the one warning every process may give about its cache settings
(``warn_typos_once``): it lives here because everything that runs it imports this
module anyway (``neffcache_hook.pth`` at every interpreter start with a setting that
mentions neffcache, the hook, the shim), so settings that are right cost a few string
tests and no import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neffcache.client._cachevars import CACHE_URL_SCHEMES, FLAGS_SETTING, URL_SETTINGS

if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping


class _LazyLogger:
    def __getattr__(self, name: str) -> Any:
        import logging

        return getattr(logging.getLogger("neffcache.client"), name)


log: Any = _LazyLogger()

_CACHE_DIR = "--cache_dir"
# Checksums of the settings a process checked and of the line it printed for them
# (``SETTINGS:LINE``): its children (the compiler shim the SDK runs under the hook,
# torchrun's workers, the real compiler under the shim) inherit it and stay quiet about
# the same settings, or about other settings that call for the same line (the hook
# exports NEFFCACHE_URL when the SDK hands it a URL), but not about mistakes of their own.
CHECKED = "NEFFCACHE_TYPOS_CHECKED"


def warn_typos_once(environ: MutableMapping[str, str]) -> None:
    """One line on stderr naming each fix when a cache setting in ``environ`` mentions
    neffcache or an http(s):// URL in a way neffcache cannot use (``_typos.warning``);
    once per process and its children."""
    try:
        if not typos_suspected(environ):
            return
        settings = _checksum("\0".join(environ.get(n, "") for n in (*URL_SETTINGS, FLAGS_SETTING)))
        checked, _, said = environ.get(CHECKED, "").partition(":")
        if checked == settings:
            return
        from neffcache.client._typos import warning

        line = warning(environ)
        new = _checksum(line or "")
        environ[CHECKED] = f"{settings}:{new}"
        if line is not None and new != said:
            log.warning("%s", line)
    except Exception:  # a warning about settings is never worth a failed start or compile
        pass


def _checksum(text: str) -> str:
    import zlib

    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


def typos_suspected(environ: Mapping[str, str]) -> bool:
    """Whether a cache setting mentions neffcache or an http(s):// URL other than at the
    start of a URL variable, or of ``--cache_dir``'s value, spelled as neffcache reads
    it. A false alarm costs ``_typos``'s import and finds nothing."""
    for name in URL_SETTINGS:
        value = environ.get(name, "")
        if _mentions(value) and not (
            value.startswith(CACHE_URL_SCHEMES) and value == value.strip()
        ):
            return True
    words = environ.get(FLAGS_SETTING, "").split()
    for i, word in enumerate(words):
        if _mentions(word) and not _right_flag(word, words[i - 1] if i else ""):
            return True
    return False


def _mentions(text: str) -> bool:
    lower = text.lower()
    return "neffcache" in lower or "http://" in lower or "https://" in lower


def _right_flag(word: str, before: str) -> bool:
    """``--cache_dir=URL`` or ``--cache_dir URL`` with a URL that turns neffcache on."""
    if word.startswith(f"{_CACHE_DIR}="):
        return word[len(_CACHE_DIR) + 1 :].startswith(CACHE_URL_SCHEMES)
    return before == _CACHE_DIR and word.startswith(CACHE_URL_SCHEMES)
