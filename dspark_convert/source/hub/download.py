"""Downloading one file of a pinned commit with huggingface_hub's ``hf_hub_download``.

huggingface_hub does the transfer, its resume after a dropped connection and its filing in
the normal HF cache; we feed its progress to ours and refuse what it stored for another
commit than the one pinned. What the bytes are is checked afterwards (verify.py), never
taken from the download.
"""

from __future__ import annotations

from pathlib import Path

from dspark_convert.errors import HubIntegrityError
from dspark_convert.source.hub.cache import undo_foreign_commit
from dspark_convert.source.hub.client import translate
from dspark_convert.util.progress import Progress


def progress_bar_class(progress: Progress):
    """A tqdm stand-in for huggingface_hub that feeds our Progress (its own bars never
    draw: the CLI's progress decides, and it draws only on a terminal)."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            if n and n > 0:  # a rollback on resume (negative) is not drawn
                progress.advance(int(n))

        def close(self):
            pass

    return _Bar


def download(snap_dir: Path, repo: str, commit: str, path: str, *, endpoint: str,
             cache_dir: Path, timeout: float, bar) -> Path:
    """``path`` of ``repo@commit`` into the cache; returns its snapshot link."""
    from huggingface_hub import hf_hub_download

    what = f"{repo}@{commit[:12]}: {path}"
    try:
        local = Path(hf_hub_download(repo, path, revision=commit, endpoint=endpoint,
                                     cache_dir=cache_dir, etag_timeout=timeout, tqdm_class=bar))
    except Exception as exc:
        raise translate(exc, what, downloading=True) from None
    expected = snap_dir / path
    if local != expected:
        # huggingface_hub stores what the server says it served under that commit's
        # folder and returns it: another commit than the pinned one is a refusal.
        served = local.relative_to(snap_dir.parent).parts[0] if local.is_relative_to(
            snap_dir.parent) else str(local)
        undo_foreign_commit(snap_dir, local, commit)
        raise HubIntegrityError(f"{what}: the Hub served commit {served}; expected the pinned "
                                f"commit {commit}", path=path, expected=commit, found=served)
    return local
