"""Where the learner listens, and optional ZeroMQ CURVE encryption + authentication.

Binding: loopback (127.0.0.1) unless --bind-host says otherwise; any other address is
logged as a warning, because then anyone who can reach the port can send data.

CURVE (--curve-keys DIR, keys made by `python -m grpo.wire.curve DIR`): the learner's sockets
are CURVE servers with the server key pair; a ZAP authenticator admits only clients whose
public key is in DIR/authorized_clients/. Samplers use the client key pair and the
server's public key. A peer without an authorized key never completes the handshake, so
nothing it sends reaches the decoder. Files needed per machine:
  learner:  DIR/server.key_secret, DIR/authorized_clients/*.key
  samplers: DIR/client.key_secret, DIR/server.key

    python -m grpo.wire.curve DIR [--force]
writes DIR/server.key(_secret) (the learner), DIR/client.key(_secret) (the samplers) and
DIR/authorized_clients/client.key (the client public keys the learner admits); secret files
are made readable by the owner only.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import sys
import threading
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized_clients"


class KeysMissing(ValueError):
    """--curve-keys points at a folder without the keys this role needs (a user mistake)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(host: str, curve: "Curve | None") -> None:
    if not is_loopback(host):
        log.warning("binding %s, not loopback: anyone who can reach these ports can talk to the learner%s",
                    host, " (CURVE: only authorized sampler keys)" if curve else
                    "; pass --curve-keys DIR to encrypt and authenticate (python -m grpo.wire.curve DIR)")


def _load(path: Path, what: str) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeysMissing(f"--curve-keys: {path} not found ({what}); make keys with: python -m grpo.wire.curve "
                          f"{path.parent}")
    try:
        return zmq.auth.load_certificate(str(path))
    except (ValueError, OSError) as exc:
        raise KeysMissing(f"--curve-keys: {path} is not a ZeroMQ certificate ({exc})") from None


class Curve:
    """Key material for one role; apply_* set the socket options before bind/connect."""

    _auth_lock = threading.Lock()
    _authenticators: dict[int, object] = {}

    def __init__(self, keys_dir: str, role: str):
        self.dir, self.role = Path(keys_dir), role
        if role == SERVER:
            self.public, self.secret = _load(self.dir / f"{SERVER}.key_secret", "the learner's secret key")
            clients = self.dir / AUTHORIZED
            if not clients.is_dir() or not any(clients.glob("*.key")):
                raise KeysMissing(f"--curve-keys: no authorized client keys in {clients}; make keys with: "
                                  f"python -m grpo.wire.curve {self.dir}")
        else:
            self.public, self.secret = _load(self.dir / f"{CLIENT}.key_secret", "the sampler's secret key")
            self.server_public, _ = _load(self.dir / f"{SERVER}.key", "the learner's public key")

    def apply_server(self, sock: zmq.Socket) -> None:
        self._ensure_authenticator(sock.context)
        sock.curve_secretkey, sock.curve_publickey = self.secret, self.public
        sock.curve_server = True

    def apply_client(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey, sock.curve_publickey = self.secret, self.public
        sock.curve_serverkey = self.server_public

    def _ensure_authenticator(self, ctx: zmq.Context) -> None:
        # One ZAP handler per context (it serves every socket of that context).

        with self._auth_lock:
            if id(ctx) in self._authenticators:
                return
            auth = ThreadAuthenticator(ctx, log=logging.getLogger("grpo.security.zap"))
            auth.start()
            auth.configure_curve(domain="*", location=str(self.dir / AUTHORIZED))
            self._authenticators[id(ctx)] = auth
            log.info("CURVE on: only clients with a key in %s are admitted", self.dir / AUTHORIZED)

    @classmethod
    def stop_authenticators(cls) -> None:
        with cls._auth_lock:
            for auth in cls._authenticators.values():
                auth.stop()  # type: ignore[attr-defined]
            cls._authenticators.clear()


def curve_for(keys_dir: str, role: str) -> Curve | None:
    return Curve(keys_dir, role) if keys_dir else None


def make_keys(keys_dir: str | Path, force: bool = False) -> Path:
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
        print("usage: python -m grpo.wire.curve DIR [--force]", file=sys.stderr)
        return 2
    try:
        d = make_keys(rest[0], force)
    except FileExistsError as exc:
        print(f"grpo.wire.curve: error: {exc}", file=sys.stderr)
        return 2
    print(f"CURVE keys in {d}: pass --curve-keys {d} to the learner and every sampler")
    return 0


if __name__ == "__main__":
    sys.exit(main())
