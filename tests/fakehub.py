"""A local stand-in for the part of the Hugging Face Hub HTTP API that ``huggingface_hub``
uses to create a repository, upload one commit (regular and LFS files) and download it back.

Written against huggingface_hub 2.4.0 (request shapes read from ``hf_api.py``,
``_commit_api.py`` and ``lfs.py``). Point ``HF_ENDPOINT`` at :attr:`FakeHub.url` and set
``HF_HUB_DISABLE_XET=1``: with ``hf_xet`` installed the client uploads LFS content through
the Xet protocol, which this server does not speak.

Endpoints:

* ``GET /api/whoami-v2``;
* ``POST /api/repos/create`` (the new repo gets an initial commit with ``.gitattributes``,
  as on the Hub);
* ``GET /api/models/{repo}[/revision/{rev}]`` (model info with ``sha``, ``private``, ``siblings``);
* ``GET /api/models/{repo}/tree/{rev}``;
* ``POST /api/models/{repo}/branch/{branch}``;
* ``POST /api/validate-yaml`` (the card's front matter must be a YAML mapping);
* ``POST /api/models/{repo}/preupload/{rev}`` (``.safetensors``/``.bin`` files and files over
  10 MB are LFS, the rest regular; ``oid`` of the file already there, so unchanged files are
  skipped by the client);
* ``POST /{repo}.git/info/lfs/objects/batch`` and ``PUT /lfs/{oid}`` (basic transfer);
* ``POST /api/models/{repo}/commit/{rev}[?create_pr=1]`` (ndjson: header, file, lfsFile,
  deletedFile); a pull request is a ``refs/pr/N`` ref;
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``.

Access: ``tokens`` maps a token to a user name. A user may write only in its own namespace;
a private repo is invisible (404) to anyone else; a gated repo's files are refused (403, ``GatedRepo``)
to anyone else. Requests without a valid token are 401
except downloads of public repos and LFS PUTs (pre-signed on the Hub).

Failure injection: :meth:`FakeHub.fail` makes the next matching request(s) answer an error
status or drop the connection part-way through reading the request body.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n"


def git_oid(data: bytes) -> str:
    """The git blob sha1 of a regular file (what the Hub reports as a regular file's oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    owner: str
    private: bool = False
    commits: dict[str, dict] = field(default_factory=dict)  # oid -> {"summary", "files": {path: bytes | ("lfs", sha256)}, "parent"}
    refs: dict[str, str] = field(default_factory=dict)  # "main", other branches, "refs/pr/N" -> commit oid
    gated: bool = False  # its files are refused (403, GatedRepo) to everyone but the owner

    def resolve(self, rev: str) -> str | None:
        """A branch, PR ref or commit oid -> commit oid (None if unknown)."""
        return self.refs.get(rev) or (rev if rev in self.commits else None)

    def files(self, rev: str = "main") -> dict:
        oid = self.resolve(rev)
        return self.commits[oid]["files"] if oid else {}

    def history(self, ref: str = "main") -> list[str]:
        """Commit summaries on ``ref``, newest first."""
        out, oid = [], self.refs.get(ref)
        while oid:
            out.append(self.commits[oid]["summary"])
            oid = self.commits[oid]["parent"]
        return out


@dataclass
class Failure:
    method: str
    path_part: str
    status: int | None  # None: drop the connection
    times: int


class FakeHub:
    """``with FakeHub(tokens={"hf_me": "me"}) as hub: ...``; ``hub.repos`` holds what was pushed,
    ``hub.lfs`` the LFS objects uploaded (also those no commit references), ``hub.log`` every request."""

    def __init__(self, tokens: dict[str, str] | None = None):
        self.tokens = dict(tokens or {})
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.failures: list[Failure] = []
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def body(self) -> bytes:
                """The request body (read once, before routing, so every answer leaves the connection clean)."""
                return self._data

            def send(self, status: int, obj=None, headers: dict | None = None, raw: bytes | None = None, head: bool = False):
                data = raw if raw is not None else (json.dumps(obj).encode() if obj is not None else b"")
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def error(self, status: int, message: str, code: str | None = None):
                headers = {"X-Error-Message": message}
                if code:
                    headers["X-Error-Code"] = code
                self.send(status, {"error": message}, headers, head=self.command == "HEAD")  # a HEAD answer has no body

            def user(self) -> str | None:
                auth = self.headers.get("Authorization") or ""
                return hub.tokens.get(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else None

            def handle_any(self, method: str):
                url = urlparse(self.path)
                segs = [unquote(s) for s in url.path.strip("/").split("/")]
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                with hub._lock:
                    hub.log.append((method, url.path))
                    failure = next((f for f in hub.failures if f.method == method and f.path_part in url.path), None)
                    if failure:
                        failure.times -= 1
                        if failure.times <= 0:
                            hub.failures.remove(failure)
                if failure and failure.status is None:  # drop the connection part-way through the body
                    n = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(min(n, max(1, n // 2)))
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                n = int(self.headers.get("Content-Length") or 0)
                self._data = self.rfile.read(n) if n else b""
                if failure:
                    return self.error(failure.status, f"injected {failure.status}")
                with hub._lock:
                    return hub.route(self, method, segs, query)

            def do_GET(self):
                self.handle_any("GET")

            def do_HEAD(self):
                self.handle_any("HEAD")

            def do_POST(self):
                self.handle_any("POST")

            def do_PUT(self):
                self.handle_any("PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the server down (later requests get 'connection refused')."""
        self._server.shutdown()
        self._server.server_close()

    def fail(self, method: str, path_part: str, status: int | None, times: int = 1) -> None:
        """Make the next ``times`` requests whose path contains ``path_part`` answer ``status``,
        or, with ``status=None``, drop the connection after reading half of the request body."""
        self.failures.append(Failure(method, path_part, status, times))

    def requests(self, method: str, path_part: str) -> int:
        """How many requests matched so far."""
        return sum(m == method and path_part in p for m, p in self.log)

    # ------------------------------------------------------------------ routing
    def _commit(self, repo: Repo, files: dict, summary: str, parent: str | None) -> str:
        oid = hashlib.sha1(json.dumps([parent, summary, sorted(files), len(repo.commits)]).encode()).hexdigest()
        repo.commits[oid] = {"summary": summary, "files": files, "parent": parent}
        return oid

    def create(self, repo_id: str, private: bool = False) -> Repo:
        """Create a repository directly (as the Hub does: one initial commit with ``.gitattributes``)."""
        repo = self.repos[repo_id] = Repo(owner=repo_id.split("/")[0], private=private)
        repo.refs["main"] = self._commit(repo, {".gitattributes": GITATTRIBUTES}, "initial commit", None)
        return repo

    def seed(self, repo_id: str, files: dict[str, bytes], *, private: bool = False, gated: bool = False, summary: str = "seed") -> Repo:
        """Create ``repo_id`` (if needed) and commit ``files`` to main directly (``.safetensors``/``.bin`` as LFS);
        ``gated``: its files are refused to everyone but its owner, as the Hub refuses a gated repo's files to a
        user who has not accepted its terms."""
        repo = self.repos.get(repo_id) or self.create(repo_id, private=private)
        repo.gated = gated
        new = dict(repo.files())
        for path, data in files.items():
            if path.endswith((".safetensors", ".bin")):
                oid = hashlib.sha256(data).hexdigest()
                self.lfs[oid] = data
                new[path] = ("lfs", oid)
            else:
                new[path] = data
        repo.refs["main"] = self._commit(repo, new, summary, repo.refs["main"])
        return repo

    def route(self, h, method: str, segs: list[str], query: dict):
        user = h.user()
        if h.headers.get("Authorization") and user is None and not (method == "PUT" and segs[0] == "lfs"):
            return h.error(401, "Invalid credentials in Authorization header")
        if method == "GET" and segs == ["api", "whoami-v2"]:
            if user is None:
                return h.error(401, "Invalid credentials in Authorization header")
            return h.send(200, {"type": "user", "name": user, "auth": {"accessToken": {"role": "write"}}})
        if method == "POST" and segs == ["api", "repos", "create"]:
            if user is None:
                return h.error(401, "Invalid credentials in Authorization header")
            body = json.loads(h.body() or b"{}")
            owner = body.get("organization") or user
            repo_id = f"{owner}/{body['name']}"
            if owner != user:
                return h.error(403, f'You don\'t have the rights to create a model under the namespace "{owner}"')
            if repo_id in self.repos:
                return h.send(409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"})
            self.create(repo_id, private=bool(body.get("private")) or body.get("visibility") == "private")
            return h.send(200, {"url": f"{self.url}/{repo_id}", "name": repo_id})
        if method == "POST" and segs == ["api", "validate-yaml"]:
            import yaml

            content = json.loads(h.body())["content"]
            try:
                meta = yaml.safe_load(content.split("---")[1]) if content.startswith("---") else {}
            except (yaml.YAMLError, IndexError) as e:
                return h.send(400, {"errors": [{"message": f"invalid YAML: {e}"}]})
            if not isinstance(meta, dict):
                return h.send(400, {"errors": [{"message": "metadata must be a mapping"}]})
            return h.send(200, {"errors": [], "warnings": []})
        if segs[:2] == ["api", "models"] and len(segs) >= 4:
            return self._api_model(h, method, "/".join(segs[2:4]), segs[4:], query, user)
        if method == "POST" and len(segs) == 6 and segs[1].endswith(".git") and segs[2:] == ["info", "lfs", "objects", "batch"]:
            repo_id = f"{segs[0]}/{segs[1][:-4]}"
            if (denied := self._deny_write(h, repo_id, user)) is not None:
                return denied
            objects = []
            for o in json.loads(h.body())["objects"]:
                entry = {"oid": o["oid"], "size": o["size"]}
                if o["oid"] not in self.lfs:
                    entry["actions"] = {"upload": {"href": f"{self.url}/lfs/{o['oid']}"}}
                objects.append(entry)
            return h.send(200, {"transfer": "basic", "objects": objects})
        if method == "PUT" and len(segs) == 2 and segs[0] == "lfs":
            data = h.body()
            if hashlib.sha256(data).hexdigest() != segs[1]:
                return h.error(400, "sha256 mismatch")
            self.lfs[segs[1]] = data
            return h.send(200, {})
        if method in ("GET", "HEAD") and len(segs) >= 5 and segs[2] == "resolve":
            repo_id = "/".join(segs[:2])
            repo = self._visible(repo_id, user)
            if repo is None:
                return h.error(404, "Repository not found", "RepoNotFound")
            # the client quotes a revision with slashes (refs/pr/1) as one segment
            oid = repo.resolve(segs[3])
            if oid is None:
                return h.error(404, f"Invalid rev id: {segs[3]}", "RevisionNotFound")
            name = "/".join(segs[4:])
            if repo.gated and user != repo.owner:
                return h.error(403, f"Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it.", "GatedRepo")
            f = repo.commits[oid]["files"].get(name)
            if f is None:
                return h.error(404, "Entry not found", "EntryNotFound")
            data = self.lfs[f[1]] if isinstance(f, tuple) else f
            etag = f[1] if isinstance(f, tuple) else git_oid(data)
            headers = {"X-Repo-Commit": oid, "ETag": f'"{etag}"'}
            if isinstance(f, tuple):
                headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
            return h.send(200, raw=data, headers=headers, head=method == "HEAD")
        return h.error(404, f"no route for {method} /{'/'.join(segs)}")

    def _visible(self, repo_id: str, user: str | None) -> Repo | None:
        repo = self.repos.get(repo_id)
        return None if repo is None or (repo.private and user != repo.owner) else repo

    def _deny_write(self, h, repo_id: str, user: str | None):
        if user is None:
            return h.error(401, "Invalid credentials in Authorization header")
        if self._visible(repo_id, user) is None:
            return h.error(404, "Repository not found", "RepoNotFound")
        if self.repos[repo_id].owner != user:
            return h.error(403, f"You don't have write access to {repo_id}")
        return None

    def _api_model(self, h, method: str, repo_id: str, rest: list[str], query: dict, user: str | None):
        repo = self._visible(repo_id, user)
        if repo is None:
            return h.error(404, "Repository not found", "RepoNotFound")
        if method == "GET" and (not rest or rest[0] == "revision"):
            oid = repo.resolve(rest[1] if len(rest) > 1 else "main")
            if oid is None:
                return h.error(404, f"Invalid rev id: {rest[1]}", "RevisionNotFound")
            return h.send(200, {"id": repo_id, "modelId": repo_id, "sha": oid, "private": repo.private,
                                "siblings": [{"rfilename": p} for p in sorted(repo.commits[oid]["files"])]})
        if method == "GET" and rest[0] == "tree":
            oid = repo.resolve(rest[1] if len(rest) > 1 else "main")
            if oid is None:
                return h.error(404, f"Invalid rev id: {rest[1]}", "RevisionNotFound")
            return h.send(200, [self._entry(repo.commits[oid]["files"][p], p) for p in sorted(repo.commits[oid]["files"])])
        if method != "POST" or len(rest) < 2:
            return h.error(404, f"no route for {method} {'/'.join(rest)}")
        if (denied := self._deny_write(h, repo_id, user)) is not None:
            return denied
        if rest[0] == "branch":
            if rest[1] in repo.refs:
                return h.error(409, "Reference already exists")
            repo.refs[rest[1]] = repo.refs["main"]
            return h.send(200, {})
        base = repo.resolve(rest[1])
        if base is None:
            return h.error(404, f"Invalid rev id: {rest[1]}", "RevisionNotFound")
        if rest[0] == "preupload":
            current = repo.commits[base]["files"]
            files = []
            for f in json.loads(h.body())["files"]:
                lfs = f["path"].endswith((".safetensors", ".bin")) or f["size"] > 10_000_000
                old = current.get(f["path"])
                oid = None if old is None else old[1] if isinstance(old, tuple) else git_oid(old)
                files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
            return h.send(200, {"files": files, "commitOid": base})
        if rest[0] == "commit":
            return self._commit_endpoint(h, repo_id, repo, rest[1], base, h.body(), create_pr=query.get("create_pr") == "1")
        return h.error(404, f"no route for {method} {'/'.join(rest)}")

    def _entry(self, f, p: str) -> dict:
        data = self.lfs[f[1]] if isinstance(f, tuple) else f
        e = {"type": "file", "path": p, "size": len(data), "oid": git_oid(data)}
        if isinstance(f, tuple):
            e["lfs"] = {"oid": f[1], "size": len(data), "pointerSize": 130}
        return e

    def _commit_endpoint(self, h, repo_id: str, repo: Repo, ref: str, base: str, body: bytes, create_pr: bool):
        files = dict(repo.commits[base]["files"])
        summary = ""
        for line in body.decode().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            v = item["value"]
            if item["key"] == "header":
                summary = v.get("summary", "")
            elif item["key"] == "file":
                files[v["path"]] = base64.b64decode(v["content"])
            elif item["key"] == "lfsFile":
                if v["oid"] not in self.lfs:
                    return h.error(422, f"LFS object {v['oid']} was never uploaded")
                files[v["path"]] = ("lfs", v["oid"])
            elif item["key"] == "deletedFile":
                if v["path"] not in files:
                    return h.error(404, f"A file with this name doesn't exist: {v['path']}", "EntryNotFound")
                files.pop(v["path"])
        oid = self._commit(repo, files, summary, base)
        out = {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "success": True}
        if create_pr:
            n = 1 + sum(r.startswith("refs/pr/") for r in repo.refs)
            repo.refs[f"refs/pr/{n}"] = oid
            out["pullRequestUrl"] = f"{self.url}/{repo_id}/discussions/{n}"
        else:
            repo.refs[ref] = oid
        return h.send(200, out)
