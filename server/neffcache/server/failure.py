"""Failure reports: what a client sends when a compile failed, and the record stored.

A failure record is never a cache hit. It is kept for a while so that explanations,
reports and operators can see what broke. The record is the report's fields (nulls
dropped) plus the server's stamps, as canonical JSON; the log keeps only its last
``LOG_MAX_BYTES``, where compilers print their errors.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from neffcache.server.errors import BadRequest, TooLarge
from neffcache.server.manifest import (
    HEX64,
    check_neuron_address,
    load_json,
    refuse_unknown,
    validated,
)

# The tail of a log that is kept, in UTF-8 bytes.
LOG_MAX_BYTES = 64 * 1024
# A stored record at most: every read returns up to failures_per_key of them, and one
# Redis script or SQLite transaction handles them; a report that would make a larger
# record (its components, mostly) is refused with 413.
RECORD_MAX_BYTES = 256 * 1024
# Host names and job ids longer than this are not names.
NAME_MAX = 255
# Fields the server sets in every record; a client may not send them.
STAMPS = frozenset({"created_at", "key", "log_truncated", "namespace", "writer"})


class FailureReport(BaseModel):
    """The body of ``PUT /v1/ns/{namespace}/failures/{key}``.

    Strict: types are not coerced (``"1"`` is not an exit code), and unknown fields
    are refused, so a client's typo is an error rather than a field silently lost.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    compiler_version: str = Field(
        min_length=1, max_length=NAME_MAX, description="neuronx-cc's full build string"
    )
    neuron_address: str | None = Field(
        None, description="the stock address neuronxcc-<ver>/MODULE_<key>+<flags8>"
    )
    direct_key: str | None = Field(None, pattern=f"^{HEX64}$", description="64 hex")
    components: dict[str, Any] | None = Field(None, description="as in a manifest")
    # An exit status, 0 to 255, or a signal as a negative code (Python's subprocess):
    # a larger one is no process's, and a client replaying 256 would exit 0.
    exit_code: int | None = Field(None, ge=-255, le=255)
    compile_seconds: float | None = Field(None, ge=0, allow_inf_nan=False)
    log: str | None = Field(None, description=f"the server keeps the last {LOG_MAX_BYTES} bytes")
    host: str | None = Field(None, max_length=NAME_MAX)
    job_id: str | None = Field(None, max_length=NAME_MAX)

    @field_validator("neuron_address")
    @classmethod
    def _address(cls, address: str | None) -> str | None:
        return check_neuron_address(address)

    @field_validator("compiler_version")
    @classmethod
    def _version(cls, version: str) -> str:
        from neffcache.keying import KeyingError, check_compiler_version

        try:
            return check_compiler_version(version)
        except KeyingError as exc:
            raise ValueError(str(exc)) from None


def parse_failure(body: bytes) -> FailureReport:
    """Validate a failure report; BadRequest names every unknown field sent, the
    server's stamps included."""
    raw = load_json(body, "failure report")
    if not isinstance(raw, dict):
        raise BadRequest("a failure report is a JSON object")
    refuse_unknown(raw, FailureReport, STAMPS, "a failure report")
    return validated(FailureReport, raw, "failure report")


def failure_record(
    report: FailureReport, *, namespace: str, key: str, created_at: float, writer: str
) -> str:
    """The stored record: the report with its log cut to the tail, plus the stamps."""
    fields = report.model_dump(exclude_none=True)
    truncated = False
    if report.log is not None:
        fields["log"], truncated = log_tail(_printable(report.log))
    stamps = {
        "created_at": created_at,
        "key": key,
        "log_truncated": truncated,
        "namespace": namespace,
        "writer": writer,
    }
    # Not ASCII-escaped (as manifests are): a log in another script would grow
    # sixfold. A lone surrogate (valid JSON, not text) then cannot encode: refused.
    record = json.dumps(
        {**fields, **stamps}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    try:
        size = len(record.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("the failure report holds text that is not valid Unicode") from None
    if size > RECORD_MAX_BYTES:
        raise TooLarge(
            f"the failure record would be {size} bytes, over {RECORD_MAX_BYTES} "
            "(send fewer components)"
        )
    return record


def _printable(log: str) -> str:
    """The log without control characters other than newlines and tabs (terminal
    colour codes, mostly): each would take six bytes as a JSON escape."""
    return _CONTROL.sub("", log)


# Colour sequences first, whole; then single control characters.
_CONTROL = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def log_tail(log: str, limit: int = LOG_MAX_BYTES) -> tuple[str, bool]:
    """The last ``limit`` UTF-8 bytes of ``log``, starting on a whole character, and
    whether anything was cut."""
    # surrogatepass: JSON may carry a lone surrogate, which strict UTF-8 cannot encode.
    data = log.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return log, False
    tail = data[-limit:]
    start = 0
    while start < len(tail) and tail[start] & 0xC0 == 0x80:  # inside a cut character
        start += 1
    return tail[start:].decode("utf-8", "surrogatepass"), True
