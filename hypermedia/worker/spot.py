"""Spot interruption notices, read from the instance metadata service.

A :class:`SpotWatcher` is a thread on a spot (preemptible) instance that watches
for the cloud's "you are about to be reclaimed" notice and calls its callback once,
with a :class:`SpotNotice`, when it appears. The worker's answer (stop claiming,
hand its jobs back without spending an attempt, record why it stopped) is
:meth:`hypermedia.worker.worker.Worker.interrupt`; this module only observes.

AWS (IMDSv2, about 2 minutes of notice)
    ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` gives a
    session token (refreshed before it expires, and again on a 401); then every
    ``poll_seconds`` ``GET /latest/meta-data/spot/instance-action`` with
    ``X-aws-ec2-metadata-token``: 404 while there is no notice, then
    ``{"action": "terminate" | "stop" | "hibernate", "time": "...Z"}``; ``time`` is
    the deadline.

GCP (about 30 seconds of notice)
    ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google``
    answers ``FALSE`` or ``TRUE`` and an ``ETag``; the watcher then long-polls
    ``?wait_for_change=true&last_etag=<etag>&timeout_sec=<n>``, which answers as
    soon as the value changes. The flag carries no time: the deadline is when the
    watcher saw it plus :data:`GCP_NOTICE_SECONDS`.

Every request has a short timeout (a long-poll: its ``timeout_sec`` plus that) and
bypasses any HTTP proxy of the environment. Nothing escapes the thread: failures
are logged and the watcher tries again after ``poll_seconds``; an exception in the
callback is logged too. The watcher needs no credentials (the IMDSv2 token is a
session token of the instance's own metadata service, and is never logged).

Checkpoints: no pipeline step can checkpoint yet (a step is a pure function run in
a child the worker may kill at any time, see :mod:`pipelines.registry`), so a
notice hands every running job back to its queue, to start over elsewhere.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import httpx

from hypermedia.clock import Clock, SystemClock, to_datetime
from hypermedia.config import Settings

log = logging.getLogger(__name__)

Provider = Literal["aws", "gcp"]

AWS_METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"
DEFAULT_URLS: dict[str, str] = {"aws": AWS_METADATA_URL, "gcp": GCP_METADATA_URL}

AWS_TOKEN_PATH = "/latest/api/token"  # noqa: S105 (a path)
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
AWS_TOKEN_HEADER = "X-aws-ec2-metadata-token"  # noqa: S105 (a header name)
AWS_NOTICE_SECONDS = 120.0  # the documented notice, when its time is unreadable
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
GCP_FLAVOR = {"Metadata-Flavor": "Google"}
GCP_NOTICE_SECONDS = 30.0

DEFAULT_POLL_SECONDS = 5.0  # AWS suggests checking every 5 s
DEFAULT_HTTP_TIMEOUT_SECONDS = 2.0
DEFAULT_TOKEN_TTL_SECONDS = 21600  # IMDSv2's maximum


@dataclass(frozen=True, slots=True)
class SpotNotice:
    """The instance is being reclaimed: by whom, how, and by when (epoch seconds)."""

    provider: Provider
    action: str  # AWS: terminate | stop | hibernate; GCP: preempted
    deadline: float
    seen_at: float

    @property
    def reason(self) -> str:
        """A sentence for attempts and logs."""
        when = to_datetime(self.deadline).isoformat(timespec="seconds")
        return f"interrupted: spot instance reclaimed ({self.provider} {self.action} by {when})"


@dataclass(frozen=True, slots=True)
class SpotWatch:
    """What to watch: the provider, the metadata service's base URL (``None``: the
    provider's own) and how often to look."""

    provider: Provider
    metadata_url: str | None = None
    poll_seconds: float = DEFAULT_POLL_SECONDS
    http_timeout_seconds: float = DEFAULT_HTTP_TIMEOUT_SECONDS
    token_ttl_seconds: int = DEFAULT_TOKEN_TTL_SECONDS

    def __post_init__(self) -> None:
        if self.provider not in DEFAULT_URLS:
            raise ValueError(f"spot watch provider must be 'aws' or 'gcp', not {self.provider!r}")
        if self.metadata_url is not None and not self.metadata_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(f"metadata URL must be http(s)://, not {self.metadata_url!r}")
        if self.poll_seconds <= 0 or self.http_timeout_seconds <= 0:
            raise ValueError("poll and HTTP timeout seconds must be positive")
        if not 1 <= self.token_ttl_seconds <= DEFAULT_TOKEN_TTL_SECONDS:
            raise ValueError(f"token TTL must be 1-{DEFAULT_TOKEN_TTL_SECONDS} seconds")

    @property
    def base_url(self) -> str:
        return (self.metadata_url or DEFAULT_URLS[self.provider]).rstrip("/")

    @classmethod
    def from_settings(cls, settings: Settings) -> SpotWatch | None:
        """``spot_watch``, ``metadata_url`` and ``spot_poll_seconds``; None when off."""
        if settings.spot_watch == "off":
            return None
        return cls(
            provider=settings.spot_watch,
            metadata_url=settings.metadata_url,
            poll_seconds=settings.spot_poll_seconds,
        )


class SpotWatcher:
    """Polls the metadata service in a daemon thread; calls ``on_notice`` once.

    ``start`` starts the thread; ``stop`` asks it to end and waits up to ``timeout``
    (default: one HTTP timeout) for it; a GCP long-poll still in flight ends by its
    own ``timeout_sec``, and no callback follows a ``stop``. ``notice`` is the notice
    seen, if any.
    """

    def __init__(
        self,
        watch: SpotWatch,
        on_notice: Callable[[SpotNotice], object],
        *,
        clock: Clock | None = None,
        name: str = "spot-watch",
    ) -> None:
        self.watch = watch
        self.on_notice = on_notice
        self.clock = clock or SystemClock()
        self.notice: SpotNotice | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._token: str | None = None
        self._token_refresh_at = 0.0  # monotonic
        self._etag: str | None = None
        self._failing = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.watch.http_timeout_seconds if timeout is None else timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        log.info(
            "watching for %s spot notices at %s",
            self.watch.provider,
            self.watch.base_url,
            extra={"action": "spot_watch"},
        )
        try:
            with httpx.Client(
                base_url=self.watch.base_url,
                timeout=self.watch.http_timeout_seconds,
                trust_env=False,  # link-local: never through a proxy
                follow_redirects=False,
            ) as client:
                self._loop(client)
        except Exception:  # nothing escapes the thread
            log.exception("spot watcher stopped by an error", extra={"action": "spot_watch"})

    def _loop(self, client: httpx.Client) -> None:
        check = self._check_aws if self.watch.provider == "aws" else self._check_gcp
        while not self._stopping.is_set():
            try:
                notice = check(client)
            except (httpx.HTTPError, ValueError) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
                self._stopping.wait(self.watch.poll_seconds)
                continue
            if self._stopping.is_set():
                return  # stopped while a request was in flight: no callback now
            if self._failing:
                self._failing = False
                log.info("metadata service answers again", extra={"action": "spot_watch"})
            if notice is not None:
                self._notify(notice)
                return
            if self.watch.provider == "aws":  # GCP's long-poll is its own wait
                self._stopping.wait(self.watch.poll_seconds)

    def _notify(self, notice: SpotNotice) -> None:
        self.notice = notice
        log.warning(
            "spot notice: %s %s, deadline in %.0f s",
            notice.provider,
            notice.action,
            notice.deadline - notice.seen_at,
            extra={"action": "spot_notice", "provider": notice.provider},
        )
        try:
            self.on_notice(notice)
        except Exception:
            log.exception("handling the spot notice failed", extra={"action": "spot_notice"})

    def _failed(self, problem: str) -> None:
        if not self._failing:
            log.warning(
                "spot watcher: metadata service at %s: %s (retrying every %.1f s)",
                self.watch.base_url,
                problem,
                self.watch.poll_seconds,
                extra={"action": "spot_watch"},
            )
        else:
            log.debug("spot watcher: %s", problem)
        self._failing = True

    # -- AWS -------------------------------------------------------------------------------

    def _aws_token(self, client: httpx.Client) -> str:
        if self._token is None or time.monotonic() >= self._token_refresh_at:
            ttl = self.watch.token_ttl_seconds
            # The token's life starts when the service issues it, before the answer is
            # read: the clock starts at the request, so a slow answer shortens the margin
            # instead of outliving the token.
            asked = time.monotonic()
            response = client.put(AWS_TOKEN_PATH, headers={AWS_TTL_HEADER: str(ttl)})
            if response.status_code != 200 or not response.text:
                raise ValueError(f"token request answered {response.status_code}")
            self._token = response.text.strip()
            self._token_refresh_at = asked + ttl * 0.8
        return self._token

    def _check_aws(self, client: httpx.Client) -> SpotNotice | None:
        for _ in range(2):  # a 401 means the token expired early: once more with a new one
            headers = {AWS_TOKEN_HEADER: self._aws_token(client)}
            response = client.get(AWS_ACTION_PATH, headers=headers)
            if response.status_code != 401:
                break
            self._token = None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ValueError(f"{AWS_ACTION_PATH} answered {response.status_code}")
        now = self.clock.now()
        action, deadline = "terminate", now + AWS_NOTICE_SECONDS
        try:
            body = response.json()
            action = str(body["action"])
            moment = datetime.fromisoformat(str(body["time"]))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            deadline = moment.timestamp()
        except (ValueError, KeyError, TypeError) as exc:
            # The notice is there even if its body is not what we expect.
            log.warning(
                "spot notice body %r unreadable (%s): assuming %s in %.0f s",
                response.text[:200],
                exc,
                action,
                AWS_NOTICE_SECONDS,
            )
        return SpotNotice("aws", action, deadline, now)

    # -- GCP -------------------------------------------------------------------------------

    def _check_gcp(self, client: httpx.Client) -> SpotNotice | None:
        params: dict[str, str] = {}
        timeout = self.watch.http_timeout_seconds
        if self._etag is not None:
            wait = max(1, math.ceil(self.watch.poll_seconds))
            params = {"wait_for_change": "true", "last_etag": self._etag, "timeout_sec": str(wait)}
            timeout += wait
        response = client.get(
            GCP_PREEMPTED_PATH, params=params, headers=GCP_FLAVOR, timeout=timeout
        )
        if response.status_code != 200:
            self._etag = None
            raise ValueError(f"{GCP_PREEMPTED_PATH} answered {response.status_code}")
        self._etag = response.headers.get("ETag")
        value = response.text.strip().upper()
        if value == "TRUE":
            now = self.clock.now()
            return SpotNotice("gcp", "preempted", now + GCP_NOTICE_SECONDS, now)
        if value != "FALSE":
            raise ValueError(f"{GCP_PREEMPTED_PATH} answered {response.text[:50]!r}")
        if self._etag is None:  # no long-poll without an ETag: plain polling then
            self._stopping.wait(self.watch.poll_seconds)
        return None
