"""The Hub's metadata: the commit a branch or tag points to, and a commit's files.

Both calls run under our RetryPolicy (client.py), so that a failing Hub is reported after a
bounded, configurable time (the tests run it with 10 ms waits):

* ``resolve_revision`` is huggingface_hub's own ``HfApi.model_info(revision=...).sha``.
  ``model_info`` makes one request and never retries, so the policy wraps it whole.
* ``list_files`` is hand-written on purpose: ``HfApi.list_repo_tree`` pages through
  ``utils/_pagination.py``, which calls ``http_backoff`` with its defaults (5 retries, waits
  1, 2, 4, 8, 8 s: about 23 s before an error, and a server's ``Retry-After`` followed
  without a bound), and it takes no argument to change that. So we request the same URL it
  does (``/api/models/{repo}/tree/{revision}?recursive=true&expand=false``, following the
  ``Link: rel="next"`` pages the same way) one page at a time under our policy, and parse
  each entry into huggingface_hub's own ``RepoFile`` (``blob_id``, ``size``,
  ``lfs.sha256``), as ``list_repo_tree`` would.

huggingface_hub is imported inside functions: ``dspark --help`` must stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_convert.errors import HubNetworkError
from dspark_convert.source.hub.client import RetryPolicy, translate
from dspark_convert.util.patterns import is_commit, is_sha256
from dspark_convert.util.text import shown

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoFile


def resolve_revision(repo: str, revision: str, *, endpoint: str, policy: RetryPolicy) -> str:
    """A branch or tag -> its commit, asked from the Hub now."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError

    what = f"{repo}@{revision}"
    api = HfApi(endpoint=endpoint)
    try:
        info = policy.run(lambda: api.model_info(repo, revision=revision,
                                                 timeout=policy.timeout))
    except Exception as exc:
        if (isinstance(exc, (ValueError, TypeError, KeyError, IndexError, AttributeError))
                and not isinstance(exc, HFValidationError)):
            # Not JSON (ValueError), or JSON that ModelInfo cannot take apart.
            raise HubNetworkError(f"{what}: the Hub's answer is not a model's info "
                                  f"({type(exc).__name__})", found=type(exc).__name__) from None
        raise translate(exc, what) from None
    if not is_commit(info.sha):
        raise HubNetworkError(f"{what}: the Hub's answer has no 40-hex 'sha'",
                              expected="a 40-hex commit", found=str(info.sha)[:60])
    return info.sha


def list_files(repo: str, commit: str, *, endpoint: str, policy: RetryPolicy) -> list[RepoFile]:
    """Every file of the commit with its size, git blob SHA-1 and LFS SHA-256 (folders
    left out). Hand-written, not ``HfApi.list_repo_tree``: see the module's docstring."""
    url: str | None = f"{endpoint}/api/models/{repo}/tree/{commit}?recursive=true&expand=false"
    what = f"{repo}@{commit}"
    files: list[RepoFile] = []
    while url:
        page, url = _page(url, policy, what)
        files.extend(_repo_file(entry, what) for entry in page
                     if isinstance(entry, dict) and entry.get("type") == "file")
    return files


def _page(url: str, policy: RetryPolicy, what: str) -> tuple[list, str | None]:
    """One page of the tree listing and the next page's URL (None on the last page)."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    def request():
        response = get_session().get(url, headers=build_hf_headers(), timeout=policy.timeout)
        hf_raise_for_status(response)
        return response

    try:
        response = policy.run(request)
    except Exception as exc:
        raise translate(exc, what) from None
    try:
        page = response.json()
    except ValueError as exc:
        raise HubNetworkError(f"{what}: the Hub answered something that is not JSON ({exc})",
                              found="not JSON") from None
    if not isinstance(page, list):
        raise HubNetworkError(f"{what}: the Hub's file list is not a JSON list",
                              found=type(page).__name__)
    return page, response.links.get("next", {}).get("url")


def _repo_file(entry: dict, what: str) -> RepoFile:
    """One listing entry as huggingface_hub's RepoFile, refused unless every field we rely
    on has its type: RepoFile takes the fields apart but checks none of them."""
    from huggingface_hub.hf_api import RepoFile

    try:
        f = RepoFile(**entry)
    except (KeyError, TypeError, ValueError, AttributeError):
        f = None  # a field missing, or not the JSON type RepoFile indexes into
    # A path must be UTF-8 text: JSON lets "\ud800" through, which no file name, manifest
    # or message can carry.
    ok = (f is not None and isinstance(f.path, str) and shown(f.path) == f.path
          and _is_size(f.size) and isinstance(f.blob_id, str)
          and (f.lfs is None or (is_sha256(f.lfs.sha256) and _is_size(f.lfs.size))))
    if not ok:
        raise HubNetworkError(f"{what}: malformed file entry in the Hub's list: {str(entry)[:100]}",
                              found=str(entry)[:100])
    return f


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
