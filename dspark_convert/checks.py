"""The one record of a check's result, for every stage that checks something.

convert records its checks in manifest.json, validate reports them (and may fail on them),
the pairing and Strata's rules produce them. A failed check carries the error class and
exit code of its refusal (``error``, ``exit_code``); every other check has neither, and
they are left out when the record is written, so a manifest's checks read
``{name, status, detail}``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_serializer

from dspark_convert.errors import DSparkError

# "info": a fact the reader should know that is not a risk (today's Strata loader refuses
# DSpark heads); unlike "warning", --strict does not fail it. "skipped": an earlier
# failure made the check moot.
Status = Literal["passed", "info", "failed", "warning", "skipped"]


class Check(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    name: str
    status: Status
    detail: str
    error: str | None = None        # the error class of a failure
    exit_code: int | None = None    # and its exit code

    @model_serializer(mode="wrap")
    def _omit_absent_error(self, handler):
        data = handler(self)
        for key in ("error", "exit_code"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @classmethod
    def passed(cls, name: str, detail: str) -> "Check":
        return cls(name=name, status="passed", detail=detail)

    @classmethod
    def warning(cls, name: str, detail: str) -> "Check":
        return cls(name=name, status="warning", detail=detail)

    @classmethod
    def info(cls, name: str, detail: str) -> "Check":
        return cls(name=name, status="info", detail=detail)

    @classmethod
    def skipped(cls, name: str, detail: str) -> "Check":
        return cls(name=name, status="skipped", detail=detail)

    @classmethod
    def failed(cls, name: str, error: DSparkError) -> "Check":
        return cls(name=name, status="failed", detail=error.message,
                   error=type(error).__name__, exit_code=error.exit_code)
