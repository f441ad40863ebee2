"""Start-up hook for every Python process of a Scrapy compatibility run.

``compat/run_scrapy_tests.py`` puts this directory first on ``PYTHONPATH``, so the
interpreter imports this module at start-up in the pytest process, in its xdist
workers and in every subprocess Scrapy's tests spawn (mock servers, ``scrapy``
commands), since they all inherit the environment.  It does two things:

* Network guard (always, unless ``SLOTKIT_COMPAT_NET_GUARD=0``): wildcard binds
  (``""``, ``0.0.0.0``, ``::``) are narrowed to loopback, binds to any other
  non-loopback address are refused, connections and datagrams may only go to
  loopback addresses, and host names other than ``localhost`` and the names in
  ``/etc/hosts`` do not resolve.  Nothing of the run listens beyond 127.0.0.0/8
  or reaches past this machine.
* Downloader injection (only when ``SLOTKIT_COMPAT_DOWNLOADER`` is set): the
  value replaces ``DOWNLOADER`` in ``scrapy.settings.default_settings`` as soon as
  that module is first imported, before any ``Settings`` object can read it.

Any other ``sitecustomize`` further down ``sys.path`` is still run afterwards.
"""

from __future__ import annotations

import errno
import importlib.abc
import importlib.machinery
import importlib.util
import ipaddress
import os
import socket
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_DEFAULTS_MODULE = "scrapy.settings.default_settings"
_DOWNLOADER_ENV = "SLOTKIT_COMPAT_DOWNLOADER"
_GUARD_ENV = "SLOTKIT_COMPAT_NET_GUARD"
_INET_FAMILIES = (socket.AF_INET, socket.AF_INET6)


# --------------------------------------------------------------------------- network guard


def _is_loopback_ip(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _hosts_file_names() -> set[str]:
    names = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
    try:
        text = Path("/etc/hosts").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return names
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        names.update(name.lower() for name in fields[1:])
    return names


def _install_net_guard() -> None:
    local_names = _hosts_file_names()
    orig_socket = socket.socket
    orig_bind = orig_socket.bind
    orig_connect = orig_socket.connect
    orig_connect_ex = orig_socket.connect_ex
    orig_sendto = orig_socket.sendto
    orig_getaddrinfo = socket.getaddrinfo
    orig_gethostbyname = socket.gethostbyname
    orig_gethostbyname_ex = socket.gethostbyname_ex

    def name_allowed(host: Any) -> bool:
        if host is None:
            return True
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        if not isinstance(host, str):
            return True
        name = host.rstrip(".").lower()
        return name == "" or _is_ip(name) or name in local_names or name.endswith(".localhost")

    def refuse_name(host: Any) -> socket.gaierror:
        return socket.gaierror(
            socket.EAI_NONAME,
            f"Name or service not known ({host!r} blocked by the slotkit compat network guard)",
        )

    def target_allowed(sock: socket.socket, address: Any) -> bool:
        if sock.family not in _INET_FAMILIES or not isinstance(address, tuple) or not address:
            return True
        host = address[0]
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        host = str(host).rstrip(".").lower()
        return _is_loopback_ip(host) or host in ("localhost", "")

    def bind(self: socket.socket, address: Any) -> None:
        if self.family in _INET_FAMILIES and isinstance(address, tuple) and address:
            host = address[0]
            if isinstance(host, bytes):
                host = host.decode("ascii", "replace")
            host = str(host)
            if host in ("", "0.0.0.0", "::", "::0"):
                loopback = "127.0.0.1" if self.family == socket.AF_INET else "::1"
                address = (loopback, *address[1:])
            elif not (_is_loopback_ip(host) or host.lower() == "localhost"):
                raise PermissionError(
                    errno.EACCES,
                    f"slotkit compat network guard: refusing to bind {host!r} (loopback only)",
                )
        orig_bind(self, address)

    def connect(self: socket.socket, address: Any) -> None:
        if not target_allowed(self, address):
            raise OSError(
                errno.ENETUNREACH,
                f"slotkit compat network guard: {address!r} is not a loopback address",
            )
        orig_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not target_allowed(self, address):
            return errno.ENETUNREACH
        return orig_connect_ex(self, address)

    def sendto(self: socket.socket, data: Any, *args: Any) -> int:
        if args and not target_allowed(self, args[-1]):
            raise OSError(
                errno.ENETUNREACH,
                f"slotkit compat network guard: {args[-1]!r} is not a loopback address",
            )
        return orig_sendto(self, data, *args)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not name_allowed(host):
            raise refuse_name(host)
        return orig_getaddrinfo(host, *args, **kwargs)

    def gethostbyname(host: str) -> str:
        if not name_allowed(host):
            raise refuse_name(host)
        return orig_gethostbyname(host)

    def gethostbyname_ex(host: str) -> tuple[str, list[str], list[str]]:
        if not name_allowed(host):
            raise refuse_name(host)
        return orig_gethostbyname_ex(host)

    # socket.socket is a Python subclass of _socket.socket, so its methods can be replaced;
    # asyncio, Twisted and the standard library all create their sockets through it.
    orig_socket.bind = bind  # type: ignore[method-assign,assignment]
    orig_socket.connect = connect  # type: ignore[method-assign,assignment]
    orig_socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
    orig_socket.sendto = sendto  # type: ignore[method-assign,assignment]
    socket.getaddrinfo = getaddrinfo
    socket.gethostbyname = gethostbyname
    socket.gethostbyname_ex = gethostbyname_ex


# --------------------------------------------------------------------------- DOWNLOADER injection


def _patch_defaults(module: ModuleType, downloader: str) -> None:
    module.__dict__.setdefault("_SLOTKIT_COMPAT_ORIGINAL_DOWNLOADER", module.DOWNLOADER)
    module.DOWNLOADER = downloader  # type: ignore[attr-defined]
    module._SLOTKIT_COMPAT_DOWNLOADER = downloader  # type: ignore[attr-defined]


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then swaps in the requested DOWNLOADER."""

    def __init__(self, inner: importlib.abc.Loader, downloader: str) -> None:
        self._inner = inner
        self._downloader = downloader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _patch_defaults(module, self._downloader)

    def __getattr__(self, name: str) -> Any:  # get_source(), get_code(), ...
        return getattr(self._inner, name)


class _DefaultsFinder(importlib.abc.MetaPathFinder):
    def __init__(self, downloader: str) -> None:
        self._downloader = downloader

    def find_spec(
        self, fullname: str, path: Any, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DEFAULTS_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self._downloader)
                return spec
        return None


def _install_downloader_hook(downloader: str) -> None:
    already = sys.modules.get(_DEFAULTS_MODULE)
    if already is not None:
        _patch_defaults(already, downloader)
        return
    sys.meta_path.insert(0, _DefaultsFinder(downloader))


# --------------------------------------------------------------------------- chaining


def _run_next_sitecustomize() -> None:
    here = Path(__file__).resolve().parent
    for entry in sys.path:
        try:
            if Path(entry or ".").resolve() == here:
                continue
        except OSError:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or spec.origin == __file__:
            continue
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return


if os.environ.get(_GUARD_ENV, "1") != "0":
    _install_net_guard()
if os.environ.get(_DOWNLOADER_ENV):
    _install_downloader_hook(os.environ[_DOWNLOADER_ENV])
_run_next_sitecustomize()
