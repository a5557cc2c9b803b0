"""``--report FILE``: everything in one file, and no token or secret in it, nor on
stdout: a planted token, password, signature and cloud key never appear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor.doctor_harness import TokenServer, doctor_env, run_doctor

pytestmark = pytest.mark.e2e

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIplantedSECRETKEY",
    "HF_TOKEN": "hf_plantedHuggingFaceToken",
}
PASSWORD = "hunter2-planted-password"
SIGNATURE = "planted-presigned-signature"


def test_the_report_holds_everything_and_no_secret(
    token_server: TokenServer, tmp_path: Path
) -> None:
    token = token_server.writer
    env = doctor_env(
        tmp_path,
        token_server.url("team-a"),
        NEFFCACHE_TOKEN=token,
        # Not in force (NEFFCACHE_URL is), but quoted by the checks: a user and
        # password in one URL, a presigned signature in another.
        NEURON_CC_FLAGS=f"--cache-dir=https://admin:{PASSWORD}@cache.internal/x",
        NEURON_COMPILE_CACHE_URL=f"s3://bucket/prefix?X-Amz-Signature={SIGNATURE}",
        # Where the hit daemon's socket is (no NEFFCACHE_DAEMON_DIR): listed too.
        XDG_RUNTIME_DIR=str(tmp_path / "run"),
        **SECRETS,
    )
    report = tmp_path / "doctor-report.txt"
    done = run_doctor(env, "--report", str(report))
    assert done.code in (0, 1), done.err
    assert f"wrote {report}" in done.err
    text = report.read_text()
    planted = [token, PASSWORD, SIGNATURE, *SECRETS.values()]
    for output in (text, done.out, done.err):
        assert [s for s in planted if s in output] == []
    # Nor its secret part alone (nfc_<id>_<secret>).
    assert token.split("_", 2)[2] not in text
    # Everything is there: every check, the environment, the JSON.
    assert "neffcache doctor report" in text.splitlines()[0]
    assert "NEFFCACHE_TOKEN=<set>" in text
    assert "AWS_SECRET_ACCESS_KEY" not in text  # not a variable the report lists
    assert "NEURON_CC_FLAGS=--cache-dir=https://***@cache.internal/x" in text
    assert "NEURON_COMPILE_CACHE_URL=s3://bucket/prefix?***" in text
    assert f"XDG_RUNTIME_DIR={tmp_path / 'run'}" in text
    document = json.loads(text.split("\nJSON\n", 1)[1])
    assert document["environment"]["NEFFCACHE_TOKEN"] == "<set>"
    assert {r["id"] for r in document["results"]} >= {
        "config.url",
        "paths.daemon",
        "hook.surface",
        "l1.space",
    }
    assert document["exit_code"] == done.code
    for result in document["results"]:
        assert f"  {result['status']:<4}  {result['id']} " in text


def test_json_output_parses_and_holds_no_token(token_server: TokenServer, tmp_path: Path) -> None:
    token = token_server.reader
    env = doctor_env(tmp_path, token_server.url("team-a"), NEFFCACHE_TOKEN=token)
    done = run_doctor(env, "--json", "--only", "config", "--only", "server")
    document = json.loads(done.out)
    assert token not in done.out
    assert document["summary"]["FAIL"] == 0
    assert done.code == 0
