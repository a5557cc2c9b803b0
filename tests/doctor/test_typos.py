"""The mistakes ``_typos.findings`` names and the redaction everything printed goes
through, in-process: plain functions the hook and the shim may call too."""

from __future__ import annotations

import json

import pytest

from neffcache.client._redact import redact_text, redact_url, secret_values
from neffcache.client._typos import findings

GOOD = "neffcache+http://cache.internal:8787/team-a"


@pytest.mark.parametrize(
    "environ",
    [
        {"NEFFCACHE_URL": GOOD},
        {"NEFFCACHE_URL": "neffcache+https://cache.internal/team-a"},
        {"NEURON_COMPILE_CACHE_URL": "s3://bucket/prefix"},
        {"NEURON_COMPILE_CACHE_URL": "/fsx/neuron-cache"},
        {"NEURON_CC_FLAGS": f"--cache_dir={GOOD} --model-type=transformer"},
        {"NEURON_CC_FLAGS": f"--cache_dir {GOOD}"},
        {"NEURON_CC_FLAGS": "--tensorizer-options='--enable-ccop-compute-overlap'"},
        {"NEFFCACHE_TOKEN": "nfc_abc_def"},
        # Settings of the server and the admin commands, not misspellings.
        {"NEFFCACHE_BLOB_URL": "s3://b/p", "NEFFCACHE_INDEX_URL": "redis://r", "X": "1"},
        {"NEFFCACHE_DATA_DIR": "/data", "NEFFCACHE_ADMIN_TOKEN": "nfc_x_y"},
    ],
)
def test_correct_settings_are_not_mistakes(environ: dict[str, str]) -> None:
    assert findings(environ) == []


@pytest.mark.parametrize(
    ("environ", "fix"),
    [
        ({"NEFFCACHE_URL": "neffcache://cache.internal:8787/team-a"}, f"NEFFCACHE_URL={GOOD}"),
        ({"NEFFCACHE_URL": "NEFFCACHE+HTTP://cache.internal:8787/team-a"}, f"NEFFCACHE_URL={GOOD}"),
        ({"NEFFCACHE_URL": "neffcache+https//h/ns"}, "NEFFCACHE_URL=neffcache+https://h/ns"),
        # Without its namespace, the fix shows where it goes.
        (
            {"NEFFCACHE_URL": "http://cache.internal:8787"},
            "NEFFCACHE_URL=neffcache+http://cache.internal:8787/NAMESPACE",
        ),
        ({"NEFFCACHE_URL": "neffcache://h:1/"}, "NEFFCACHE_URL=neffcache+http://h:1/NAMESPACE"),
        (
            {"NEURON_COMPILE_CACHE_URL": "https://h/ns"},
            "NEURON_COMPILE_CACHE_URL=neffcache+https://h/ns",
        ),
        ({"NEURON_CC_FLAGS": f"--cache-dir {GOOD}"}, f"--cache_dir={GOOD}"),
        ({"NEURON_CC_FLAGS": f"--cache_dir=neffcache:{GOOD[16:]}"}, f"--cache_dir={GOOD}"),
        ({"NEURON_CC_FLAGS": "neffcache://h/ns -O1"}, "NEFFCACHE_URL=neffcache+http://h/ns"),
        ({"NEURON_CC_FLAGS": f"--cache_dir='{GOOD}'"}, f"--cache_dir={GOOD} without quotes"),
        ({"NEFFCACHE_URL": f" {GOOD}"}, f"NEFFCACHE_URL={GOOD} (no spaces)"),
        ({"NEFFCACHE_URL": f"'{GOOD}'"}, f"NEFFCACHE_URL={GOOD} (no quotes"),
        ({"NEFFCACHE_TOKEN": '"nfc_abc_def"'}, "set NEFFCACHE_TOKEN to the token alone"),
        ({"NEURON_COMPILE_CACHE_URI": GOOD}, "NEURON_COMPILE_CACHE_URL=..."),
        ({"NEURONX_CC_FLAGS": "-O1"}, "NEURON_CC_FLAGS=..."),
    ],
)
def test_each_mistake_is_found_with_its_fix(environ: dict[str, str], fix: str) -> None:
    found = findings(environ)
    assert len(found) == 1, found
    assert found[0].fix.startswith(fix), found[0]


def test_a_token_in_quotes_is_named_but_never_shown() -> None:
    (finding,) = findings({"NEFFCACHE_TOKEN": '"nfc_abc_secretvalue"'})
    assert "secretvalue" not in finding.found + finding.fix


def test_urls_in_findings_lose_their_secrets() -> None:
    url = "http://user:hunter2@cache.internal/ns?sig=abcdef"
    (finding,) = findings({"NEURON_COMPILE_CACHE_URL": url})
    assert "hunter2" not in finding.found + finding.fix
    assert "abcdef" not in finding.found + finding.fix
    assert finding.fix == "NEURON_COMPILE_CACHE_URL=neffcache+http://***@cache.internal/ns?***"


def test_redaction() -> None:
    assert redact_url("https://a:b@h:1/p?q=1#f") == "https://***@h:1/p?***"
    assert redact_url("/plain/path") == "/plain/path"
    environ = {"NEFFCACHE_TOKEN": "nfc_id_secret1", "AWS_SECRET_ACCESS_KEY": "k" * 20, "X": "v"}
    secrets = secret_values(environ)
    assert secrets == ["k" * 20, "nfc_id_secret1"]
    text = "token nfc_id_secret1, Authorization: Bearer abc123, s3://b/p?sig=x"
    assert redact_text(text, secrets) == (
        "token <redacted>, Authorization: <redacted>, s3://b/p?***"
    )
    # JSON stays JSON: nothing is taken past a quote or a line.
    document = json.dumps({"a": "needs Authorization: Bearer <token>", "b": "bearer x"}, indent=1)
    assert json.loads(redact_text(document)) == {
        "a": "needs Authorization: <redacted>",
        "b": "Bearer <redacted>",
    }
