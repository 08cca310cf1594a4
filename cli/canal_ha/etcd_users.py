"""etcd users and roles, then auth on: what a secured deployment sets up once.

``enable_auth(endpoint, tls, users)`` connects over TLS with etcd's root client
certificate (CN ``root``: before auth is on, etcd lets any certificate its CA signed do
this; after, ``--client-cert-auth`` takes the user from the CN), then for each
``EtcdUser``: its role with the role's permissions on key prefixes, the user with its
password (changed to the given one when the user exists), the role granted; then auth
enable. Safe to run again: what exists already counts as done, so ``canal-ha up
--secure`` runs it at every start and ``docker/etcd_auth.py`` (the compose deployment)
as often as compose starts it. The users must include ``root`` with the role ``root``:
etcd refuses to turn auth on without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["AuthTls", "EtcdUser", "Permission", "enable_auth"]

Permission = Literal["read", "write", "readwrite"]
AUTH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class EtcdUser:
    """A user, the one role it holds and that role's ``(permission, key prefix)`` pairs."""

    name: str
    password: str = field(repr=False)
    role: str
    permissions: tuple[tuple[Permission, str], ...] = ()


@dataclass(frozen=True)
class AuthTls:
    """How to reach etcd as root: its CA, the root client certificate and key."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def _call(what: str, fn: Callable[..., Any], request: Any, done: list[str]) -> None:
    """One Auth call; "already exists"/"already granted" answers count as done."""
    import grpc

    try:
        fn(request, timeout=AUTH_TIMEOUT_S)
    except grpc.RpcError as exc:
        details = str(exc.details() or "")
        if "already" not in details:
            raise RuntimeError(f"etcd auth setup: {what}: {exc.code().name}: {details}") from None
    done.append(what)


def enable_auth(endpoint: str, tls: AuthTls, users: Sequence[EtcdUser]) -> list[str]:
    """Roles, users and auth on (module docstring); the steps done, in order.
    ``RuntimeError`` naming the step when etcd refuses one."""
    import grpc
    from pyetcd import etcdrpc
    from pyetcd.utils import prefix_range_end

    if not any(u.name == "root" and u.role == "root" for u in users):
        raise ValueError("etcd turns auth on only with a user root holding the role root")
    kinds = {"read": etcdrpc.Permission.READ, "write": etcdrpc.Permission.WRITE,
             "readwrite": etcdrpc.Permission.READWRITE}  # fmt: skip
    creds = grpc.ssl_channel_credentials(
        tls.ca_file.read_bytes(), tls.key_file.read_bytes(), tls.cert_file.read_bytes()
    )
    done: list[str] = []
    with grpc.secure_channel(endpoint.split("://", 1)[-1], creds) as channel:
        auth = etcdrpc.AuthStub(channel)
        for user in users:
            _call(f"role {user.role}", auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=user.role),
                  done)  # fmt: skip
            for kind, prefix in user.permissions:
                key = prefix.encode()
                perm = etcdrpc.Permission(permType=kinds[kind], key=key,
                                          range_end=prefix_range_end(key))  # fmt: skip
                request = etcdrpc.AuthRoleGrantPermissionRequest(name=user.role, perm=perm)
                _call(f"role {user.role}: {kind} {prefix}", auth.RoleGrantPermission, request,
                      done)  # fmt: skip
            _user(auth, etcdrpc, user, done)
            grant = etcdrpc.AuthUserGrantRoleRequest(user=user.name, role=user.role)
            _call(f"user {user.name}: role {user.role}", auth.UserGrantRole, grant, done)
        _call("auth enable", auth.AuthEnable, etcdrpc.AuthEnableRequest(), done)
    return done


def _user(auth: Any, etcdrpc: Any, user: EtcdUser, done: list[str]) -> None:
    """Add the user, or set its password when it exists (the password file is the truth)."""
    import grpc

    try:
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name=user.name, password=user.password),
                     timeout=AUTH_TIMEOUT_S)  # fmt: skip
    except grpc.RpcError as exc:
        if "already" not in str(exc.details() or ""):
            raise RuntimeError(
                f"etcd auth setup: user {user.name}: {exc.code().name}: {exc.details()}"
            ) from None
        request = etcdrpc.AuthUserChangePasswordRequest(name=user.name, password=user.password)
        _call(f"user {user.name}: password", auth.UserChangePassword, request, done)
        return
    done.append(f"user {user.name}")
