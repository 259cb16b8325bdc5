"""A hub id given as --model (or a hub data set) on a machine that may not reach the hub.

The hub client retries a host it cannot reach for about 25 s, once for the config and once again
for the tokenizer: a worker without network took ~52 s to fail, and its message named no fix. So
before anything loads, the hub is asked for once, with a bound (unreachable_reason):
  - it answers: transformers fetches (or reads its cache) as usual;
  - it does not, and the model is in the local Hugging Face cache: offline mode is turned on for
    this process and the processes it starts (go_offline), and the cached copy loads at once;
  - it does not, and the model is not cached: one line naming the ways out.
With HF_HUB_OFFLINE already set, nothing is asked, and a model missing from the cache is that line.

Torch-free and without huggingface_hub's client: the launcher asks it before any worker starts.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from grpo.model.gguf.header import ModelUnavailable

# How long the reachability probe may take before the hub counts as unreachable: well under the
# client's own ~25 s of retries, well over a round trip to it or to a proxy.
HUB_PROBE_TIMEOUT_S = 3.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "ON", "YES", "TRUE"}   # as huggingface_hub reads its boolean variables


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    """Whether offline mode is on (HF_HUB_OFFLINE, or transformers' own TRANSFORMERS_OFFLINE)."""
    if (hub := sys.modules.get("huggingface_hub.constants")) is not None and hub.HF_HUB_OFFLINE:
        return True   # turned on in this process after the variables were read
    return any(os.environ.get(k, "").upper() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, found as huggingface_hub finds it."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                     os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def cached_model(repo_id: str, cache: Path | None = None) -> bool:
    """Whether a snapshot of model `repo_id` with its config.json is in the hub cache."""
    folder = (cache or hub_cache()) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
    return folder.is_dir() and any((snap / "config.json").is_file() for snap in folder.iterdir())


def unreachable_reason(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub (or the proxy in front of it) cannot be reached, or None if a TCP connect works.

    Runs in a daemon thread because socket timeouts do not bound DNS resolution.
    """
    url = urllib.parse.urlsplit(endpoint())
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname or host, proxy_url.port or 80
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port}: {exc}")

    worker = threading.Thread(target=probe, name="hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer in {timeout:.0f} s"


def go_offline() -> None:
    """Offline mode for this process (huggingface_hub, once imported, reads the variable no more)
    and for every process it starts from now on."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    if (hub := sys.modules.get("huggingface_hub.constants")) is not None:
        hub.HF_HUB_OFFLINE = True


def _ways_out(name: str, cache: Path) -> str:
    return (f"pass --model a local model folder or a .gguf file, or put {name} in the Hugging Face cache "
            f"({cache}, e.g. `hf download {name}` where the hub is reachable) and run with HF_HUB_OFFLINE=1")


def check_hub_model(name: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """For --model `name`, a hub id: None when transformers may load it as usual; a one-line note
    when the hub did not answer and the cached copy is used (offline mode now on, go_offline);
    ModelUnavailable, one line naming the ways out, when it can be neither fetched nor read."""
    cache = hub_cache()
    if offline():
        if cached_model(name, cache):
            return None
        raise ModelUnavailable(f"--model {name}: offline mode (HF_HUB_OFFLINE) is set and {name} is not in the "
                               f"Hugging Face cache; {_ways_out(name, cache)}")
    reason = unreachable_reason(timeout)
    if reason is None:
        return None
    if cached_model(name, cache):
        go_offline()
        return (f"--model {name}: the hub ({endpoint()}) does not answer ({reason}); loading the copy in the "
                f"Hugging Face cache (HF_HUB_OFFLINE=1)")
    raise ModelUnavailable(f"--model {name}: the hub ({endpoint()}) cannot be reached ({reason}) and {name} is not "
                           f"in the Hugging Face cache; {_ways_out(name, cache)}")
