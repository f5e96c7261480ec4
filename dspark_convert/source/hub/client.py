"""The boundary with huggingface_hub: which endpoint, how hard to retry, and its exceptions
turned into our one-line errors.

huggingface_hub (and httpx2, which it brings) is imported inside functions: ``dspark --help``
must stay fast.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from dspark_convert.errors import (
    DSparkError,
    HubFileNotFoundError,
    HubNetworkError,
    HubOfflineError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
    HubSpecError,
    HubTruncatedDownloadError,
)

DEFAULT_ENDPOINT = "https://huggingface.co"

# The answers worth asking again: a timeout, rate limiting and the server-side failures
# (the statuses huggingface_hub's own http_backoff retries on).
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

T = TypeVar("T")


def hub_endpoint(endpoint: str | None = None) -> str:
    # huggingface_hub reads HF_ENDPOINT once at import; we read it at call time.
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before "network failure after retries": retries of each metadata
    request with doubling waits, ``wait`` then up to ``max_wait`` seconds; ``timeout`` per
    request. (Downloads keep huggingface_hub's own resume logic.) The whole schedule is
    ours, so that a failure is reported within a known time: at most ``retries + 1``
    attempts and the sum of the waits, whatever the server asks for (a ``Retry-After`` is
    not followed)."""
    retries: int = 3
    wait: float = 0.5
    max_wait: float = 4.0
    timeout: float = 10.0

    def run(self, request: Callable[[], T]) -> T:
        """``request()``, asked again after a transient failure (a connection error, a
        timeout, an HTTP status in RETRY_STATUSES) until the retries are spent; the last
        failure is raised as it came (``translate`` names it)."""
        wait, retries = self.wait, self.retries
        while True:
            try:
                return request()
            except Exception as exc:
                if retries <= 0 or not _transient(exc):
                    raise
            retries -= 1
            time.sleep(wait)
            wait = min(self.max_wait, wait * 2)


def _transient(exc: BaseException) -> bool:
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.HfHubHTTPError):
        return exc.response is not None and exc.response.status_code in RETRY_STATUSES
    return isinstance(exc, (httpx2.TimeoutException, httpx2.NetworkError,
                            httpx2.RemoteProtocolError))


def translate(exc: BaseException, what: str, *, downloading: bool = False) -> DSparkError:
    """A huggingface_hub / httpx exception as one of our one-line errors (anything else is
    raised again: a bug of ours must not read as a network failure)."""
    import httpx2
    from huggingface_hub import errors as hf

    if isinstance(exc, hf.HFValidationError):
        # huggingface_hub checks repo ids more strictly than org/name (no "--" or "..",
        # at most 96 characters) before it sends anything.
        return HubSpecError(f"{what}: not a valid Hub repo id or revision: {exc}",
                            field="source", expected="a valid Hub repo id", found=str(exc)[:120])
    if isinstance(exc, hf.LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        if cause is None or isinstance(cause, hf.OfflineModeIsEnabled):
            return HubOfflineError(f"{what}: offline and not in the local cache; expected a "
                                   "cached snapshot of that commit (run once online)",
                                   found="not cached")
        return translate(cause, what, downloading=downloading)
    if isinstance(exc, hf.RepositoryNotFoundError):
        return HubRepoNotFoundError(f"{what}: repository not found on the Hub (or private "
                                    "without access)", found="RepoNotFound")
    if isinstance(exc, hf.RevisionNotFoundError):
        return HubRevisionNotFoundError(f"{what}: revision not found in the repository",
                                        found="RevisionNotFound")
    if isinstance(exc, hf.RemoteEntryNotFoundError):
        return HubFileNotFoundError(f"{what}: file not found in the repository at that commit",
                                    found="EntryNotFound")
    if isinstance(exc, hf.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return HubNetworkError(f"{what}: the Hub answered HTTP {status} after retries",
                               expected="HTTP 200", found=f"HTTP {status}")
    if isinstance(exc, httpx2.RemoteProtocolError) and downloading:
        return HubTruncatedDownloadError(f"{what}: the transfer was cut short after retries "
                                         f"({exc})", found=str(exc)[:120])
    if isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError)):
        return HubNetworkError(f"{what}: cannot reach the Hub after retries: "
                               f"{type(exc).__name__}: {exc}", found=type(exc).__name__)
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        sizes = re.search(r"size (\d+) but has size (\d+)", str(exc))
        return HubTruncatedDownloadError(
            f"{what}: download ended short" + (f": {sizes.group(2)} of {sizes.group(1)} bytes"
                                               if sizes else ""),
            expected=int(sizes.group(1)) if sizes else None,
            found=int(sizes.group(2)) if sizes else None)
    if isinstance(exc, OSError):
        return HubNetworkError(f"{what}: download failed: {exc.strerror or exc}",
                               found=type(exc).__name__)
    raise exc


@contextmanager
def quiet_huggingface_hub():
    """huggingface_hub logs its retries ("Retrying in 1s") on stderr; a library call of
    ours prints nothing (the error it ends in says what happened), so its logger is
    silenced for the duration of the call."""
    import logging

    # Importing it configures the library's logger (level, handler): do that first.
    import huggingface_hub.utils.logging  # noqa: F401

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
