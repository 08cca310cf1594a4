"""``Coordinator`` on etcd v3 through ``pyetcd`` (etcd-sdk-python), every cluster member known.

- One ``MultiEndpointEtcd3Client`` with failover over all endpoints. A failed
  endpoint is skipped for ``endpoint_retry_s`` (pyetcd's default is 300 s, far too
  long); a call that fails fast (connection refused) is tried once on each other
  endpoint; a call that timed out is not retried, so no call takes much longer than
  ``timeout_s``. Every failure to reach etcd becomes ``CoordinatorUnavailable``.
- gRPC reconnect backoff is capped at 1 s, so a restarted member is used again
  quickly, and channels send keepalive pings so a frozen member breaks a watch
  stream instead of holding it forever.
- Watches do not use pyetcd's shared watcher (one lost stream kills all its
  callbacks): each ``EtcdWatch`` owns one gRPC stream and a thread which re-opens
  it with backoff on another endpoint after a failure, resuming after the last
  revision delivered. After a compaction it sends ``RESYNC``.
- Security (``etcd_security``): ``https://`` endpoints use TLS (CA, client
  certificate); with a user name every call and watch carries an auth token, fetched
  again when etcd no longer knows it (expired, etcd restarted). When etcd refuses us
  (TLS handshake, user/password, the role's permissions) a call raises
  ``CoordinatorAccessDenied`` naming the setting; ``check_access`` asks once at start.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
import pyetcd
from pyetcd import etcdrpc, transactions
from pyetcd import exceptions as etcd_exc
from pyetcd.utils import prefix_range_end

from canal_cluster.coordinator import (
    CampaignResult,
    Coordinator,
    Delete,
    KeyValue,
    Lease,
    Op,
    Put,
    RangeResult,
    Watch,
    WatchCallback,
    WatchEvent,
    WatchEventType,
)
from canal_cluster.etcd_security import (
    EtcdSecurity,
    access_problem,
    channel_credentials,
    grpc_error_of,
    invalid_token,
    uses_tls,
)
from canal_cluster.retry import RetryPolicy
from canal_protocol.errors import (
    ConfigError,
    CoordinatorUnavailable,
    Fenced,
    RetryExhausted,
)

__all__ = ["EtcdCoordinator", "EtcdWatch", "parse_endpoint"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
]
_ETCD_ERRORS = (grpc.RpcError, etcd_exc.Etcd3Exception)


def parse_endpoint(url: str) -> tuple[str, int]:
    """``http(s)://127.0.0.1:2379`` or ``127.0.0.1:2379`` → (host, port)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    try:
        port = parts.port
    except ValueError:  # not a number, or outside 0-65535
        raw = parts.netloc.rpartition(":")[2]
        raise ConfigError("etcd.endpoints", f"port {raw} out of range 1-65535 in {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError("etcd.endpoints", f"expected http(s)://host:port, got {url!r}")
    if port == 0:
        raise ConfigError("etcd.endpoints", f"port 0 out of range 1-65535 in {url!r}")
    return parts.hostname, port


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        raw.key.decode(), bytes(raw.value), raw.create_revision, raw.mod_revision,
        raw.version, raw.lease,
    )  # fmt: skip


def _describe(exc: BaseException) -> str:
    err = grpc_error_of(exc)
    if err is not None:
        return f"{err.code().name}: {err.details()}"
    return str(exc) or type(exc).__name__


class _TryNext(Exception):
    """A fast failure (refused connection): worth trying the next endpoint at once."""


class EtcdCoordinator(Coordinator):
    """The etcd implementation; ``endpoints`` lists every member of the cluster."""

    def __init__(
        self,
        endpoints: Sequence[str],
        timeout_s: float = 2.0,
        endpoint_retry_s: float = 1.0,
        security: EtcdSecurity | None = None,
    ) -> None:
        if not endpoints:
            raise ConfigError("etcd.endpoints", "at least one endpoint is needed")
        if timeout_s <= 0:
            raise ConfigError("etcd.timeout_s", "must be > 0")
        self._timeout_s = timeout_s
        self._security = security or EtcdSecurity()
        tls = uses_tls(endpoints, self._security)
        creds = channel_credentials(self._security) if tls else None
        self._endpoints = [
            pyetcd.Endpoint(
                host, port, secure=tls, creds=creds, time_retry=endpoint_retry_s, opts=_GRPC_OPTIONS
            )
            for host, port in map(parse_endpoint, endpoints)
        ]
        self._client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=self._endpoints, timeout=timeout_s, failover=True
        )
        self._watches: list[EtcdWatch] = []
        self._lock = threading.Lock()
        self._auth_lock = threading.Lock()
        self._auth_off = False  # a user is configured but etcd's auth is not enabled
        self._closed = False

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def endpoint_channels(self) -> list[Any]:
        """The gRPC channel of each endpoint (for the watch threads)."""
        return [ep.channel for ep in self._endpoints]

    @property
    def security(self) -> EtcdSecurity:
        return self._security

    def check_access(self, prefix: str, write: bool = True) -> None:
        """At start: ``CoordinatorAccessDenied`` (naming the setting) when etcd refuses the
        TLS handshake, the user, or the role's read (and write) under ``prefix``;
        ``CoordinatorUnavailable`` when no endpoint answers. Writes nothing: a transaction
        whose condition never holds still has the permissions of both branches checked."""
        probe = f"{prefix}/"
        put = [transactions.Put(probe, b"")] if write else []
        self._call(
            f"{'read/write' if write else 'read'} access check on {probe}",
            lambda: self._txn(
                [transactions.Version(probe) < 0],
                put,
                [transactions.Get(probe, prefix_range_end(probe.encode()))],
            ),
        )

    # -- auth tokens ------------------------------------------------------------------

    def call_metadata(self) -> Any:
        """The gRPC metadata of a call (the auth token), authenticating first if needed."""
        if self._security.username and not self._auth_off and self._client.metadata is None:
            self._authenticate(None)
        return self._client.metadata

    def reauthenticate(self, stale: Any) -> None:
        """Fetch a new token unless another thread already replaced ``stale``."""
        self._authenticate(stale)

    def _authenticate(self, stale: Any) -> None:
        c = self._client
        with self._auth_lock:
            if c.metadata is not None and c.metadata is not stale:
                return
            request = etcdrpc.AuthenticateRequest(
                name=self._security.username, password=self._security.password
            )
            try:
                resp = c.authstub.Authenticate(request, self._timeout_s)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # auth not enabled
                    log.warning("etcd: a user is configured but etcd's auth is not enabled")
                    self._auth_off = True
                    c.metadata = None
                    return
                c._manage_grpc_errors(exc)  # marks the endpoint failed, re-raises mapped
            c.metadata = (("token", resp.token),)

    # -- call wrapper ---------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        if self._closed:
            raise CoordinatorUnavailable(f"etcd {what}: coordinator is closed")
        policy = RetryPolicy(initial_s=0.0, attempts=len(self._endpoints))
        try:
            return policy.call(lambda: self._attempt(what, fn), what, retry_on=(_TryNext,))
        except RetryExhausted as exc:
            cause = exc.last_error.__cause__ if exc.last_error else None
            denied = access_problem(cause, self._security, what)
            if denied is not None:
                raise denied from cause
            raise CoordinatorUnavailable(
                f"etcd {what}: no endpoint answered ({_describe(cause or exc)})"
            ) from cause

    def _with_token(self, fn: Callable[[], T]) -> T:
        """``fn`` with our auth token; once more with a new one if etcd forgot it."""
        token = self.call_metadata()
        try:
            return fn()
        except grpc.RpcError as exc:
            if token is None or not invalid_token(exc):
                raise
        self.reauthenticate(token)
        return fn()

    def _attempt(self, what: str, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        try:
            return self._with_token(fn)
        except _ETCD_ERRORS as exc:
            if isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.NOT_FOUND:
                raise Fenced(f"etcd {what}: {_describe(exc)}") from exc
            denied = access_problem(exc, self._security, what)
            if denied is not None and isinstance(exc, grpc.RpcError):  # not a TLS failure:
                raise denied from exc  # every member would answer the same
            quick = time.monotonic() - start < self._timeout_s / 2
            if quick and not isinstance(exc, etcd_exc.NoServerAvailableError):
                raise _TryNext(what) from exc
            raise CoordinatorUnavailable(f"etcd {what}: {_describe(exc)}") from exc

    def _txn(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        c = self._client
        request = etcdrpc.TxnRequest(
            compare=[x.build_message() for x in compare],
            success=c._ops_to_requests(success),
            failure=c._ops_to_requests(failure),
        )
        try:
            return c.kvstub.Txn(
                request, c.timeout, credentials=c.call_credentials, metadata=c.metadata
            )
        except grpc.RpcError as exc:
            c._manage_grpc_errors(exc)  # marks the endpoint failed, re-raises mapped

    # -- leases -------------------------------------------------------------------

    def grant_lease(self, ttl_s: float) -> Lease:
        ttl = max(1, math.ceil(ttl_s))
        raw = self._call("grant lease", lambda: self._client.lease(ttl))
        return Lease(int(raw.id), int(raw.ttl))

    def keepalive(self, lease: Lease) -> int:
        replies = self._call(
            f"keepalive {lease.id:x}", lambda: list(self._client.refresh_lease(lease.id))
        )
        ttl = int(replies[-1].TTL) if replies else 0
        if ttl <= 0:
            raise Fenced(f"etcd lease {lease.id:x} has expired")
        return ttl

    def revoke(self, lease: Lease) -> None:
        with contextlib.suppress(Fenced):  # Fenced = lease not found: already gone
            self._call(f"revoke {lease.id:x}", lambda: self._client.revoke_lease(lease.id))

    # -- election -------------------------------------------------------------------

    def campaign(self, key: str, value: bytes, lease: Lease) -> CampaignResult:
        resp = self._call(
            f"campaign {key}",
            lambda: self._txn(
                [transactions.Create(key) == 0],
                [transactions.Put(key, value, lease.id), transactions.Get(key)],
                [transactions.Get(key)],
            ),
        )
        kvs = resp.responses[-1].response_range.kvs
        holder = _kv(kvs[0]) if kvs else None
        if resp.succeeded:
            assert holder is not None
            return CampaignResult(True, holder.create_revision, holder)
        return CampaignResult(False, None, holder)

    def resign(self, key: str, epoch: int) -> bool:
        resp = self._call(
            f"resign {key}",
            lambda: self._txn([transactions.Create(key) == epoch], [transactions.Delete(key)], []),
        )
        return bool(resp.succeeded)

    def fenced_txn(self, running_key: str, epoch: int, ops: Sequence[Op]) -> int:
        resp = self._call(
            f"fenced txn on {running_key}",
            lambda: self._txn(
                [transactions.Create(running_key) == epoch],
                [self._op(op) for op in ops],
                [transactions.Get(running_key)],
            ),
        )
        if not resp.succeeded:
            kvs = resp.responses[0].response_range.kvs
            actual = kvs[0].create_revision if kvs else 0
            raise Fenced(f"{running_key}: epoch {epoch} is stale (now {actual})")
        return int(resp.header.revision)

    @staticmethod
    def _op(op: Op) -> Any:
        if isinstance(op, Put):
            return transactions.Put(op.key, op.value, op.lease.id if op.lease else None)
        if isinstance(op, Delete) and op.prefix:
            return transactions.Delete(op.key, prefix_range_end(op.key.encode()))
        return transactions.Delete(op.key)

    # -- plain keys -------------------------------------------------------------------

    def get(self, key: str) -> KeyValue | None:
        resp = self._call(f"get {key}", lambda: self._client.get_response(key))
        return _kv(resp.kvs[0]) if resp.kvs else None

    def get_prefix(self, prefix: str) -> RangeResult:
        resp = self._call(
            f"get prefix {prefix}",
            lambda: self._client.get_prefix_response(prefix, sort_order="ascend"),
        )
        return RangeResult(tuple(_kv(kv) for kv in resp.kvs), int(resp.header.revision))

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        lease_id = lease.id if lease else None
        resp = self._call(f"put {key}", lambda: self._client.put(key, value, lease=lease_id))
        return int(resp.header.revision)

    def delete(self, key: str, prefix: bool = False) -> int:
        if prefix:
            resp = self._call(f"delete prefix {key}", lambda: self._client.delete_prefix(key))
        else:
            resp = self._call(
                f"delete {key}", lambda: self._client.delete(key, return_response=True)
            )
        return int(resp.deleted)

    # -- watches ----------------------------------------------------------------------

    def watch(
        self,
        key: str,
        callback: WatchCallback,
        prefix: bool = False,
        start_revision: int | None = None,
    ) -> EtcdWatch:
        w = EtcdWatch(self, key, callback, prefix, start_revision)
        with self._lock:
            self._watches = [x for x in self._watches if x.running] + [w]
        w.start()
        return w

    def close(self) -> None:
        with self._lock:
            watches, self._watches = self._watches, []
            self._closed = True
        for w in watches:
            w.cancel()
        self._client.close()


class EtcdWatch(Watch):
    """One watch stream with its own thread; re-opened after failures."""

    def __init__(
        self,
        owner: EtcdCoordinator,
        key: str,
        callback: WatchCallback,
        prefix: bool,
        start_revision: int | None,
    ) -> None:
        self._owner = owner
        self._key = key
        self._prefix = prefix
        self._callback = callback
        self._next_rev = start_revision
        self._stop = threading.Event()
        self._stream_done = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self.established = threading.Event()
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name=f"canal-watch {key}", daemon=True)

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        with self._lock:
            call = self._call
            self._stream_done.set()
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._owner.timeout_s + 1.0)

    def _run(self) -> None:
        index = 0
        delays = _backoff()
        warned = False
        while not self._stop.is_set():
            channels = self._owner.endpoint_channels
            try:
                self._stream(channels[index % len(channels)])
                error = "stream ended"
            except Exception as exc:  # any stream failure: back off, try the next endpoint
                error = _describe(exc)
                if isinstance(exc, _Canceled) and "auth token" in error:
                    with contextlib.suppress(*_ETCD_ERRORS):
                        self._owner.reauthenticate(exc.metadata)
            if self.established.is_set():  # a working watch was lost: backoff afresh
                delays = _backoff()
                if not self._stop.is_set():
                    log.warning("watch %s lost (%s); re-establishing", self._key, error)
            elif "permission denied" in error and not warned:
                warned = True
                log.warning("watch %s: etcd denies it (%s); retrying", self._key, error)
            else:
                log.debug("watch %s: not established (%s)", self._key, error)
            self.established.clear()
            index += 1
            self.reconnects += 1
            self._stop.wait(next(delays))

    def _stream(self, channel: Any) -> None:
        done = threading.Event()
        create = etcdrpc.WatchCreateRequest(key=self._key.encode())
        if self._prefix:
            create.range_end = prefix_range_end(self._key.encode())
        if self._next_rev is not None:
            create.start_revision = self._next_rev
        metadata = self._owner.call_metadata()
        with self._lock:
            if self._stop.is_set():
                return
            self._stream_done = done
            self._call = etcdrpc.WatchStub(channel).Watch(
                _requests(etcdrpc.WatchRequest(create_request=create), done), metadata=metadata
            )
            call = self._call
        try:
            for rs in call:
                if rs.canceled and rs.cancel_reason:
                    raise _Canceled(rs.cancel_reason, metadata)
                if not self._handle(rs):
                    return
        except grpc.RpcError:
            if self._stop.is_set():
                return
            raise
        finally:
            done.set()
            call.cancel()

    def _handle(self, rs: Any) -> bool:
        """Deliver one response; False when the stream must be re-opened."""
        if rs.compact_revision:
            log.warning("watch %s: compacted at %d; resync", self._key, rs.compact_revision)
            self._next_rev = None
            self._emit(WatchEvent(WatchEventType.RESYNC, self._key))
            return False
        if rs.created:
            if self._next_rev is None:
                self._next_rev = int(rs.header.revision) + 1
            if self.reconnects:
                log.info("watch %s re-established from revision %d", self._key, self._next_rev)
            self.established.set()
        if rs.canceled:
            return False
        for ev in rs.events:
            kind = WatchEventType.PUT if ev.type == ev.PUT else WatchEventType.DELETE
            kv = ev.kv
            create = kv.create_revision if kind is WatchEventType.PUT else 0
            self._emit(WatchEvent(kind, kv.key.decode(), bytes(kv.value), create, kv.mod_revision))
            self._next_rev = int(kv.mod_revision) + 1
        return True

    def _emit(self, event: WatchEvent) -> None:
        if self._stop.is_set():
            return
        try:
            self._callback(event)
        except Exception:
            log.exception("watch %s: callback failed on %s", self._key, event)


class _Canceled(Exception):
    """etcd canceled the watch (permission denied, invalid auth token)."""

    def __init__(self, reason: str, metadata: Any) -> None:
        super().__init__(reason)
        self.metadata = metadata


def _backoff() -> Iterator[float]:
    return RetryPolicy(initial_s=0.1, max_delay_s=2.0).delays()


def _requests(create: Any, done: threading.Event) -> Iterator[Any]:
    """The request side of a watch stream: one create, then hold it open until done."""
    yield create
    done.wait()
