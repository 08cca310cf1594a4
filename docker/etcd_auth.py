"""Turn on etcd's users and roles for the compose deployment (docker/compose.yml's
``etcd-auth`` service; safe to run again).

Connects with etcd's root client certificate (CN root; before auth is on any client
certificate the CA signed may do this), then:

- user ``root`` (password from ``--root-password-file``) with the ``root`` role;
- role ``canal-node``: readwrite on ``PREFIX/`` (what a canal-ha node needs, see
  docs/security.md), user ``canal-node`` holding it;
- role ``spark``: read on ``PREFIX/`` (a consumer without ``exclusive``), user ``spark``;
- auth enable.

Usage: python etcd_auth.py --endpoint https://etcd1:2379 --cacert ca.crt --cert root.crt
--key root.key --secrets /run/secrets [--prefix /canal]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import grpc
from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

READ, READWRITE = etcdrpc.Permission.READ, etcdrpc.Permission.READWRITE


def _channel(args: argparse.Namespace) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        Path(args.cacert).read_bytes(), Path(args.key).read_bytes(), Path(args.cert).read_bytes()
    )
    return grpc.secure_channel(args.endpoint.split("://", 1)[-1], creds)


def _call(what: str, fn: Any, request: Any) -> None:
    """One Auth call; "already exists"/"already granted" answers count as done."""
    try:
        fn(request, timeout=30)
    except grpc.RpcError as exc:
        details = str(exc.details() or "")
        if "already" not in details:
            sys.exit(f"etcd_auth: {what}: {exc.code().name}: {details}")
    print(f"etcd_auth: {what}: ok")


def _secret(args: argparse.Namespace, name: str) -> str:
    return (Path(args.secrets) / name).read_text().removesuffix("\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--endpoint", "--cacert", "--cert", "--key", "--secrets"):
        p.add_argument(name, required=True)
    p.add_argument("--prefix", default="/canal")
    args = p.parse_args()
    auth = etcdrpc.AuthStub(_channel(args))
    key = f"{args.prefix}/".encode()
    users = {
        "root": (_secret(args, "etcd_root_password"), "root", []),
        "canal-node": (_secret(args, "etcd_canal_password"), "canal-node", [READWRITE]),
        "spark": (_secret(args, "etcd_spark_password"), "spark", [READ]),
    }
    for user, (password, role, kinds) in users.items():
        _call(f"role {role}", auth.RoleAdd, etcdrpc.AuthRoleAddRequest(name=role))
        for kind in kinds:
            permission = etcdrpc.Permission(permType=kind, key=key, range_end=prefix_range_end(key))
            request = etcdrpc.AuthRoleGrantPermissionRequest(name=role, perm=permission)
            _call(f"role {role}: {args.prefix}/", auth.RoleGrantPermission, request)
        _call(f"user {user}", auth.UserAdd,
              etcdrpc.AuthUserAddRequest(name=user, password=password))  # fmt: skip
        _call(f"user {user} role {role}", auth.UserGrantRole,
              etcdrpc.AuthUserGrantRoleRequest(user=user, role=role))  # fmt: skip
    _call("auth enable", auth.AuthEnable, etcdrpc.AuthEnableRequest())


if __name__ == "__main__":
    main()
