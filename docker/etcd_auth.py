"""Turn on etcd's users and roles for the compose deployment (docker/compose.yml's
``etcd-auth`` service; safe to run again).

Connects with etcd's root client certificate (CN root; before auth is on any client
certificate the CA signed may do this), then (``canal_ha.etcd_users.enable_auth``, what
``canal-ha up --secure`` uses too):

- user ``root`` (password from ``SECRETS/etcd_root_password``) with the ``root`` role;
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

from canal_ha.etcd_users import AuthTls, EtcdUser, enable_auth


def _secret(args: argparse.Namespace, name: str) -> str:
    return (Path(args.secrets) / name).read_text().removesuffix("\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--endpoint", "--cacert", "--cert", "--key", "--secrets"):
        p.add_argument(name, required=True)
    p.add_argument("--prefix", default="/canal")
    args = p.parse_args()
    prefix = f"{args.prefix}/"
    users = [
        EtcdUser("root", _secret(args, "etcd_root_password"), "root"),
        EtcdUser(
            "canal-node",
            _secret(args, "etcd_canal_password"),
            "canal-node",
            (("readwrite", prefix),),
        ),
        EtcdUser("spark", _secret(args, "etcd_spark_password"), "spark", (("read", prefix),)),
    ]
    tls = AuthTls(Path(args.cacert), Path(args.cert), Path(args.key))
    try:
        steps = enable_auth(args.endpoint, tls, users)
    except RuntimeError as exc:
        sys.exit(f"etcd_auth: {exc}")
    for step in steps:
        print(f"etcd_auth: {step}: ok")


if __name__ == "__main__":
    main()
