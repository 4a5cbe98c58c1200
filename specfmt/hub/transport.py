"""Carry a push plan out on the Hub: the repo, the branch, and one commit holding every file.

Everything on the wire goes through ``huggingface_hub`` (``HfApi``, ``CommitOperationAdd`` /
``Delete``). Remote weight files the folder no longer has are deleted in the same commit, so a
re-push never leaves a stale shard behind. The commit is retried on a 5xx answer or a dropped
connection; failures become one :class:`~specfmt.errors.HubError` line
(:mod:`specfmt.hub.failures`), and the token is never printed.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import dataclass, field
from typing import Callable

from ..errors import HubAuthError, HubError, HubRepoNotFoundError, HubRevisionNotFoundError, Interrupted, SpecfmtError
from .failures import cause_of, hub_failure, is_transient, is_transport, status_of
from .push import PushPlan

#: remote files a push deletes when the folder no longer has them (a stale shard would be loaded)
STALE_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt", "*.pth", "*.gguf")
#: attempts of the commit on a 5xx answer or a dropped connection, and the waits between them (s)
COMMIT_ATTEMPTS = 3
RETRY_WAITS = (1.0, 2.0)


@dataclass
class PushResult:
    """What a push did on the Hub.

    Attributes:
        repo_url: the repo's page.
        created_repo: the push created the repo.
        created_branch: the push created ``revision``.
        commit_url: the new commit (None when nothing changed since the last push).
        pr_url: the pull request opened, with ``create_pr``.
        deleted: stale remote files deleted in the commit.
        unchanged: True when every file was already on the Hub (no commit made).
    """

    repo_url: str
    created_repo: bool = False
    created_branch: bool = False
    commit_url: str | None = None
    pr_url: str | None = None
    deleted: list[str] = field(default_factory=list)
    unchanged: bool = False


def stale_files(plan: PushPlan, remote: list[str]) -> list[str]:
    """Remote weight files (:data:`STALE_PATTERNS`) the plan does not upload: the commit deletes them."""
    ours = {f.path_in_repo for f in plan.files}
    return sorted(p for p in remote if p not in ours and any(fnmatch.fnmatch(p, pat) for pat in STALE_PATTERNS))


def preview_remote(plan: PushPlan) -> list[str]:
    """For ``--dry-run``: what the push would find on the Hub, read-only; a failure to look is reported, not raised."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi()
    branch = plan.revision or "main"
    try:
        info = api.repo_info(plan.repo_id)
    except RepositoryNotFoundError:
        return [f"repo: {plan.repo_id} does not exist (or is not visible); the push " +
                ("refuses --create-pr on it" if plan.create_pr else f"creates it{' private' if plan.private else ''}")]
    except Exception as e:
        return [f"repo: not checked ({hub_failure(e, plan.repo_id, 'reading the repo').message})"]
    lines = [f"repo: {plan.repo_id} exists ({'private' if info.private else 'public'})"]
    if plan.private and not info.private:
        lines.append("repo: the push refuses --private on this public repo")
    try:
        remote = api.list_repo_files(plan.repo_id, revision=branch)
    except RevisionNotFoundError:
        lines.append(f"branch: {branch} does not exist; the push creates it from main")
        remote = api.list_repo_files(plan.repo_id)
    except Exception as e:
        return lines + [f"files: not checked ({hub_failure(e, plan.repo_id, 'listing the files').message})"]
    lines += [f"delete: {p} (a weight file this folder does not have)" for p in stale_files(plan, remote)]
    return lines


def _outcome(api, repo_id: str, branch: str, head: str) -> str:
    """After a failed commit, look whether the branch moved: a dropped answer may hide a commit that landed."""
    try:
        now = api.repo_info(repo_id, revision=branch).sha
    except Exception:
        return f"could not check whether a commit landed on {branch}"
    return f"no commit was made ({branch} is still at {head[:8]})" if now == head else f"{branch} moved to {now[:8]} meanwhile: check the repo"


def _token(repo_id: str | None = None) -> str:
    """The token of ``HF_TOKEN`` or the stored login.

    Raises:
        HubAuthError: there is none.
    """
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise HubAuthError("no Hugging Face token: a push needs one with write access", hint="run `hf auth login`, or set HF_TOKEN", repo_id=repo_id)
    return token


def _operations(plan: PushPlan, delete: list[str]) -> list:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    ops: list = [CommitOperationAdd(path_in_repo=f.path_in_repo, path_or_fileobj=str(f.local) if f.local else f.content) for f in plan.files]
    return ops + [CommitOperationDelete(path_in_repo=p) for p in delete]


def push(plan: PushPlan, *, log: Callable[[str], None] = lambda s: None) -> PushResult:
    """Carry out a :class:`PushPlan` on the Hub (``HF_ENDPOINT``), as one commit.

    The token comes from ``HF_TOKEN`` or the stored login and is never printed. The commit is
    retried (:data:`COMMIT_ATTEMPTS` times in all) on a 5xx answer or a dropped connection;
    files the Hub already holds are not sent again. With ``create_pr`` a dropped connection
    is not retried, since a lost answer would open a second pull request.

    Returns:
        A :class:`PushResult`.

    Raises:
        HubAuthError: no token; 401. HubPermissionError: 403. HubRepoNotFoundError: the repo missing
            where it must exist (a pull request on a repo that does not exist). HubRevisionNotFoundError:
            a ``refs/...`` revision that does not exist. HubUnavailableError: 5xx or a dropped connection
            after the retries. HubError: a repo that exists public although ``private`` was asked; any
            other failure (:func:`specfmt.hub.failures.hub_failure`). Nothing is committed then.
    """
    from huggingface_hub import HfApi

    api = HfApi(token=_token(plan.repo_id))
    result = PushResult(repo_url=f"{api.endpoint}/{plan.repo_id}")
    branch = plan.revision or "main"
    sending = False
    try:
        _ensure_repo(api, plan, result, log)
        head = _ensure_branch(api, plan, branch, result, log)
        result.deleted = stale_files(plan, _call(plan, "listing the repo's files", api.list_repo_files, plan.repo_id, revision=branch))
        for p in result.deleted:
            log(f"deleting {p} (a weight file this folder does not have)")
        sending = True
        commit = _commit(api, plan, result.deleted, branch, head, log)
    except KeyboardInterrupt:  # Ctrl-C: the one line says what the Hub holds now (specfmt.interrupt)
        done = [what for what, made in ((f"created the repo {plan.repo_id}", result.created_repo), (f"created the branch {branch}", result.created_branch)) if made]
        what = ("; ".join(done) or "changed nothing on the Hub") + ("; the commit was being sent: the Hub has it whole or not at all" if sending else "")
        raise Interrupted(f"interrupted; the push {what}", where=plan.repo_id,
                          hint="run the same command again (files the Hub holds are not sent again)") from None
    result.commit_url = commit.commit_url
    result.pr_url = commit.pr_url
    result.unchanged = commit.oid == head and not plan.create_pr
    return result


def _call(plan: PushPlan, stage: str, fn: Callable, *a, **kw):
    """``fn(*a, **kw)``, its failure as one :class:`~specfmt.errors.HubError` line (:func:`~specfmt.hub.failures.hub_failure`)."""
    try:
        return fn(*a, **kw)
    except SpecfmtError:
        raise
    except Exception as e:  # huggingface_hub and httpx raise many classes; each becomes one line
        raise hub_failure(e, plan.repo_id, stage, revision=plan.revision) from None


def _ensure_repo(api, plan: PushPlan, result: PushResult, log: Callable[[str], None]) -> None:
    """The repo exists afterwards (created, private if asked, when missing).

    Raises:
        HubRepoNotFoundError: missing, and ``create_pr`` (a pull request needs the repo).
        HubError: it exists public and ``private`` was asked; or reading or creating it failed.
    """
    from huggingface_hub.errors import RepositoryNotFoundError

    repo_id = plan.repo_id
    try:
        info = api.repo_info(repo_id)
    except RepositoryNotFoundError:
        info = None
    except Exception as e:
        raise hub_failure(e, repo_id, "reading the repo", revision=plan.revision) from None
    if info is None:
        if plan.create_pr:
            raise HubRepoNotFoundError(f"{repo_id} does not exist, so no pull request can be opened on it", hint="drop --create-pr to create the repo with this push",
                                       repo_id=repo_id, revision=plan.revision)
        _call(plan, "creating the repo", api.create_repo, repo_id, private=plan.private, exist_ok=False)
        result.created_repo = True
        log(f"created {'private ' if plan.private else ''}repo {repo_id}")
    elif plan.private and not info.private:
        raise HubError(f"{repo_id} exists and is public; --private would publish this draft publicly", hint="make the repo private on the Hub first, or drop --private",
                       repo_id=repo_id, revision=plan.revision)


def _ensure_branch(api, plan: PushPlan, branch: str, result: PushResult, log: Callable[[str], None]) -> str:
    """The commit id ``branch`` is at, creating the branch from ``main`` when missing.

    Raises:
        HubRevisionNotFoundError: a missing ``refs/...`` revision (a pull request's ref is not created).
        HubError: reading or creating the branch failed.
    """
    from huggingface_hub.errors import RevisionNotFoundError

    repo_id = plan.repo_id
    try:
        return api.repo_info(repo_id, revision=branch).sha
    except RevisionNotFoundError:
        if branch.startswith("refs/"):
            raise HubRevisionNotFoundError(f"{branch} does not exist in {repo_id}", hint="check --revision (a pull request's ref is refs/pr/N)",
                                           repo_id=repo_id, revision=branch) from None
        _call(plan, "creating the branch", api.create_branch, repo_id, branch=branch)
        result.created_branch = True
        log(f"created branch {branch} from main")
        return _call(plan, "reading the branch", api.repo_info, repo_id, revision=branch).sha
    except Exception as e:
        raise hub_failure(e, repo_id, "reading the branch", revision=plan.revision) from None


def _commit(api, plan: PushPlan, delete: list[str], branch: str, head: str, log: Callable[[str], None]):
    """``create_commit`` of every file (and the deletions), retried on a transient failure (:data:`COMMIT_ATTEMPTS`,
    :data:`RETRY_WAITS`; with ``create_pr`` not on a dropped connection, which may hide a pull request opened).

    Raises:
        HubUnavailableError: still failing after the attempts. HubError: any other failure.
    """
    attempts = 0
    while True:
        attempts += 1
        try:
            return api.create_commit(plan.repo_id, _operations(plan, delete), commit_message=plan.commit_message,
                                     revision=plan.revision, create_pr=plan.create_pr)
        except Exception as e:
            cause = cause_of(e)
            retry = is_transient(cause) and not (plan.create_pr and is_transport(cause)) and attempts < COMMIT_ATTEMPTS
            if not retry:
                raise hub_failure(e, plan.repo_id, "uploading the commit", attempts, _outcome(api, plan.repo_id, branch, head),
                                  revision=plan.revision) from None
            wait = RETRY_WAITS[min(attempts - 1, len(RETRY_WAITS) - 1)]
            log(f"the Hub failed ({status_of(cause) or type(cause).__name__}); retrying in {wait:.0f} s")
            time.sleep(wait)


__all__ = ["COMMIT_ATTEMPTS", "PushResult", "preview_remote", "push", "stale_files"]
