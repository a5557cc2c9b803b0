"""The report a user attaches to an issue (``--report FILE``), and the redaction
everything the doctor prints goes through.

The report holds the text output with every detail, the environment variables that
decide what neffcache and the stacks do, and the JSON output. No token or secret: the
checks never put one in a message, and the report is scrubbed anyway (belt and
braces, since a check quotes values a user typed): the value of ``NEFFCACHE_TOKEN``
and of every variable named like a secret wherever it appears, ``Authorization``
headers and bearer tokens, and the user, password and query of every URL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from neffcache.client._redact import is_secret_name, redact_text, secret_values

# The variables worth a look when something differs: neffcache's, the SDK's, the
# stacks' own caches, and what decides which Python and packages run.
_PREFIXES = ("NEFFCACHE_", "NEURON_", "TORCH_NEURONX_", "VLLM_", "XLA_", "JAX_", "HF_HUB_OFFLINE")
# XDG_RUNTIME_DIR: where the hit daemon's socket is, unless NEFFCACHE_DAEMON_DIR says.
_NAMES = (
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONNOUSERSITE",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "XDG_RUNTIME_DIR",
)
SET = "<set>"


class Redactor:
    """Applies ``_redact.redact_text`` with this environment's secrets (and their
    JSON-escaped spellings, for the JSON output)."""

    def __init__(self, environ: Mapping[str, str], extra: Iterable[str] = ()) -> None:
        plain = [*secret_values(environ), *(s for s in extra if s)]
        escaped = [json.dumps(s)[1:-1] for s in plain]
        self.secrets = sorted(set(plain + escaped), key=len, reverse=True)

    def __call__(self, text: str) -> str:
        return redact_text(text, self.secrets)


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of the module docstring; a secret's value is ``<set>``."""
    chosen = {
        name: value
        for name, value in environ.items()
        if name.startswith(_PREFIXES) or name in _NAMES
    }
    return {name: SET if is_secret_name(name) else value for name, value in sorted(chosen.items())}


def render(text: str, environ: Mapping[str, str], document: dict[str, Any]) -> str:
    """The report: the text output, the environment, the JSON (not yet redacted)."""
    env = environment(environ)
    lines = [
        "neffcache doctor report: attach it to an issue as it is. It holds no token or secret:",
        "secret variables show as <set>, and URLs lose their user, password and query.",
        "",
        text.rstrip("\n"),
        "",
        "Environment",
        *(f"  {name}={value}" for name, value in env.items()),
        "",
        "JSON",
        json.dumps({**document, "environment": dict(env)}, indent=2, default=str),
    ]
    return "\n".join(lines) + "\n"


def strip_controls(text: str) -> str:
    """No terminal escapes in a file meant for an issue tracker."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
