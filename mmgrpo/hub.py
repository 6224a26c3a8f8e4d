"""Can a Hugging Face hub id be loaded now? Answered in well under a second, without downloading anything.

:func:`hub_weights_problem`: a local directory or file, a snapshot in the Hugging Face cache, or (not offline,
:func:`hf_offline`) a hub that answers one ``HEAD`` request (:data:`PROBE_TIMEOUT_S`). The load-time checks use it
before any model loads, so a model that cannot be found is one line instead of minutes of hub retries: the
model-based rewards' weights (:mod:`mmgrpo.rewards.weights`) and the policy's ``model.args.name_or_path``
(:mod:`mmgrpo.modalities.model_names`); in the core, so both may import it.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

PROBE_TIMEOUT_S = 5.0
"""Seconds the one request to the hub may take before the hub counts as unreachable."""

_TRUE = {"1", "on", "yes", "true"}


def hf_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, read now (not when huggingface_hub was imported)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> str:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def hf_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _cached(repo_id: str, cache_dir: str | None, filenames: tuple[str, ...]) -> bool:
    """A snapshot of ``repo_id`` is in the cache (holding one of ``filenames`` when given)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, cache_dir=cache_dir or hf_cache_dir(), local_files_only=True)
    except Exception:  # LocalEntryNotFoundError, or a malformed repo id: not usable from the cache
        return False
    return not filenames or any((Path(folder) / name).is_file() for name in filenames)


def _probe(repo_id: str) -> str | None:
    """``None`` when the hub answers for ``repo_id``; otherwise why not (one request, :data:`PROBE_TIMEOUT_S`)."""
    from huggingface_hub import get_token

    url = f"{hf_endpoint()}/api/models/{repo_id}"
    token = get_token()  # HF_TOKEN or the stored login: private and gated repos answer as they will to the loader
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        request = urllib.request.Request(url, method="HEAD", headers=headers)
        urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError as e:
        if e.code in (401, 404):  # the hub says 401 for a repo that does not exist too
            login = "" if token else "; for a private repo, log in (hf auth login) or set HF_TOKEN"
            return f"the hub ({hf_endpoint()}) has no model {repo_id!r} (HTTP {e.code}){login}"
        return None  # the hub answered; let the loader report anything else
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"the hub ({hf_endpoint()}) cannot be reached ({reason})"
    return None


def hub_weights_problem(
    name: str, *, cache_dir: str | None = None, filenames: tuple[str, ...] = (), probe: bool = True
) -> str | None:
    """``None`` when ``name`` (a hub id, or a local directory or file) can be loaded now; else one phrase saying
    why not. Order: a local path; the hub cache (``cache_dir``, default :func:`hf_cache_dir`); offline
    (:func:`hf_offline`) stops here; else one ``HEAD`` request to the hub (``probe``)."""
    if Path(os.path.expanduser(name)).exists():
        return None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return f"{name!r} is neither a local path that exists nor a hub id"
    if _cached(name, cache_dir, filenames):
        return None
    where = cache_dir or hf_cache_dir()
    if hf_offline():
        return f"{name!r} is not in the Hugging Face cache ({where}) and HF_HUB_OFFLINE is set"
    if not probe:
        return None
    problem = _probe(name)
    return None if problem is None else f"{name!r} is not in the Hugging Face cache ({where}) and {problem}"


__all__ = ["PROBE_TIMEOUT_S", "hf_cache_dir", "hf_offline", "hub_weights_problem"]
