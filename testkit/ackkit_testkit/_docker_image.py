"""The kit's own RabbitMQ image, for a Docker engine that cannot pull one.

``ackkit-test/rabbitmq:<version>`` is imported (``docker import``) from a Debian
root file system that holds the broker: no registry and no Dockerfile build are
needed, only root (to read the root file system) and a Docker engine. The root
comes from ``ackkit_testkit._rootfs.ensure_root(version)``, which makes and
caches it (debootstrap); :func:`build_image` takes any such root as a parameter.

Build it by hand (prints how long it took)::

    python -m ackkit_testkit._docker_image [--version 4.3] [--root DIR] [--force]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ackkit.testing import BrokerUnavailable
from ackkit.testing.providers import (
    LOCAL_REPOSITORY,
    image_exists,
    local_image_name,
    local_image_version,
)

DEFAULT_VERSION = "4.3"

# Left out of the image: mount points the engine provides, the data and Erlang
# cookie of whatever node ran in the root, logs, and package caches.
_EXCLUDES = (
    "./proc",
    "./dev",
    "./sys",
    "./var/lib/rabbitmq/mnesia",
    "./var/lib/rabbitmq/.erlang.cookie",
    "./var/log/rabbitmq/*",
    "./var/cache/apt/*",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./tmp/*",
)

_CHANGES = (
    "ENV HOME=/var/lib/rabbitmq",
    "ENV LANG=C.UTF-8",
    "ENV LC_ALL=C.UTF-8",
    'CMD ["rabbitmq-server"]',
)


def rabbitmq_version_in(root: pathlib.Path) -> str:
    """The RabbitMQ version installed in a Debian root (from its lib directory)."""
    found = sorted((root / "usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
    if not found:
        raise BrokerUnavailable(f"{root} holds no RabbitMQ server (usr/lib/rabbitmq/lib)")
    return found[-1].name.split("-", 1)[1]


def _version_matches(installed: str, wanted: str) -> bool:
    return installed == wanted or installed.startswith(wanted + ".")


@contextlib.contextmanager
def build_lock(name: str) -> Iterator[None]:
    """One builder per image name on this machine (parallel test runs wait)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    path = os.path.join(tempfile.gettempdir(), f"ackkit-image-{slug}.lock")
    with open(path, "a", encoding="ascii") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_image(client: Any, root: pathlib.Path, *, name: str) -> float:
    """Import the Debian root ``root`` as image ``name``; returns the seconds it took.

    ``root`` is only read. Mounted file systems below it (proc, dev) are skipped.
    """
    root = pathlib.Path(root)
    version = local_image_version(name)
    installed = rabbitmq_version_in(root)
    if version is not None and not _version_matches(installed, version):
        raise BrokerUnavailable(f"{root} holds RabbitMQ {installed}, not {version} (for {name})")
    changes = [*_CHANGES, f"LABEL org.ackkit.rabbitmq-version={installed}"]
    return import_root(client, root, name=name, excludes=_EXCLUDES, changes=changes)


def import_root(
    client: Any, root: pathlib.Path, *, name: str, excludes: Sequence[str], changes: Sequence[str]
) -> float:
    """``tar`` the Debian root ``root`` (only read; mounted file systems and ``excludes``
    left out) into ``docker import`` as image ``name`` with the Dockerfile-like
    ``changes``; returns the seconds it took."""
    repository, _, tag = name.rpartition(":")
    started = time.monotonic()
    cmd = ["tar", "-C", str(root), "--one-file-system", "--numeric-owner"]
    cmd += [f"--exclude={pattern}" for pattern in excludes]
    cmd += ["-cf", "-", "."]
    with tempfile.TemporaryFile() as errors:
        tar = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors)
        assert tar.stdout is not None
        stream = iter(lambda: tar.stdout.read(1 << 20), b"")  # type: ignore[union-attr]
        try:
            client.api.import_image(
                src=stream,
                repository=repository,
                tag=tag,
                changes=list(changes),
                stream_src=True,
            )
        finally:
            tar.stdout.close()
            rc = tar.wait()
        errors.seek(0)
        message = errors.read().decode("utf-8", "replace").strip()
    # GNU tar exits 1 when a file changed while it was read (a live node's root);
    # what it read is still a usable image.
    if rc not in (0, 1):
        with contextlib.suppress(Exception):
            client.images.remove(name, force=True)
        raise BrokerUnavailable(f"tar of {root} failed ({rc}): {message[-2000:]}")
    return time.monotonic() - started


class NoRootBuilder(BrokerUnavailable):
    """The kit's image is missing and this version of the kit cannot make a root for it."""


def _ensure_root(version: str) -> pathlib.Path:
    """The Debian root with RabbitMQ ``version`` (built and cached by ``_rootfs``)."""
    try:
        from ._rootfs import ensure_root  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise NoRootBuilder(
            f"the image {local_image_name(version)} is missing and this version of the kit "
            "cannot make a Debian root for it; build it from an existing root with\n"
            "    python -m ackkit_testkit._docker_image --root DIR"
        ) from exc
    return pathlib.Path(ensure_root(version))


def ensure_local_image(client: Any, version: str = DEFAULT_VERSION) -> str:
    """Name of the kit's image for ``version``, built first when it is missing.

    Building needs root (to read a Debian root that belongs to other users);
    without it, :class:`BrokerUnavailable` says what to do instead.
    """
    name = local_image_name(version)
    if image_exists(client, name):
        return name
    if os.geteuid() != 0:
        raise BrokerUnavailable(
            f"the Docker image {name} is missing, and building it needs root. Build it once "
            "with `sudo python -m ackkit_testkit._docker_image`, or set "
            "ACKKIT_TEST_RABBITMQ_IMAGE=rabbitmq:4.3 to pull the official image"
        )
    with build_lock(name):
        if not image_exists(client, name):
            build_image(client, _ensure_root(version), name=name)
    return name


def _image_for_tests(client: Any, version: str) -> str | None:
    """The image the test kit would run here when it is not the kit's own, else None."""
    from ackkit.testing.providers import ENV_IMAGE, network_mode

    explicit = os.environ.get(ENV_IMAGE, "").strip()
    if explicit:
        return None if local_image_version(explicit) else explicit
    if network_mode(client) == "bridge" and not image_exists(client, local_image_name(version)):
        return f"rabbitmq:{version}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ackkit_testkit._docker_image",
        description=f"Build the test kit's RabbitMQ image ({LOCAL_REPOSITORY}:<version>).",
    )
    parser.add_argument("--version", default=DEFAULT_VERSION, help="RabbitMQ version (4.3)")
    parser.add_argument("--root", type=pathlib.Path, help="Debian root to import (read only)")
    parser.add_argument("--force", action="store_true", help="rebuild when it exists")
    parser.add_argument(
        "--for-tests",
        action="store_true",
        help="the image the test kit would run on this engine, for the version "
        "ACKKIT_TEST_RABBITMQ asks for (exit 3: this kit cannot make its Debian root)",
    )
    args = parser.parse_args(argv)
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=300)
    except docker.errors.DockerException as exc:
        print(f"error: no Docker engine answers (DOCKER_HOST?): {exc}", file=sys.stderr)
        return 1
    try:
        if args.for_tests:
            from ackkit.testing.providers import docker_version, wanted_version

            args.version = docker_version(wanted_version())
            other = _image_for_tests(client, args.version)
            if other is not None:
                print(f"the test kit runs {other} on this engine")
                return 0
            wanted = os.environ.get("ACKKIT_TEST_RABBITMQ_IMAGE", "").strip()
            args.version = local_image_version(wanted) or args.version
        name = local_image_name(args.version)
        if image_exists(client, name) and not args.force:
            print(f"{name} exists")
            return 0
        with build_lock(name):
            root_started = time.monotonic()
            root = args.root or _ensure_root(args.version)
            root_seconds = time.monotonic() - root_started
            seconds = build_image(client, root, name=name)
        size = client.images.get(name).attrs.get("Size", 0) / 1e6
        print(
            f"{name} built from {root} in {seconds:.1f}s ({size:.0f} MB; "
            f"root ready in {root_seconds:.1f}s)"
        )
    except BrokerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, NoRootBuilder) else 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
