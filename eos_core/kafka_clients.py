"""The librdkafka clients of spark-eos, made in one place: a refused login or TLS handshake fails within
seconds, naming the principal, the mechanism or the certificate and the option that fixes it; librdkafka's
own log lines go to the Python logger ``eos.librdkafka``, each kind of line once a minute, not to stderr.

librdkafka reports a refused authentication only to an ``error_cb`` (the call waiting for metadata or a
coordinator just times out, as if the broker were down), and only while the client is polled: ``Watch``
records it, ``connect`` polls while it waits for the cluster's metadata, and every retry loop of the
connectors asks ``Watch.check`` before it tries again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from eos_core.errors import ConfigError, FatalError
from eos_core.privileges import KafkaAcl, acl_command, describe_missing

__all__ = ["Watch", "admin", "check", "connect", "consumer", "principal", "producer", "refused_access", "refused_login"]

LOG = "eos.librdkafka"
_REPEAT_SECONDS = 60.0
# a login or a handshake the broker refused: no retry helps until the configuration changes
REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED})


_SUPPRESSED = re.compile(r", \d+ identical error\(s\) suppressed")  # librdkafka's own count of repeats
# a client without TLS whose first request (ApiVersion) the broker answers by closing the connection: a
# TLS listener does that (it reads the request as a broken handshake); _speaks_tls tells it from a broker
# that merely went away
_FIRST_REQUEST_CLOSED = re.compile(
    r"(?:\w+://)?(\[[^\]]+\]|[^\s/\[\]]+):(\d+)/\S*: Disconnected\b.*\bin state APIVERSION_QUERY"
)
# librdkafka's own words for a TLS client whose handshake a plaintext listener ends
_PLAINTEXT_LISTENER = "connecting to a PLAINTEXT broker listener?"
_EXPECTS_TLS = "answers with TLS"


class _OncePerMinute(logging.Filter):
    """Lets a kind of line through once a minute (lines alike but for their numbers are one kind)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = re.sub(r"\d+", "#", _SUPPRESSED.sub("", record.getMessage()))
        now = time.monotonic()
        with self.lock:
            last = self.seen.get(kind)
            if last is not None and now - last < _REPEAT_SECONDS:
                return False
            self.seen[kind] = now
            return True


_logger = logging.getLogger(LOG)
_logger.addFilter(_OncePerMinute())


class Watch:
    """What librdkafka reported of one client (``context`` names its connector in the errors): the first
    refused login or TLS handshake (``refused``); ``configure`` hands a client's settings its callbacks."""

    def __init__(self, conf: Mapping[str, Any], context: str, also: Callable[[KafkaError], None] | None = None) -> None:
        self.conf = dict(conf)
        self.context = context
        self.also = also  # the client's own error_cb, called with every error too
        self.refused: KafkaError | None = None
        self._probed = False  # a listener was probed for TLS (once per client)

    def configure(self, conf: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(conf)
        out["error_cb"] = self.on_error
        out.setdefault("logger", _ClientLog(self))
        return out

    def on_error(self, err: KafkaError) -> None:
        if self.also is not None:
            self.also(err)
        if self.refused is None and (err.code() in REFUSED or _PLAINTEXT_LISTENER in err.str()):
            self.refused = err
        elif err.code() not in REFUSED:
            _logger.info("%s: %s (%s)", self.context, err.name(), err.str())

    def on_log(self, line: str) -> None:
        """A librdkafka log line of this client: a client without TLS whose first request a listener answers
        by closing the connection is probed once; a listener that speaks TLS is a refused handshake."""
        if self.refused is not None or self._probed or "SSL" in str(self.conf.get("security.protocol", "")).upper():
            return
        m = _FIRST_REQUEST_CLOSED.search(line)
        if m is None:
            return
        self._probed = True
        host, port = m.group(1).strip("[]"), int(m.group(2))
        if _speaks_tls(host, port):
            self.refused = KafkaError(
                KafkaError._TRANSPORT, f"{host}:{port} {_EXPECTS_TLS}: it closed the connection at the first request"
            )

    def check(self, client: Any = None) -> None:
        """Serve ``client``'s callbacks, then raise a FatalError for a refused login or handshake."""
        if client is not None:
            client.poll(0)
        if self.refused is not None:
            raise FatalError(refused_login(self.conf, self.refused, self.context), code=self.refused.name())


class _ClientLog:
    """librdkafka's log lines of one client (its ``logger``): to the ``eos.librdkafka`` logger, and to the
    client's ``Watch`` to read."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def log(self, level: int, fmt: str, *args: Any) -> None:
        _logger.log(level, fmt, *args)
        self.watch.on_log(fmt % args if args else fmt)


def _speaks_tls(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether ``host:port`` completes (or answers in) a TLS handshake; a Kafka plaintext listener closes the
    connection on a ClientHello, which it reads as an oversized request."""
    import socket
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only: does it speak TLS at all?
    try:
        with socket.create_connection((host, port), timeout) as raw, context.wrap_socket(raw):
            return True
    except ssl.SSLError as exc:  # an alert (e.g. a client certificate required) is TLS; plaintext bytes are not
        return not isinstance(exc, ssl.SSLEOFError) and exc.reason != "WRONG_VERSION_NUMBER"
    except OSError:
        return False


def _mismatch(conf: Mapping[str, Any], err: KafkaError, context: str) -> str | None:
    """A client and a listener that disagree on TLS, or None."""
    where = conf.get("bootstrap.servers", "?")
    protocol = str(conf.get("security.protocol") or "PLAINTEXT").upper()
    if _EXPECTS_TLS in err.str():
        return (
            f"{context}: the listener at {where} speaks TLS and the client connects with security.protocol "
            f"{protocol}: set kafka.security.protocol to SSL or SASL_SSL (with kafka.sasl.* for SASL_SSL, and "
            "kafka.ssl.truststore.location for a private CA), as the broker's listener is configured"
        )
    if _PLAINTEXT_LISTENER in err.str():
        return (
            f"{context}: the listener at {where} is not TLS and the client connects with security.protocol "
            f"{protocol}: set kafka.security.protocol to PLAINTEXT or SASL_PLAINTEXT, or connect to the broker's "
            f"TLS listener (librdkafka: {err.str()})"
        )
    return None


def refused_login(conf: Mapping[str, Any], err: KafkaError, context: str) -> str:
    """What a refused login or TLS handshake means for these client settings, and the option that fixes it
    (spelled as the ``kafka.*`` options of the connectors; never a secret)."""
    text = err.str()
    where = conf.get("bootstrap.servers", "?")
    mismatch = _mismatch(conf, err, context)
    if mismatch is not None:
        return mismatch
    if err.code() == KafkaError._SSL:
        ca = conf.get("ssl.ca.location") or "the system's CA certificates"
        low = text.lower()
        if "expired" in low:
            why = "the broker's certificate has expired: the broker must be given a valid one"
        elif "hostname" in low or "host name" in low or "mismatch" in low:
            why = (
                f"the broker's certificate is not for the host in kafka.bootstrap.servers ({where}): connect to a "
                "name the certificate holds, or have the broker's certificate issued for it"
            )
        else:
            why = (
                f"the broker's certificate was not issued by a CA the client trusts ({ca}): set "
                "kafka.ssl.truststore.location (type PEM) or kafka.ssl.ca.location to the CA that signed it"
            )
        return f"{context}: the TLS handshake with {where} failed: {why} (librdkafka: {text})"
    user = conf.get("sasl.username") or "(none: kafka.sasl.jaas.config has no username)"
    mechanism = conf.get("sasl.mechanism") or conf.get("sasl.mechanisms") or "GSSAPI"
    if "mechanism" in text.lower() and ("unsupported" in text.lower() or "not enabled" in text.lower()):
        fix = "set kafka.sasl.mechanism to one the broker enables"
    else:
        fix = "fix the password or user in kafka.sasl.jaas.config (or kafka.sasl.username / kafka.sasl.password)"
    return (
        f"{context}: {where} refused the login of principal {user!r} with {mechanism}: {fix}. The credentials "
        f"are wrong or not (yet) known to the broker; no retry can help (librdkafka: {text})"
    )


def principal(conf: Mapping[str, Any]) -> str:
    """The principal these client settings log in as (``sasl.username``; ``ANONYMOUS`` without SASL)."""
    return str(
        conf.get("sasl.username")
        or ("ANONYMOUS" if "SASL" not in str(conf.get("security.protocol", "")).upper() else "?")
    )


def refused_access(conf: Mapping[str, Any], err: Any, acls: list[KafkaAcl], context: str) -> str:
    """What an authorization failure means: the principal, each ACL it lacks and why, and the commands that
    grant them (``kafka-acls.sh``, as ``eos_core.privileges.acl_command`` writes it)."""
    where = str(conf.get("bootstrap.servers", "?"))
    code = f"{err.name()}: {err.str()}" if isinstance(err, KafkaError) else str(err)
    who = principal(conf)
    return describe_missing(
        f"principal User:{who}",
        acls,
        context=f"{context}: {where} refused access ({code})",
        fix=[acl_command(a, who, where) for a in acls],
    )


class _WatchedConsumer(Consumer):
    """A consumer that keeps the ``Watch`` it was made with (``check``)."""

    watch: Watch


class _WatchedProducer(Producer):
    watch: Watch


class _WatchedAdmin(AdminClient):
    watch: Watch


_WATCHED = {Consumer: _WatchedConsumer, Producer: _WatchedProducer, AdminClient: _WatchedAdmin}


def _made(kind: Any, conf: Mapping[str, Any], watch: Watch, what: str) -> Any:
    try:
        made = _WATCHED.get(kind, kind)(watch.configure(conf))  # a test's fake client class is made as it is
    except KafkaException as exc:
        raise ConfigError(f"{watch.context}: the kafka.* options are not a valid {what} configuration: {exc}") from None
    with contextlib.suppress(AttributeError):
        made.watch = watch
    return made


def consumer(conf: Mapping[str, Any], watch: Watch) -> Consumer:
    made: Consumer = _made(Consumer, conf, watch, "consumer")
    return made


def producer(conf: Mapping[str, Any], watch: Watch) -> Producer:
    made: Producer = _made(Producer, conf, watch, "producer")
    return made


# How often an admin client refreshes the cluster's metadata (librdkafka: 5 minutes). Requests librdkafka sends to
# the controller (DescribeTopics, CreateTopics, the ACL and config requests) wait for the one its metadata last named;
# when that broker dies, they waited out their whole timeout (the source's topic-id look-up: 2 minutes an attempt,
# 5 minutes a batch, in a three-node cluster's leader kill, crash matrix F31) until a periodic refresh named a live
# one. Every 5 s, one of them answers within about a second of the next refresh; a user's value wins.
ADMIN_METADATA_REFRESH_MS = 5000


def admin(conf: Mapping[str, Any], watch: Watch) -> AdminClient:
    conf = {"topic.metadata.refresh.interval.ms": ADMIN_METADATA_REFRESH_MS, **conf}
    made: AdminClient = _made(AdminClient, conf, watch, "client")
    return made


def check(client: Any) -> None:
    """A FatalError when the broker refused the login or TLS handshake of ``client`` (one made here), as its
    ``Watch`` recorded it; for a retry loop to ask between its tries. It does not poll: a consumer's messages
    are its caller's, and the loop's own calls (``consume``, ``poll``, ``committed``) serve the callbacks."""
    watch = getattr(client, "watch", None)
    if isinstance(watch, Watch):
        watch.check()


def connect(client: Any, watch: Watch, timeout: float) -> Any:
    """The cluster's metadata, waited for up to ``timeout`` seconds in slices of a second while ``client``'s
    callbacks are served: a refused login or TLS handshake is a FatalError within about a second. Any other
    failure is the caller's to retry, as it was before the slices: one that comes back at once (no broker
    listens) is raised at once, and a wait that used the whole timeout raises the last one."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        step = max(0.1, min(1.0, deadline - began))
        try:
            return client.list_topics(timeout=step)
        except KafkaException:
            watch.check(client)
            if time.monotonic() - began < step * 0.8 or time.monotonic() >= deadline:
                raise
