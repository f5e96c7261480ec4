"""A loopback Hugging Face Hub for tests: the endpoints the real huggingface_hub client
and hub.py use (docs/REFERENCE.md §4: revision, tree, resolve HEAD/GET with LFS redirects),
over stdlib http.server in a thread, with fault injection.

Repos are directories of files (or dicts of bytes) filed as commits; branches and tags
are refs that tests can move. ``*.safetensors`` files are served as LFS: the resolve
endpoint answers 302 to a second "CDN" server (another origin, as on the real Hub) with
``X-Linked-Etag`` (the SHA-256) and ``X-Linked-Size``; other files are plain git blobs
whose ETag is their git blob SHA-1.

Faults (set attributes on ``server.faults``):
    corrupt     paths whose bytes get one byte flipped in flight (same size)
    truncate    path -> n: serve only the first n bytes (a complete, short response)
    drop        path -> n: announce the full length, close the connection after n bytes
                (once per path; the client resumes with a Range request)
    serve_commit  answer X-Repo-Commit with this commit instead of the one asked for
    status      kind ("api", "resolve", "cdn") -> (HTTP status, count or None = forever)
    throttle    seconds to sleep per 4 KiB chunk of file data
    page_size   serve the tree listing in pages of this many entries, each linked to the
                next by a ``Link: <...>; rel="next"`` header (as the Hub pages it)
    answer      API kind ("revision", "tree") -> the JSON value to answer instead

The git blob SHA-1 and the SHA-256 are computed here with hashlib directly, not with the
package's hashing code: the server is the oracle the client is checked against.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 4096


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(path: str) -> bool:
    return path.endswith(".safetensors")


@dataclass
class Faults:
    corrupt: set[str] = field(default_factory=set)
    truncate: dict[str, int] = field(default_factory=dict)
    drop: dict[str, int] = field(default_factory=dict)
    serve_commit: str | None = None
    status: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    throttle: float = 0.0
    page_size: int | None = None
    answer: dict[str, object] = field(default_factory=dict)


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


class HubServer:
    """``with HubServer() as hub: hub.add_directory("org/name", path)``; ``hub.url`` is
    the HF_ENDPOINT."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.faults = Faults()
        self.log: list[tuple[str, str, str]] = []   # (role, method, path)
        self.download_started = threading.Event()
        self._lock = threading.Lock()
        self._api = _Server(self, "api")
        self._cdn = _Server(self, "cdn")
        self._threads: list[threading.Thread] = []

    # -- content ------------------------------------------------------------------------
    def add_commit(self, repo: str, files: dict[str, bytes], *, refs=("main",),
                   commit: str | None = None) -> str:
        """File ``files`` as a commit of ``repo``; its id is derived from them unless given
        (a document's pinned commit, served as it is written)."""
        state = self.repos.setdefault(repo, Repo())
        listing = "".join(f"{p} {git_blob_sha1(d)}\n" for p, d in sorted(files.items()))
        commit = commit or hashlib.sha1(f"{repo}\n{len(state.commits)}\n{listing}".encode()).hexdigest()
        state.commits[commit] = dict(files)
        for ref in refs:
            state.refs[ref] = commit
        return commit

    def add_directory(self, repo: str, directory: Path, *, extra: dict[str, bytes] | None = None,
                      drop: tuple[str, ...] = (), refs=("main",), commit: str | None = None) -> str:
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        files.update(extra or {})
        for name in drop:
            files.pop(name)
        return self.add_commit(repo, files, refs=refs, commit=commit)

    def set_ref(self, repo: str, ref: str, commit: str) -> None:
        self.repos[repo].refs[ref] = commit

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._api.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def __enter__(self) -> "HubServer":
        for server in (self._api, self._cdn):
            thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for server in (self._api, self._cdn):
            server.shutdown()
            server.server_close()

    def requests(self, role: str | None = None) -> list[tuple[str, str, str]]:
        return [r for r in self.log if role is None or r[0] == role]

    def forced_status(self, kind: str) -> int | None:
        """The status a fault forces on the next request of this kind (and count it)."""
        with self._lock:
            if kind not in self.faults.status:
                return None
            code, count = self.faults.status[kind]
            if count is not None:
                if count <= 0:
                    del self.faults.status[kind]
                    return None
                self.faults.status[kind] = (code, count - 1)
            return code

    def blob(self, sha256: str) -> tuple[str, bytes] | None:
        for state in self.repos.values():
            for files in state.commits.values():
                for path, data in files.items():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return path, data
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, hub: HubServer, role: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self.role = role


API_RE = re.compile(r"^/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?$")
RESOLVE_RE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
CDN_RE = re.compile(r"^/cdn/([0-9a-f]{64})$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # keep test output clean
        pass

    # -- plumbing -----------------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              *, length: int | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, value, status: int = 200) -> None:
        self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _error(self, status: int, code: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": code,
                                  "Content-Type": "application/json", **(extra or {})})

    def _lookup(self, repo: str, rev: str) -> tuple[Repo | None, str | None]:
        state = self.server.hub.repos.get(repo)
        if state is None:
            return None, None
        if rev in state.commits:
            return state, rev
        return state, state.refs.get(rev)

    def do_HEAD(self):
        self._route()

    def do_GET(self):
        self._route()

    def _route(self) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        path = url.path
        hub.log.append((self.server.role, self.command, self.path))
        if self.server.role == "cdn":
            match = CDN_RE.match(path)
            if not match:
                return self._error(404, "EntryNotFound")
            return self._cdn(match.group(1))
        if match := API_RE.match(path):
            forced = hub.forced_status("api")
            if forced:
                return self._error(forced, "ServerError")
            return self._api(unquote(match.group(1)), match.group(2), unquote(match.group(3)),
                             parse_qs(url.query))
        if match := RESOLVE_RE.match(path):
            forced = hub.forced_status("resolve")
            if forced:
                return self._error(forced, "ServerError")
            return self._resolve(unquote(match.group(1)), unquote(match.group(2)),
                                 unquote(match.group(3)))
        self._error(404, "NotFound")

    # -- endpoints ----------------------------------------------------------------------
    def _api(self, repo: str, kind: str, rev: str, query: dict[str, list[str]]) -> None:
        hub = self.server.hub
        if kind in hub.faults.answer:
            return self._json(hub.faults.answer[kind])
        state, commit = self._lookup(repo, rev)
        if state is None:
            return self._error(401, "RepoNotFound")
        if commit is None:
            return self._error(404, "RevisionNotFound")
        files = state.commits[commit]
        if kind == "revision":
            return self._json({"id": repo, "sha": commit,
                               "siblings": [{"rfilename": p} for p in sorted(files)]})
        entries = [_entry(p, d) for p, d in sorted(files.items())]
        size = hub.faults.page_size
        if size is None:
            return self._json(entries)
        start = int(query.get("cursor", ["0"])[0])
        headers = {"Content-Type": "application/json"}
        if start + size < len(entries):
            base = urlsplit(self.path)._replace(query=f"recursive=true&expand=false&cursor={start + size}")
            headers["Link"] = f'<{hub.url}{base.geturl()}>; rel="next"'
        self._send(200, json.dumps(entries[start:start + size]).encode(), headers)

    def _resolve(self, repo: str, rev: str, file: str) -> None:
        hub = self.server.hub
        state, commit = self._lookup(repo, rev)
        if state is None:
            return self._error(401, "RepoNotFound")
        if commit is None:
            return self._error(404, "RevisionNotFound")
        served = hub.faults.serve_commit or commit
        files = state.commits[commit]
        if file not in files:
            return self._error(404, "EntryNotFound", {"X-Repo-Commit": served})
        data = files[file]
        headers = {"X-Repo-Commit": served, "Accept-Ranges": "bytes"}
        if is_lfs(file):
            sha = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{git_blob_sha1(data)}"', "X-Linked-Etag": f'"{sha}"',
                            "X-Linked-Size": str(len(data)),
                            "Location": f"{hub.cdn_url}/cdn/{sha}"})
            return self._send(302, b"", headers)
        headers["ETag"] = f'"{git_blob_sha1(data)}"'
        if self.command == "HEAD":
            return self._send(200, b"", headers, length=len(data))
        self._file(file, data, headers)

    def _cdn(self, sha256: str) -> None:
        hub = self.server.hub
        forced = hub.forced_status("cdn")
        if forced:
            return self._error(forced, "ServerError")
        found = hub.blob(sha256)
        if found is None:
            return self._error(404, "EntryNotFound")
        self._file(found[0], found[1], {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes"})

    def _file(self, path: str, data: bytes, headers: dict[str, str]) -> None:
        """File bytes, with Range support and the faults that apply to ``path``."""
        hub = self.server.hub
        faults = hub.faults
        if self.command == "GET":
            hub.download_started.set()
        if path in faults.corrupt:
            middle = len(data) // 2
            data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
        start = 0
        match = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
        if match:
            start = int(match.group(1))
        body = data[start:]
        status = 206 if match else 200
        if match:
            headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        if path in faults.truncate:
            body = body[:faults.truncate[path]]
        drop = faults.drop.pop(path, None)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        limit = len(body) if drop is None else drop
        for offset in range(0, limit, CHUNK):
            if faults.throttle:
                time.sleep(faults.throttle)
            try:
                self.wfile.write(body[offset:min(offset + CHUNK, limit)])
                self.wfile.flush()
            except OSError:
                return
        if drop is not None:
            self.close_connection = True


def _entry(path: str, data: bytes) -> dict:
    entry = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": path}
    if is_lfs(path):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "pointerSize": 134}
    return entry
