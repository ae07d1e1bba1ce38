"""The kit's own PostgreSQL image, for a Docker engine that cannot pull one.

``ackkit-test/postgres:<version>`` is imported (``docker import``) from a Debian
root file system holding the ``postgresql-<version>`` package (made and cached
by :func:`._rootfs.ensure_root`), as the kit's RabbitMQ image is: no registry
and no Dockerfile build, only root (to read the root) and a Docker engine.

The image runs as the ``postgres`` user. Its command makes a cluster in
``/var/lib/postgresql/data`` the first time (``initdb``; the superuser
``postgres`` with the password of ``POSTGRES_PASSWORD``, scram-sha-256 over TCP)
and runs the server in the foreground on port ``PGPORT`` (default 5432) of
``POSTGRES_LISTEN`` (default 127.0.0.1), with ``fsync`` off: a server for tests.
The same variables work for the official ``postgres`` image.

Build it by hand (prints how long it took)::

    python -m ackkit_testkit._pg_image [--version 17] [--root DIR] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any

from ackkit.testing import BrokerUnavailable
from ackkit.testing.providers import image_exists

from ._docker_image import build_lock, import_root

__all__ = [
    "DEFAULT_PG_VERSION",
    "LOCAL_PG_REPOSITORY",
    "ensure_pg_image",
    "local_pg_image_name",
    "local_pg_image_version",
]

LOCAL_PG_REPOSITORY = "ackkit-test/postgres"
DEFAULT_PG_VERSION = "17"

_EXCLUDES = (
    "./proc",
    "./dev",
    "./sys",
    "./var/lib/postgresql/*",  # the cluster the package made while installing
    "./etc/postgresql/*",
    "./var/log/postgresql/*",
    "./etc/ssl/private/*",  # ssl-cert's snakeoil key
    "./var/cache/apt/*",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./tmp/*",
)

# The image's command (sh -c): a cluster on first start, then the server as PID 1,
# so that docker kill's SIGTERM / SIGINT / SIGQUIT are its smart / fast / immediate stop.
START = """\
set -eu
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
data=/var/lib/postgresql/data
if [ ! -s "$data/PG_VERSION" ]; then
    umask 077
    printf '%s\\n' "${POSTGRES_PASSWORD:?the image needs POSTGRES_PASSWORD}" > /tmp/.pw
    "$bin/initdb" -D "$data" -U postgres -E UTF8 --no-locale --auth-local=trust \\
        --auth-host=scram-sha-256 --pwfile=/tmp/.pw --no-sync
    rm -f /tmp/.pw
    printf 'host all all 0.0.0.0/0 scram-sha-256\\nhost all all ::/0 scram-sha-256\\n' \\
        >> "$data/pg_hba.conf"
fi
exec "$bin/postgres" -D "$data" -c "listen_addresses=${POSTGRES_LISTEN:-127.0.0.1}" \\
    -c unix_socket_directories=/tmp -c fsync=off
"""


def local_pg_image_name(version: str = DEFAULT_PG_VERSION) -> str:
    return f"{LOCAL_PG_REPOSITORY}:{version}"


def local_pg_image_version(image: str) -> str | None:
    """The version of a kit-made image name (``ackkit-test/postgres:17`` -> "17"), else None."""
    repo, sep, tag = image.rpartition(":")
    return tag if sep and repo == LOCAL_PG_REPOSITORY and tag else None


def postgres_version_in(root: pathlib.Path) -> str:
    """The newest PostgreSQL major version whose server is installed in a Debian root."""
    found = sorted(
        (p.parent.parent.name for p in root.glob("usr/lib/postgresql/*/bin/postgres")),
        key=lambda v: int(v) if v.isdigit() else 0,
    )
    if not found:
        raise BrokerUnavailable(f"{root} holds no PostgreSQL server (usr/lib/postgresql)")
    return found[-1]


def build_pg_image(client: Any, root: pathlib.Path, *, name: str) -> float:
    """Import the Debian root ``root`` (only read) as image ``name``; the seconds it took."""
    root = pathlib.Path(root)
    installed = postgres_version_in(root)
    version = local_pg_image_version(name)
    if version is not None and installed != version:
        raise BrokerUnavailable(f"{root} holds PostgreSQL {installed}, not {version} (for {name})")
    changes = [
        "ENV HOME=/var/lib/postgresql",
        "ENV LANG=C.UTF-8",
        "USER postgres",
        f"CMD {json.dumps(['sh', '-c', START])}",
        f"LABEL org.ackkit.postgresql-version={installed}",
    ]
    return import_root(client, root, name=name, excludes=_EXCLUDES, changes=changes)


def _ensure_root(version: str) -> pathlib.Path:
    from ._rootfs import ensure_root

    return pathlib.Path(ensure_root(version, product="postgresql"))


def ensure_pg_image(client: Any, version: str = DEFAULT_PG_VERSION) -> str:
    """Name of the kit's PostgreSQL image for ``version``, built first when it is missing
    (root; concurrent callers wait for one build)."""
    name = local_pg_image_name(version)
    if image_exists(client, name):
        return name
    if os.geteuid() != 0:
        raise BrokerUnavailable(
            f"the Docker image {name} is missing, and building it needs root. Build it once "
            "with `sudo python -m ackkit_testkit._pg_image`, or set "
            f"ACKKIT_TEST_POSTGRES_IMAGE=postgres:{version} to pull the official image"
        )
    with build_lock(name):
        if not image_exists(client, name):
            build_pg_image(client, _ensure_root(version), name=name)
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ackkit_testkit._pg_image",
        description=f"Build the test kit's PostgreSQL image ({LOCAL_PG_REPOSITORY}:<version>).",
    )
    parser.add_argument("--version", default=DEFAULT_PG_VERSION, help="PostgreSQL version (17)")
    parser.add_argument("--root", type=pathlib.Path, help="Debian root to import (read only)")
    parser.add_argument("--force", action="store_true", help="rebuild when it exists")
    parser.add_argument(
        "--for-tests",
        action="store_true",
        help="only when the test kit would run the kit's image on this engine "
        "(ACKKIT_TEST_POSTGRES_IMAGE, the engine's network)",
    )
    args = parser.parse_args(argv)
    from ackkit.testing.providers import ENV_POSTGRES_IMAGE, docker_client, network_mode

    from ._provider_pg_docker import pg_image_choice

    try:
        client = docker_client(timeout=300)
    except Exception as exc:
        print(f"error: no Docker engine answers (DOCKER_HOST?): {exc}", file=sys.stderr)
        return 1
    try:
        if args.for_tests:
            explicit = os.environ.get(ENV_POSTGRES_IMAGE, "").strip()
            kit_exists = image_exists(client, local_pg_image_name(args.version))
            name, own = pg_image_choice(explicit, network_mode(client), kit_exists, args.version)
            if not own:
                print(f"the test kit runs {name} on this engine")
                return 0
            args.version = local_pg_image_version(name) or args.version
        name = local_pg_image_name(args.version)
        if image_exists(client, name) and not args.force:
            print(f"{name} exists")
            return 0
        with build_lock(name):
            root_started = time.monotonic()
            root = args.root or _ensure_root(args.version)
            root_seconds = time.monotonic() - root_started
            seconds = build_pg_image(client, root, name=name)
        size = client.images.get(name).attrs.get("Size", 0) / 1e6
        print(
            f"{name} built from {root} in {seconds:.1f}s ({size:.0f} MB; "
            f"root ready in {root_seconds:.1f}s)"
        )
    except BrokerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
