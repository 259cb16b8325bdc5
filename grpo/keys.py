"""python -m grpo.keys DIR: make the CURVE keys for --curve-keys DIR.

Writes DIR/server.key(_secret) (the learner), DIR/client.key(_secret) (the samplers) and
DIR/authorized_clients/client.key (the client public keys the learner admits). Copy
client.key_secret + server.key to sampler machines, server.key_secret +
authorized_clients/ to the learner's. Secret files are made readable by the owner only.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def make_keys(keys_dir: str | Path, force: bool = False) -> Path:
    import zmq.auth

    d = Path(keys_dir)
    if (d / "server.key_secret").exists() and not force:
        raise FileExistsError(f"{d}/server.key_secret exists; pass --force to replace the keys")
    d.mkdir(parents=True, exist_ok=True)
    (d / "authorized_clients").mkdir(exist_ok=True)
    for name in ("server", "client"):
        public, secret = zmq.auth.create_certificates(str(d), name)
        os.chmod(secret, 0o600)
    shutil.copy(d / "client.key", d / "authorized_clients" / "client.key")
    return d


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    force = "--force" in args
    rest = [a for a in args if a != "--force"]
    if len(rest) != 1 or rest[0].startswith("-"):
        print("usage: python -m grpo.keys DIR [--force]", file=sys.stderr)
        return 2
    try:
        d = make_keys(rest[0], force)
    except FileExistsError as exc:
        print(f"grpo.keys: error: {exc}", file=sys.stderr)
        return 2
    print(f"CURVE keys in {d}: pass --curve-keys {d} to the learner and every sampler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
