"""Weights from the Hugging Face hub: one access rule for every loader, and what was loaded.

The loaders themselves are timm's (``timm.create_model(..., pretrained=True)``, ``hf-hub:org/name``)
and transformers' (``from_pretrained(repo_id, revision=...)``); they resolve, download and cache
through ``huggingface_hub`` and honour ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_TOKEN`` and
``HF_HUB_OFFLINE``. This module adds only what vitdeploy needs around them:

- **Bounded time without a network.** ``huggingface_hub`` retries a failed HEAD request five times
  with back-off (timm asks for two files: a DNS failure took 48 s here, a hub that accepts
  connections and never answers 13 minutes; bench/bench_hub_refusal.py) and prints a warning per retry. Before a loader runs, one ``HfApi.model_info`` call (no retries,
  ``HF_HUB_ETAG_TIMEOUT`` seconds at most) asks the hub for the repository: it names a missing,
  gated or private repository or an unknown revision in one line, and gives the commit that the
  loader is then pinned to (the identity cannot move between the question and the download). When
  the hub cannot be reached, the loader runs in offline mode, so a cached model loads at once and an
  uncached one is refused at once.
- **Identity.** The file a loader read is found in the cache's ``snapshots/<commit>/`` folder for
  the pinned revision (``try_to_load_from_cache``) and hashed: repository, commit, file, sha256.
- **One line.** Every failure of the hub or of the cache becomes one UserError that names the
  repository and what to do.

Offline mode for one block is set through ``huggingface_hub.constants.HF_HUB_OFFLINE``, which the
library reads at every request (``constants.is_offline_mode()``; huggingface_hub 2.x
``utils/_http.py`` refuses any request while it is set) and which is documented as the switch
behind the ``HF_HUB_OFFLINE`` variable (https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from vitdeploy.errors import UserError
from vitdeploy.fileio import sha256_file

COMMIT = re.compile(r"^[0-9a-f]{40}$")
# the hub's repo id rule (huggingface_hub.utils.validate_repo_id): namespace/name, letters, digits, - _ .
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def split_revision(text: str) -> tuple[str, str | None]:
    """'org/name@v1.0' -> ('org/name', 'v1.0'); no '@' -> (text, None)."""
    name, sep, revision = text.partition("@")
    if sep and not revision:
        raise UserError(f"{text!r} ends with '@' but names no revision; give a branch, tag or commit after it")
    return name, (revision or None)


def is_repo_id(text: str) -> bool:
    return bool(REPO_ID.match(text)) and ".." not in text


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub read it."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


@contextlib.contextmanager
def forced_offline() -> Iterator[None]:
    """Offline mode for the loaders called inside the block (see the module doc)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No retry warnings or progress bars from huggingface_hub/transformers: a command prints its own lines."""
    from huggingface_hub.utils import logging as hub_logging
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    level = hub_logging.get_verbosity()
    bars_off = are_progress_bars_disabled()
    hub_logging.set_verbosity_error()
    disable_progress_bars()
    try:
        with _quiet_transformers():
            yield
    finally:
        hub_logging.set_verbosity(level)
        if not bars_off:
            enable_progress_bars()


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    try:
        from transformers.utils import logging as tf_logging
    except ImportError:  # timm-only installs
        yield
        return
    level = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        yield
    finally:
        tf_logging.set_verbosity(level)


@dataclass
class HubAccess:
    """How one repository is reached for this load."""

    repo_id: str
    requested: str | None  # the revision asked for (None: the default branch)
    revision: str | None  # the commit the loaders are pinned to, when known before loading
    mode: str  # "online" | "offline" (HF_HUB_OFFLINE) | "cached" (pinned commit in the cache) | "unreachable"
    reason: str = ""  # why the hub is not used (unreachable: the connection error)

    @property
    def pin(self) -> str | None:
        """The revision the loaders are given: the commit when known, else what was asked for (None: main)."""
        return self.revision or self.requested

    @property
    def uses_network(self) -> bool:
        return self.mode == "online"

    def note(self) -> str | None:
        """What a command says after loading from the cache because the hub could not be reached."""
        if self.mode != "unreachable":
            return None
        return f"the Hugging Face hub cannot be reached ({self.reason}): loaded {self.repo_id} from the cache {cache_dir()}"

    def loading(self) -> contextlib.AbstractContextManager:
        """The block in which the loader runs: offline unless the hub answered."""
        return contextlib.nullcontext() if self.uses_network else forced_offline()


def open_repo(repo_id: str, revision: str | None, what: str, expect: Sequence[str] = ()) -> HubAccess:
    """Decide how the loaders reach ``repo_id@revision`` (see the module doc); one line on a refusal.

    ``expect``: files that, when all cached under a commit ``revision``, make the network unnecessary
    (re-loading a bundle's recorded revision).
    """
    if offline():
        return HubAccess(repo_id, revision, revision if revision and COMMIT.match(revision) else None, "offline", "HF_HUB_OFFLINE=1")
    if revision and COMMIT.match(revision) and expect and all(cached_path(repo_id, f, revision) for f in expect):
        return HubAccess(repo_id, revision, revision, "cached")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi().model_info(repo_id, revision=revision, timeout=float(constants.HF_HUB_ETAG_TIMEOUT))
    except GatedRepoError:
        raise UserError(f"{what}: the hub repository {repo_id} is gated; accept its terms at {constants.ENDPOINT}/{repo_id} "
                        "and set HF_TOKEN (or `hf auth login`), or use a cache that holds it with HF_HUB_OFFLINE=1") from None
    except RevisionNotFoundError:
        raise UserError(f"{what}: the hub repository {repo_id} has no revision {revision!r}; give a branch, tag or commit it has") from None
    except RepositoryNotFoundError:
        raise UserError(f"{what}: the hub has no repository {repo_id} (or it is private: set HF_TOKEN); check the name") from None
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout, proxy, 5xx: the hub is not there
        # said after a load from the cache succeeds (HubAccess.note), so that a refusal stays one line
        return HubAccess(repo_id, revision, None, "unreachable", _reason(exc))
    return HubAccess(repo_id, revision, getattr(info, "sha", None) or revision, "online")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def not_loadable(access: HubAccess, what: str, exc: BaseException, alternatives: str) -> UserError:
    """One line for a loader that could not get the repository's files; ``alternatives`` says what else works."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled

    where = f"hub repository {access.repo_id}" + (f"@{access.requested}" if access.requested else "")
    fill = (f"fill the cache where there is network (`hf download {access.repo_id}"
            + (f" --revision {access.requested}" if access.requested else "") + "`, then copy HF_HOME here)")
    # without the hub, a loader's failure to find a file (timm: LocalEntryNotFoundError; transformers:
    # an OSError of its own wording) means the cache lacks it
    if access.mode in ("offline", "unreachable") or isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        why = {"offline": "HF_HUB_OFFLINE=1 forbids downloading them",
               "unreachable": f"the hub cannot be reached ({access.reason})"}.get(access.mode, "they are not in the cache")
        return UserError(f"{what}: the files of the {where} are not in the Hugging Face cache {cache_dir()} and {why}; "
                         f"{fill}, {alternatives}")
    if isinstance(exc, EntryNotFoundError):
        return UserError(f"{what}: the {where} lacks a file the loader needs ({_reason(exc)}); {alternatives}")
    return UserError(f"{what}: loading the {where} failed ({_reason(exc)}); {fill}, {alternatives}")


def hub_error_kinds() -> tuple[type[BaseException], ...]:
    """Exceptions a loader raises when the hub or the cache cannot give it a file."""
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    return (EntryNotFoundError, LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError)


# -- what was loaded ------------------------------------------------------------------------------
def cached_path(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """The file in ``snapshots/<commit>/`` of the cache for this revision (None: not cached)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def snapshot_commit(path: Path) -> str | None:
    """The commit of a cached file: the folder under ``snapshots/``."""
    parts = path.parts
    if "snapshots" in parts:
        index = len(parts) - 1 - parts[::-1].index("snapshots")
        if index + 1 < len(parts) and COMMIT.match(parts[index + 1]):
            return parts[index + 1]
    return None


def file_identity(access: HubAccess, candidates: Sequence[str]) -> dict[str, Any] | None:
    """{origin, repo_id, revision, file, sha256} of the first cached candidate, in the loader's order."""
    for name in candidates:
        path = cached_path(access.repo_id, name, access.pin)
        if path is None:
            continue
        return {
            "origin": "hf-hub",
            "repo_id": access.repo_id,
            "requested_revision": access.requested,
            "revision": snapshot_commit(path) or access.pin,
            "file": name,
            "sha256": sha256_file(path),
        }
    return None
