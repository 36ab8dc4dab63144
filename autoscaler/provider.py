"""The Ray node provider: burst nodes on AWS, GCP, IONOS (or this machine), under the caps.

Declared in a cluster yaml (``ray_cluster/cluster.yaml``)::

    provider:
      type: external
      module: autoscaler.provider.HypermediaNodeProvider
      head_ip: 10.0.0.5           # the VPS; Ray on ray_port (never 6379)
      ray_port: 6390
      state_dir: /var/lib/hypermedia/cluster
      drivers: {aws: {type: aws, on_demand_cents_per_hour: 17}}
      disable_node_updaters: true

``ray up`` and the head's monitor (autoscaler v2, or v1 with ``ray start
--autoscaling-config``) each build one of these; they share state through the clouds
(every instance is tagged) and ``<state_dir>/nodes.json`` under a ``flock`` (Ray's own
tags of each node). What it does:

* **The head is the VPS.** Creating the head node adopts this machine; commands run
  here (:class:`LocalCommandRunner`): no SSH anywhere. Its Ray node advertises a
  ``queue_<name>`` slot per pipeline actor the VPS runs
  (:func:`autoscaler.placement.vps_pools`, by scheduler.json's mode:
  :func:`head_resources`), so Ray launches burst nodes for the cloud's part only.
* **Launch** (``create_node_with_resources_and_labels``): a node type serves one queue
  (its ``queue_<name>`` resource). The provider takes the scheduler's launch order for
  that queue (:mod:`autoscaler.orders`: provider, spot, price) or, without one, the
  cheapest eligible offer as the policy would choose it. It admits the launch by the
  policy's own rule (:func:`autoscaler.admission.admit`: mode, cost lock, the queue's
  max_workers, hourly and daily caps, launch rate; then max_instances and the price),
  counted afresh: the queue's VPS workers from the workers table and its cloud
  instances from the ledger. A refused launch raises
  ``NodeLaunchException`` with the reason and writes it to ``scheduler_decisions``
  (once per reason every :data:`REFUSAL_REPEAT_SECONDS`: Ray v2 asks again every few
  seconds). An allowed one goes to the driver with the boot script
  (:mod:`autoscaler.bootstrap`) and opens a row in the ``cloud_spend`` ledger.
* **The ledger follows the clouds** (:meth:`HypermediaNodeProvider._settle_ledger`,
  on every listing): a listed instance without an open row gets one (a launch that
  answered an error after the cloud made its instance, a process that died between
  the launch and the row's update); a row nothing lists is closed once its launch has
  settled; a node is taken for gone only after it was missing from the listings for
  :data:`LISTING_GRACE_SECONDS`, not from one.
* **The daily cap when the scheduler is gone** (:meth:`HypermediaNodeProvider._backstop`,
  on a listing, at most every :data:`BACKSTOP_CHECK_SECONDS`): the scheduler drains and
  terminates every cloud worker at the daily cap; a busy node is never idle to Ray, so
  with the scheduler dead or hung nothing else would stop it. When the cost guard says
  the daily cap is reached (the admission's own verdict, or the lock) and the
  scheduler's leader has recorded no turn for ``scheduler_stale_seconds`` (default
  :data:`SCHEDULER_STALE_SECONDS`, at least five evaluation intervals), the provider
  locks to ``vps_only`` (as the scheduler would) and terminates the cloud nodes itself,
  without a drain (nothing tells their actors to stop claiming: a drain would only wait
  out its deadline, paying); their jobs go back when their leases expire. Each is a
  ``scheduler_decisions`` row and an error in the log. A scheduler that evaluates keeps
  the cap to itself: its drain lets the jobs finish first.
* **Terminate**: only a drained node. A node whose Ray node is still alive is drained
  (PREEMPTION, deadline = ``scaling_rules.scale_down.drain_timeout_seconds`` of
  scheduler.json) and waited for, then the driver deletes the instance and the ledger
  row is closed.
* Thread-safe: one lock around the state file and the ledger.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from ray.autoscaler.command_runner import CommandRunnerInterface
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UP_TO_DATE,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_NAME,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import Connection, Engine

from autoscaler import admission, bootstrap, cost, orders, placement, policy, statefile
from autoscaler.config import PROVIDERS, ProviderName, SchedulerConfig
from autoscaler.config import load as load_scheduler_config
from autoscaler.drivers.base import Driver, DriverError, Instance, LaunchRequest
from autoscaler.snapshot import QueueState, queue_state
from autoscaler.state import epoch, read_state, to_datetime, write_state
from hypermedia import logs
from hypermedia.clock import age_text
from hypermedia.config_errors import (
    chosen_error,
    is_unknown_key,
    misspelt_required_key,
    unknown_key_problem,
)
from hypermedia.db import tables as t
from hypermedia.db.engine import transaction
from hypermedia.errors import ConfigError, DatabaseUnavailable
from hypermedia.jobs.states import JobStatus

log = logging.getLogger(__name__)

REFUSAL_REPEAT_SECONDS = 300.0
SPOT_WATCH: dict[str, str] = {"aws": "aws", "google": "gcp"}  # whose notice a spot node reads
LISTING_GRACE_SECONDS = 120.0  # a launched instance may be missing from a listing this long
# A launch's ledger row that no listing has shown (a launch that may have made an
# instance, or one whose process died) is closed this long after the launch began.
LAUNCH_SETTLE_SECONDS = 900.0
HEAD_HOME = "home"
# The node's resources for `ray start` (ray_constants.RESOURCES_ENVIRONMENT_VARIABLE).
RESOURCES_VARIABLE = "RAY_OVERRIDE_RESOURCES"
STOP_HEAD_TIMEOUT_SECONDS = 180.0  # the services get 120 s (autoscaler.head), then Ray
# scheduler_state row: the head's Ray node id (the VPS), written by the head's services
# (:mod:`autoscaler.head`): the workers on it, or outside Ray, are the VPS workers.
VPS_NODE = "vps_node"
# The daily cap's backstop (see the module docstring): how often a listing checks, and
# how long the scheduler may go without a turn before the provider stops the cloud
# itself (unless the cluster yaml says scheduler_stale_seconds).
BACKSTOP_CHECK_SECONDS = 60.0
SCHEDULER_STALE_SECONDS = 300.0
STALE_INTERVALS = 5  # the default is at least this many evaluation intervals
MIN_STALE_INTERVALS = 3  # a leader's lease: a handover takes this long
LIVE_WORKER_STATUSES = ("active", "draining")  # a workers row not yet gone


class DriverSettings(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: str  # aws | google | ionos | local


class ProviderSettings(BaseModel):
    """The ``provider:`` section of the cluster yaml (Ray's own keys are dropped)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    head_ip: str
    ray_port: int = Field(default=6390, ge=1024, le=65535)
    state_dir: str
    scheduler_config: str | None = None  # else HYPERMEDIA_SCHEDULER_CONFIG / the default
    database_url: str | None = None  # else the hypermedia settings (HYPERMEDIA_*)
    token_path: str | None = None  # the head's Ray token; default <state_dir>/ray-auth-token
    node_token_path: str = bootstrap.DEFAULT_TOKEN_PATH  # where a burst node finds it
    token_command: str | None = None  # run on a burst node to write the token there
    # The worker image a burst node runs Ray in (docker/host/ray), e.g.
    # registry.example.com/hypermedia-worker:3f2c1ab; else the machine image's own
    # HM_WORKER_IMAGE (/etc/default/hypermedia-worker).
    worker_image: str | None = Field(default=None, pattern=bootstrap.IMAGE_REFERENCE)
    node_num_cpus: int | None = Field(default=None, ge=1)
    # With the daily cap reached, the provider terminates the cloud nodes itself once the
    # scheduler has recorded no turn for this long; default: SCHEDULER_STALE_SECONDS or
    # five evaluation intervals, whichever is longer.
    scheduler_stale_seconds: int | None = Field(default=None, ge=60, le=86_400)
    drivers: dict[ProviderName, DriverSettings] = Field(default_factory=dict)


RAY_KEYS = {
    "type",
    "module",
    "disable_node_updaters",
    "use_internal_ips",
    "cache_stopped_nodes",
    "_config_cache_path",
}


def parse_settings(provider_config: Mapping[str, Any]) -> ProviderSettings:
    data = {k: v for k, v in provider_config.items() if k not in RAY_KEYS}
    if "drain_timeout_seconds" in data:
        raise ConfigError(
            "provider.drain_timeout_seconds",
            "moved to scheduler.json (scaling_rules.scale_down.drain_timeout_seconds),"
            " which the scheduler reads too",
        )
    try:
        settings = ProviderSettings.model_validate(data)
    except ValidationError as exc:
        first = chosen_error(exc)
        loc: tuple[int | str, ...] = first["loc"]
        if is_unknown_key(first):
            problem = unknown_key_problem(exc, first, ProviderSettings)
        elif (misspelt := misspelt_required_key(exc, ProviderSettings)) is not None:
            loc, problem = misspelt  # a driver's ``tpye``: its options allow any key
        else:
            problem = first["msg"]
        # "[key]": pydantic's mark for a mapping's key (a driver name) that is refused.
        where = ".".join(str(part) for part in loc if part != "[key]")
        raise ConfigError(f"provider.{where}", problem) from None
    if settings.ray_port == 6379:
        raise ConfigError("provider.ray_port", "6379 is Redis's port: choose another")
    _refuse_secrets(data)
    return settings


# Ray copies the provider section where others may read it: its config cache
# ($TMPDIR/ray-config-<hash>, 0644), the head's ~/ray_bootstrap_config.yaml, the GCS.
_COPIED = (
    "Ray copies the provider section into files others may read (its config cache in"
    " the temp dir, the head's bootstrap config)"
)


def _refuse_secrets(section: Mapping[str, Any], where: str = "provider") -> None:
    """A password in ``database_url``, or any key named like a secret (``*_secret``,
    ``*_key``, ``*_token``, ``*_password``), is refused, naming the key, never the value."""
    from hypermedia.config import is_secret_setting
    from hypermedia.embedded import shown_url

    for key, value in section.items():
        path = f"{where}.{key}"
        if isinstance(value, Mapping):
            _refuse_secrets(value, path)
        elif is_secret_setting(str(key)):
            raise ConfigError(path, f"a secret, and {_COPIED}: give it to the head otherwise")
        elif isinstance(value, str) and "@" in value and shown_url(value) != value:
            raise ConfigError(
                path,
                f"holds a password, and {_COPIED}: leave database_url out (the head's"
                " settings, HYPERMEDIA_DATABASE_URL in a settings file only its user reads,"
                " are used) or give the password through PGPASSFILE",
            )


def scheduler_stale_seconds(settings: ProviderSettings, config: SchedulerConfig) -> float:
    """How long the scheduler may go without a turn before the provider's backstop
    acts at the daily cap. A setting shorter than :data:`MIN_STALE_INTERVALS` evaluation
    intervals is refused: the backstop would act between a live scheduler's turns."""
    interval = config.evaluation_interval_seconds
    if settings.scheduler_stale_seconds is None:
        return max(SCHEDULER_STALE_SECONDS, STALE_INTERVALS * interval)
    if settings.scheduler_stale_seconds < MIN_STALE_INTERVALS * interval:
        raise ConfigError(
            "provider.scheduler_stale_seconds",
            f"{settings.scheduler_stale_seconds} is less than {MIN_STALE_INTERVALS} of"
            f" scheduler.json's evaluation intervals ({interval} s): the provider would"
            " stop the cloud between a running scheduler's turns",
        )
    return float(settings.scheduler_stale_seconds)


def build_driver(
    name: ProviderName, settings: DriverSettings, config: SchedulerConfig, state_dir: Path
) -> Driver:
    """The driver for one provider name of scheduler.json (``type: local`` stands in for
    any of them on one machine)."""
    options = {k: v for k, v in (settings.model_extra or {}).items()}
    kind = settings.type
    if kind == "local":
        from autoscaler.drivers.local import LocalDriver

        options.setdefault("state_dir", str(state_dir / "local"))
        return LocalDriver(options, label=name)
    if kind != {"aws": "aws", "google": "google", "ionos": "ionos"}[name]:
        raise ConfigError(f"provider.drivers.{name}.type", f"{kind!r} cannot serve {name}")
    if name == "aws":
        from autoscaler.drivers.aws import AwsDriver

        return AwsDriver(config.cloud_providers.aws, options)
    if name == "google":
        from autoscaler.drivers.gcp import GcpDriver

        return GcpDriver(config.cloud_providers.google, options)
    from autoscaler.drivers.ionos import IonosDriver

    return IonosDriver(config.cloud_providers.ionos, options)


def queue_of(resources: Mapping[str, float]) -> str:
    queues = [key.removeprefix("queue_") for key in resources if key.startswith("queue_")]
    if len(queues) != 1:
        raise ValueError(f"a burst node type needs exactly one queue_<name> resource: {resources}")
    return queues[0]


class HypermediaNodeProvider(NodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        logs.configure_package("autoscaler")  # in Ray's autoscaler process: our format
        super().__init__(provider_config, cluster_name)
        self.settings = parse_settings(provider_config)
        self.cluster = cluster_name.lower()
        self.state_dir = Path(self.settings.state_dir).expanduser()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config = load_scheduler_config(self.settings.scheduler_config)
        self.stale_seconds = scheduler_stale_seconds(self.settings, self.config)
        self._backstop_checked_at = float("-inf")
        for name in self.settings.drivers:
            if not self.config.cloud_providers.get(name).enabled:
                log.warning("driver for %s configured, but scheduler.json does not enable it", name)
        self._lock = threading.RLock()
        self._drivers: dict[ProviderName, Driver] | None = None
        self._engine: Engine | None = None

    # -- lazily built parts -------------------------------------------------------------------

    @property
    def drivers(self) -> dict[ProviderName, Driver]:
        with self._lock:
            if self._drivers is None:
                self._drivers = {
                    name: build_driver(
                        name, self.settings.drivers[name], self.config, self.state_dir
                    )
                    for name in PROVIDERS
                    if name in self.settings.drivers
                }
            return self._drivers

    @property
    def engine(self) -> Engine:
        with self._lock:
            if self._engine is None:
                from hypermedia.config import load_settings
                from hypermedia.db.engine import settings_engine

                # The record's connection settings are the platform's (HYPERMEDIA_*):
                # its limits, its dead-peer time, its pooler's mode.
                self._engine = settings_engine(load_settings(), self.settings.database_url)
            return self._engine

    @property
    def head_address(self) -> str:
        return f"{self.settings.head_ip}:{self.settings.ray_port}"

    @property
    def token_path(self) -> Path:
        return Path(self.settings.token_path or self.state_dir / "ray-auth-token").expanduser()

    # -- the node file (Ray's tags for every node, shared with the other process) --------------

    @contextlib.contextmanager
    def _nodes(self) -> Iterator[dict[str, dict[str, Any]]]:
        with self._lock, statefile.locked_json(self.state_dir / "nodes.json") as nodes:
            yield nodes

    @contextlib.contextmanager
    def _launches(self) -> Iterator[dict[str, dict[str, str]]]:
        """Tags of the launches under way, by request id, in a file every provider object
        of the cluster reads (``ray up``'s, the monitor's, the head services'): a listing
        that shows an instance before its create_node has recorded it must not adopt it
        without them (autoscaler v1 would find no launch hash and terminate it as
        "outdated"). Taken inside :meth:`_nodes` or alone, never the other way round."""
        with self._lock, statefile.locked_json(self.state_dir / "launching.json") as launching:
            yield launching

    def _launch_over(self, request_id: str) -> None:
        with self._launches() as launching:
            launching.pop(request_id, None)

    def _reconcile(self, nodes: dict[str, dict[str, Any]]) -> None:
        """Bring the node file and the ledger in line with what the clouds report."""
        now = time.time()
        for name, driver in self.drivers.items():
            listed = driver.instances(self.cluster)
            if isinstance(listed, DriverError):
                log.warning("listing %s instances failed: %s", name, listed)
                continue
            live = [i for i in listed if i.state not in ("terminating", "terminated")]
            by_request = {i.request_id: i for i in live}
            # Read once, after the listing: a launch records its tags before it asks the
            # cloud, so every listed instance of a launch under way has them here.
            with self._launches() as launching:
                launches = dict(launching)
            for node_id, record in list(nodes.items()):
                if record.get("provider") != name:
                    continue
                if record.get("request_id") in by_request:
                    record.pop("missing_since", None)
                    continue
                if now - record.get("created_at", 0) <= LISTING_GRACE_SECONDS:
                    continue
                # Gone only once missing for a while: one listing may miss an instance.
                missing_since = record.setdefault("missing_since", now)
                if now - missing_since > LISTING_GRACE_SECONDS:
                    log.info("%s: its instance is gone", node_id)
                    self._close_ledger(name, _ledger_ids(record), now)
                    del nodes[node_id]
            for instance in live:
                node_id = f"hm-{instance.request_id}"
                # Not recorded: being launched here, by the other process, before a
                # restart, or by a launch that failed after the cloud made the instance.
                if node_id not in nodes:
                    tags = launches.get(instance.request_id, {})
                    nodes[node_id] = self._record(name, instance, tags, now)
            mine = any(r.get("provider") == name for r in nodes.values())
            if live or mine or launches:  # else nothing to settle (nor, at `ray up`, a record)
                try:
                    self._settle_ledger(name, live, nodes, set(launches), now)
                except DatabaseUnavailable as exc:  # the next listing tries again
                    log.warning("the ledger could not be settled with %s: %s", name, exc)

    def _settle_ledger(
        self,
        provider: ProviderName,
        live: list[Instance],
        nodes: Mapping[str, Mapping[str, Any]],
        under_way: set[str],
        now: float,
    ) -> None:
        """The ledger counts every instance the cloud lists, once, and nothing else.

        A listed instance without an open row (a launch that answered an error although
        the cloud made the instance, a process that died between the launch and the
        row's update, an instance launched before the ledger was kept) gets one, from
        its launch time (its tag, else when the cloud says it created the instance: see
        :meth:`Instance.from_tags`) and its tags' price; a row still under the launch's
        request id takes the instance's id. An open row that neither a listing nor a
        node record accounts for is closed once its launch is settled:
        :data:`LISTING_GRACE_SECONDS` after it began, or :data:`LAUNCH_SETTLE_SECONDS`
        while a launch of its request id is still on record (under way, or failed in a
        way that may have made an instance)."""
        s = t.cloud_spend
        listed_ids = {i.instance_id for i in live} | {i.request_id for i in live}
        recorded = {
            key for r in nodes.values() if r.get("provider") == provider for key in _ledger_ids(r)
        }
        settled: list[str] = []
        with self._lock, transaction(self.engine) as conn:
            rows = conn.execute(
                select(
                    s.c.spend_id,
                    s.c.instance_id,
                    s.c.request_id,
                    s.c.launched_at,
                    s.c.terminated_at,
                ).where(
                    (s.c.provider == provider)
                    & (s.c.terminated_at.is_(None) | s.c.instance_id.in_(sorted(listed_ids)))
                )
            ).all()
            by_id = {r.instance_id: r for r in rows}
            for instance in live:
                found = by_id.get(instance.instance_id) or by_id.get(instance.request_id)
                if found is not None and found.terminated_at is None:
                    # The row takes the instance's id, and keeps its request id (a row
                    # from before it was kept gets it here: a bill may name only that).
                    changes: dict[str, Any] = {}
                    if found.instance_id != instance.instance_id:
                        changes["instance_id"] = instance.instance_id
                    if found.request_id is None and instance.request_id:
                        changes["request_id"] = instance.request_id[:64]
                    if changes:
                        conn.execute(
                            s.update().where(s.c.spend_id == found.spend_id).values(**changes)
                        )
                    continue
                if found is not None:  # closed while the instance still runs: it never stopped
                    log.warning(
                        "instance %s is running but its ledger row was closed: reopened",
                        instance.instance_id,
                        extra={"action": "ledger_reopened", "instance_id": instance.instance_id},
                    )
                    conn.execute(
                        s.update()
                        .where(s.c.spend_id == found.spend_id)
                        .values(
                            instance_id=instance.instance_id,
                            request_id=found.request_id or instance.request_id[:64] or None,
                            terminated_at=None,
                            # Running on: its bill is not settled after all.
                            reconciled_at=None,
                            billed_microusd=None,
                        )
                    )
                    continue
                launched = instance.launched_at if instance.launched_at > 0 else now
                price = instance.price_cents_per_hour
                priced = "its tags' price"
                if price <= 0:
                    # No price tag (started by hand with the cluster's tag, a tag
                    # removed): counted at the on-demand list price, not for free.
                    price = self._list_price(provider)
                    priced = "no price tag: the on-demand list price"
                elif instance.spot:  # a tag from before spot was counted at its maximum
                    most = self.at_most(policy.Option(provider, True, price)).cents_per_hour
                    if most > price:
                        price, priced = most, "spot: the most it may bill"
                log.warning(
                    "instance %s (request %s) had no ledger row: opened one from %s at %s/h (%s)",
                    instance.instance_id,
                    instance.request_id,
                    to_datetime(launched).isoformat(),
                    cost.money(price),
                    priced,
                    extra={"action": "ledger_opened", "instance_id": instance.instance_id},
                )
                conn.execute(
                    s.insert().values(
                        provider=provider,
                        instance_id=instance.instance_id,
                        request_id=instance.request_id[:64] or None,
                        node_type=instance.node_type[:64],
                        region="",
                        spot=instance.spot,
                        price_per_hour_microusd=cost.to_microusd(price),
                        launched_at=to_datetime(launched),
                    )
                )
            accounted = listed_ids | recorded
            for row in rows:
                if row.terminated_at is not None or row.instance_id in accounted:
                    continue
                age = now - epoch(row.launched_at)
                wait = (
                    LAUNCH_SETTLE_SECONDS if row.instance_id in under_way else LISTING_GRACE_SECONDS
                )
                if age <= wait:
                    continue
                log.warning(
                    "ledger row %s closed: no listing shows an instance of it %.0f s after"
                    " its launch began",
                    row.instance_id,
                    age,
                    extra={"action": "ledger_closed", "instance_id": row.instance_id},
                )
                conn.execute(
                    s.update()
                    .where(s.c.spend_id == row.spend_id)
                    .values(terminated_at=to_datetime(now))
                )
                settled.append(row.instance_id)
        # A launch's tags are needed until its node is recorded (it adopts them), and
        # not for a launch whose row was closed as settled.
        adopted = {i.request_id for i in live if f"hm-{i.request_id}" in nodes}
        if (adopted | set(settled)) & under_way:
            with self._launches() as launching:
                for request_id in adopted | set(settled):
                    launching.pop(request_id, None)

    def _list_price(self, provider: ProviderName) -> float:
        """The provider's on-demand price per hour, in cents: what an instance of it
        costs (a spot one at most, by EC2's default maximum). The drivers' on-demand
        price is configured, never fetched; one that cannot answer counts as the hourly
        cap: an instance of unknown price may use all of it."""
        on_demand = self.drivers[provider].price(False)
        if isinstance(on_demand, float):
            return on_demand
        log.warning(
            "%s has no on-demand price (%s): counted at the hourly cap", provider, on_demand
        )
        return float(self.config.cost_limits.max_hourly_spend_cents)

    def _record(
        self, provider: ProviderName, instance: Instance, tags: Mapping[str, str], now: float
    ) -> dict[str, Any]:
        return {
            "provider": provider,
            "driver": instance.provider,
            "instance_id": instance.instance_id,
            "request_id": instance.request_id,
            "ip": instance.private_ip,
            "queue": instance.queue,
            "spot": instance.spot,
            "price": instance.price_cents_per_hour,
            "created_at": now,
            "tags": {
                TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
                TAG_RAY_USER_NODE_TYPE: instance.node_type,
                TAG_RAY_NODE_NAME: f"ray-{self.cluster}-worker",
                TAG_RAY_NODE_STATUS: STATUS_UP_TO_DATE,
                **tags,
            },
        }

    @contextlib.contextmanager
    def _launch_lock(self) -> Iterator[None]:
        with self._lock, statefile.exclusive(self.state_dir / "launch.lock"):
            yield

    # -- NodeProvider: reading -------------------------------------------------------------

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        with self._nodes() as nodes:
            self._reconcile(nodes)
            listed = {node_id: json.loads(json.dumps(record)) for node_id, record in nodes.items()}
        stopped = self._backstop(listed)
        return [
            node_id
            for node_id, record in sorted(listed.items())
            if node_id not in stopped
            and all(record["tags"].get(k) == v for k, v in tag_filters.items())
        ]

    # -- the daily cap without the scheduler -------------------------------------------------

    def _backstop(self, nodes: Mapping[str, Mapping[str, Any]]) -> set[str]:
        """At most every :data:`BACKSTOP_CHECK_SECONDS`: with the daily cap reached and
        no turn of the scheduler for :attr:`stale_seconds`, lock and terminate the cloud
        nodes (see the module docstring). The nodes it terminated."""
        cloud = {n: r for n, r in nodes.items() if r.get("driver") is not None}
        now = time.time()
        if not cloud or now - self._backstop_checked_at < BACKSTOP_CHECK_SECONDS:
            return set()
        self._backstop_checked_at = now
        try:
            reason = self._backstop_reason(now, len(cloud))
        except DatabaseUnavailable as exc:  # the next check tries again
            log.warning("the daily cap could not be checked: %s", exc)
            return set()
        if reason is None:
            return set()
        stopped: set[str] = set()
        done: dict[str, bool] = {}
        for node_id, record in sorted(cloud.items()):
            log.error(
                "terminating %s (%s): %s",
                node_id,
                record.get("instance_id"),
                reason,
                extra={"action": "backstop_terminate", "queue": record.get("queue")},
            )
            try:
                self._delete(node_id, record)
            except Exception:  # the next check tries again
                log.exception("terminating %s failed", node_id)
                done[node_id] = False
                continue
            done[node_id] = True
            stopped.add(node_id)
        try:
            with transaction(self.engine) as conn:
                for node_id, applied in done.items():
                    record = cloud[node_id]
                    self._record_decision(
                        conn,
                        "terminate",
                        f"{reason} ({node_id}, {record.get('instance_id')})",
                        time.time(),
                        queue=record.get("queue"),
                        provider=record.get("provider"),
                        applied=applied,
                        instance_id=record.get("instance_id"),
                        mode="vps_only",
                    )
        except DatabaseUnavailable as exc:
            log.warning("the backstop's decisions were not recorded: %s", exc)
        return stopped

    def _backstop_reason(self, now: float, nodes: int) -> str | None:
        """Why the cloud nodes must go now, the lock written (None: they need not, or
        the scheduler is there to drain them)."""
        from autoscaler.scheduler import COST_LOCK, last_turn

        # Under the launch lock: no launch is admitted between the verdict and the lock.
        with self._launch_lock(), transaction(self.engine) as conn:
            verdict, _ = self._verdict(conn, now)
            if not verdict.locked:
                return None
            turn = last_turn(conn)
            if turn is not None and now - turn <= self.stale_seconds:
                log.debug(
                    "the daily cap is reached: the scheduler (last turn %.0f s ago) drains",
                    now - turn,
                )
                return None
            since = (
                "The scheduler has never recorded a turn"
                if turn is None
                else f"The scheduler's last turn was {age_text(now - turn)} ago"
            )
            why = verdict.lock_reason or next(iter(verdict.reasons))
            reason = (
                f"{why[0].upper()}{why[1:]}. {since} (stale after {self.stale_seconds:.0f} s):"
                f" the node provider terminates the {nodes} cloud node{'s' if nodes != 1 else ''}"
                " itself, without a drain"
            )
            if verdict.lock_reason is not None:  # what the scheduler's turn would persist
                write_state(conn, COST_LOCK, {"at": now, "reason": reason}, now)
                self._record_decision(conn, "lock", reason, now, mode="vps_only")
            return reason

    def records(self, tag_filters: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
        """Every node's record (reconciled with the clouds first), for the scheduler."""
        with self._nodes() as nodes:
            self._reconcile(nodes)
            return {
                node_id: json.loads(json.dumps(record))
                for node_id, record in nodes.items()
                if all(record["tags"].get(k) == v for k, v in (tag_filters or {}).items())
            }

    def is_running(self, node_id: str) -> bool:
        with self._nodes() as nodes:
            return node_id in nodes

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self._nodes() as nodes:
            return dict(nodes[node_id]["tags"]) if node_id in nodes else {}

    def external_ip(self, node_id: str) -> str:
        return self.internal_ip(node_id)

    def internal_ip(self, node_id: str) -> str:
        with self._nodes() as nodes:
            record = nodes.get(node_id)
        if record is None:
            raise KeyError(node_id)
        return str(record.get("ip") or self.settings.head_ip)

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._nodes() as nodes:
            if node_id in nodes:
                nodes[node_id]["tags"].update(tags)

    # -- NodeProvider: launching -------------------------------------------------------------

    def create_node(
        self, node_config: dict[str, Any], tags: dict[str, str], count: int
    ) -> dict[str, Any] | None:
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(
        self,
        node_config: dict[str, Any],
        tags: dict[str, str],
        count: int,
        resources: dict[str, float],
        labels: dict[str, str],
    ) -> dict[str, Any] | None:
        if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            return self._adopt_head(tags)
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "")
        queue = queue_of(resources or node_config.get("resources", {}))
        launched = {}
        for index in range(count):
            seed = f"{tags.get(TAG_RAY_LAUNCH_REQUEST) or os.urandom(8).hex()}:{index}"
            request_id = "r" + hashlib.sha1(seed.encode(), usedforsecurity=False).hexdigest()[:20]
            launched[f"hm-{request_id}"] = self._launch(
                queue, node_type, dict(tags), resources, request_id
            )
        return launched

    def _adopt_head(self, tags: Mapping[str, str]) -> dict[str, Any]:
        node_id = f"{self.cluster}-head"
        with self._nodes() as nodes:
            nodes[node_id] = {
                "provider": None,
                "driver": None,
                "instance_id": node_id,
                "request_id": None,
                "ip": self.settings.head_ip,
                "queue": None,
                "created_at": time.time(),
                "tags": dict(tags),
            }
        log.info("head node %s is this machine (%s)", node_id, self.settings.head_ip)
        return {node_id: {}}

    def _launch(
        self,
        queue: str,
        node_type: str,
        tags: dict[str, str],
        resources: Mapping[str, float],
        request_id: str,
    ) -> Instance:
        node_id = f"hm-{request_id}"
        # The check and the ledger row that makes the launch count are one step, under a
        # lock every provider object of this cluster shares (threads and processes):
        # two launches can never both fit in the room that one was left. The clock is read
        # inside it: launches let through while this one waited are in its past.
        with self._launch_lock(), transaction(self.engine) as conn:
            now = time.time()
            # The same launch asked again (Ray retrying it, or the other provider object
            # of the cluster): admitted and counted once already, so its row stands for
            # it and the driver answers the instance it made (idempotent by request id).
            # Admitting it anew counted the instance twice and failed on the row's rename.
            choice, refusal = self._launched_before(conn, request_id), None
            if choice is None:
                choice, refusal = self._choose(conn, queue, node_type, now, request_id)
                if choice is not None and refusal is None:
                    # Opened before the launch: a crash between the two never hides spend.
                    self._open_ledger(conn, choice, node_type, request_id, now)
            if refusal is not None or choice is None:
                refusal = refusal or "no provider"
                self._record_refusal(conn, queue, node_type, refusal, now)
                orders.finish(conn, request_id, now)
        if refusal is not None or choice is None:  # raised after the refusal is committed
            raise NodeLaunchException(
                "cost_guard", f"refused launching a {node_type} node: {refusal}", None
            )
        driver = self.drivers[choice.provider]
        script = bootstrap.user_data(
            node_id=node_id,
            node_type=node_type,
            head_address=self.head_address,
            resources={k: float(v) for k, v in resources.items()},
            token_path=self.settings.node_token_path,
            token_command=self.settings.token_command,
            worker_image=self.settings.worker_image,
            num_cpus=self.settings.node_num_cpus,
            spot_watch=SPOT_WATCH.get(choice.provider) if choice.spot else None,
        )
        if driver.name == "local":  # the local node reads the head's token file
            script = script.replace(
                shlex.quote(self.settings.node_token_path), shlex.quote(str(self.token_path))
            )
        request = LaunchRequest(
            request_id=request_id,
            cluster=self.cluster,
            node_type=node_type,
            queue=queue,
            spot=choice.spot,
            price_cents_per_hour=choice.cents_per_hour,
            launched_at=now,
            user_data=script,
        )
        with self._launches() as launching:
            launching[request_id] = dict(tags)
        try:
            result = driver.launch(request)
        except BaseException:
            # Its row and tags stay: the launch may have made an instance, which the next
            # listing adopts; else the row closes once the launch has settled.
            self._finish_order(request_id)
            raise
        if isinstance(result, DriverError):
            if result.maybe_launched:
                # The cloud may hold an instance of this request: its row stays open and
                # its tags stay on record until a listing shows it (it is adopted) or a
                # settling time passes without one (the row closes): _settle_ledger.
                log.warning(
                    "launch %s: %s; its spend stays on the ledger until a listing shows"
                    " whether the instance exists",
                    request_id,
                    result,
                    extra={"action": "launch_unsettled", "queue": queue},
                )
                self._finish_order(request_id)
            else:
                self._launch_over(request_id)
                with self._lock, transaction(self.engine) as conn:
                    self._close_ledger_row(conn, choice.provider, [request_id], now)
                    orders.finish(conn, request_id, time.time())
            raise NodeLaunchException(result.code, f"{choice.label}: {result}", None)
        with self._lock, transaction(self.engine) as conn:
            conn.execute(
                t.cloud_spend.update()
                .where(
                    (t.cloud_spend.c.provider == choice.provider)
                    & (t.cloud_spend.c.instance_id == request_id)
                )
                .values(instance_id=result.instance_id)
            )
        with self._nodes() as nodes:
            nodes[node_id] = self._record(choice.provider, result, tags, now)
        self._launch_over(request_id)  # recorded: a listing finds it with its tags
        self._finish_order(request_id)  # the record counts the worker now
        log.info(
            "launched %s for queue %s: %s (%s)",
            node_id,
            queue,
            choice.label,
            result.instance_id,
            extra={"action": "launch", "queue": queue},
        )
        return result

    def _launched_before(self, conn: Connection, request_id: str) -> policy.Option | None:
        """Where the launch ``request_id`` went, if its ledger row is open (None: it is
        a new launch, or its row was closed: it failed, or its instance is gone)."""
        s = t.cloud_spend
        row = conn.execute(
            select(s.c.provider, s.c.spot, s.c.price_per_hour_microusd).where(
                (s.c.request_id == request_id) & s.c.terminated_at.is_(None)
            )
        ).first()
        if row is None or row.provider not in self.settings.drivers:
            return None
        return policy.Option(
            row.provider, row.spot, cost.from_microusd(row.price_per_hour_microusd)
        )

    def _finish_order(self, request_id: str) -> None:
        """End the order a launch held (:func:`autoscaler.orders.finish`). A record that
        cannot be reached here does not fail the launch or hide its own error: the order
        then expires (:data:`autoscaler.orders.ORDER_TTL_SECONDS`)."""
        try:
            with transaction(self.engine) as conn:
                orders.finish(conn, request_id, time.time())
        except Exception as exc:
            log.warning("launch %s: its order was not ended: %s", request_id, exc)

    def _choose(
        self, conn: Connection, queue: str, node_type: str, now: float, request_id: str
    ) -> tuple[policy.Option | None, str | None]:
        """Where the next node of ``queue`` goes, or why none may be launched. The
        order it follows stays, marked with ``request_id``, until the launch is over."""
        config = self.config
        verdict, rows = self._verdict(conn, now)
        # A node type serves one queue: the ledger's open rows of this one are the
        # queue's cloud instances (draining ones too, as the policy counts them).
        cloud = sum(1 for r in rows if r.node_type == node_type)
        admitted = admission.admit(
            config, queue, verdict=verdict, queue_workers=vps_workers(conn, queue) + cloud
        )
        if admitted.refusal is not None:
            return None, admitted.refusal
        instances: dict[ProviderName, int] = {}
        for r in rows:
            instances[r.provider] = instances.get(r.provider, 0) + 1
        providers = [n for n in config.burst_providers(queue) if n in self.settings.drivers]
        room = admission.provider_room(config, providers, instances)
        order = orders.take(conn, queue, now, launching=request_id)
        if order is not None and room.get(order.provider, 0) > 0:  # type: ignore[call-overload]
            choice = policy.Option(order.provider, order.spot, order.cents_per_hour)  # type: ignore[arg-type]
        else:
            # No order (Ray launched for its own reasons, or the order expired): routed by
            # the seed's table from the jobs waiting, priority 1-3 on demand above all.
            # The cheapest the caps allow at the most it may bill, as the policy picks.
            offers = self.offers()
            how = policy.route(queue, config.queues[queue], waiting(conn, queue, now))
            choices = policy.options(config, queue, offers)
            cheapest = policy.pick(choices, how.kind, room)
            if cheapest is None:
                full = [name for name, left in room.items() if left <= 0]
                return None, (
                    f"every provider for {queue} is at max_instances ({', '.join(full)})"
                    if full
                    else f"no provider offers an instance for {queue}"
                )
            choice = policy.pick(choices, how.kind, room, verdict.budget) or cheapest
        choice = self.at_most(choice)
        refusal = verdict.budget.refusal(choice.cents_per_hour)
        if refusal is not None:
            return None, refusal
        return choice, None

    def at_most(self, choice: policy.Option) -> policy.Option:
        """The choice priced at the most it may bill an hour, which the caps count: the
        policy's own rule (:func:`autoscaler.policy.at_most`), with the provider's
        on-demand list price. Its market price now stays the quoted one, for the bill's
        reconciliation."""
        if not choice.spot:
            return choice
        return policy.at_most(self.config, choice, self._list_price(choice.provider))

    def _verdict(self, conn: Connection, now: float) -> tuple[cost.GuardVerdict, list[Any]]:
        """The cost guard's verdict on the ledger now, as the policy reaches it, and the
        ledger's open rows (provider, node_type, launched_at, price_per_hour_microusd)."""
        from autoscaler.scheduler import COST_LOCK, ledger_spend

        lock = read_state(conn, COST_LOCK)
        s = t.cloud_spend
        rows = conn.execute(
            select(s.c.provider, s.c.node_type, s.c.launched_at, s.c.price_per_hour_microusd).where(
                s.c.terminated_at.is_(None)
            )
        ).all()
        alerted = read_state(conn, "alerted") or {}
        spend = ledger_spend(
            conn, now, lock is not None, alerted.get("day") == to_datetime(now).date().isoformat()
        )
        launches = conn.execute(
            select(s.c.launched_at).where(
                s.c.launched_at > to_datetime(now - cost.LAUNCH_WINDOW_SECONDS)
            )
        ).scalars()
        committed = sum(cost.from_microusd(r.price_per_hour_microusd) for r in rows)
        verdict = cost.guard(
            self.config.cost_limits,
            spend,
            now=now,
            committed_cents_per_hour=committed,
            launches=[epoch(at) for at in launches],
            max_launches=cost.launch_rate_cap(self.config.cloud_providers),
            stop_horizon_seconds=policy.stop_horizon_seconds(self.config),
        )
        return verdict, list(rows)

    def offers(self) -> dict[ProviderName, Any]:
        from autoscaler.snapshot import Offer

        found: dict[ProviderName, Any] = {}
        for name, driver in self.drivers.items():
            on_demand = driver.price(False)
            if isinstance(on_demand, DriverError):
                log.warning("%s price: %s", name, on_demand)
                continue
            spot = driver.price(True) if self.config.cloud_providers.spot_allowed(name) else None
            found[name] = Offer(name, on_demand, spot if isinstance(spot, float) else None)
        return found

    def _record_refusal(
        self, conn: Connection, queue: str, node_type: str, why: str, now: float
    ) -> None:
        reason = f"Refused launching a {node_type} node: {why}"
        d = t.scheduler_decisions
        recent = conn.execute(
            select(func.count())
            .select_from(d)
            .where(
                (d.c.reason == reason)
                & (d.c.decided_at > to_datetime(now - REFUSAL_REPEAT_SECONDS))
            )
        ).scalar_one()
        log.warning("%s", reason, extra={"action": "launch_refused", "queue": queue})
        if recent:
            return
        self._record_decision(conn, "hold", reason, now, queue=queue)

    def _record_decision(
        self,
        conn: Connection,
        action: str,
        reason: str,
        now: float,
        *,
        queue: str | None = None,
        provider: str | None = None,
        applied: bool = True,
        instance_id: str | None = None,
        mode: str | None = None,
    ) -> None:
        """A ``scheduler_decisions`` row of the provider's own (``details.source``)."""
        details: dict[str, Any] = {"source": "node_provider", "cluster": self.cluster}
        if instance_id is not None:
            details["instance_id"] = instance_id
        conn.execute(
            t.scheduler_decisions.insert().values(
                decided_at=to_datetime(now),
                mode=mode or self.config.mode,
                queue=queue,
                action=action,
                count=1,
                provider=provider,
                reason=reason,
                details=details,
                applied=applied,
            )
        )

    # -- the ledger --------------------------------------------------------------------------

    def _open_ledger(
        self, conn: Connection, choice: policy.Option, node_type: str, request_id: str, now: float
    ) -> None:
        provider_config = self.config.cloud_providers.get(choice.provider)
        region = str(
            getattr(provider_config, "region", None)
            or getattr(provider_config, "zone", None)
            or getattr(provider_config, "datacenter", None)
            or ""
        )
        conn.execute(
            t.cloud_spend.insert().values(
                provider=choice.provider,
                instance_id=request_id,
                request_id=request_id,
                node_type=node_type,
                region=region[:64],
                spot=choice.spot,
                price_per_hour_microusd=cost.to_microusd(choice.cents_per_hour),
                quoted_per_hour_microusd=(
                    None
                    if choice.quoted_cents_per_hour is None
                    else cost.to_microusd(choice.quoted_cents_per_hour)
                ),
                launched_at=to_datetime(now),
            )
        )

    def _close_ledger_row(
        self, conn: Connection, provider: str, ids: list[str], now: float
    ) -> None:
        """Close the open row of an instance, found by any of ``ids`` (its instance id,
        or its launch's request id: the row's id until the launch answered)."""
        s = t.cloud_spend
        conn.execute(
            s.update()
            .where(
                (s.c.provider == provider)
                & s.c.instance_id.in_([i for i in ids if i])
                & s.c.terminated_at.is_(None)
            )
            .values(terminated_at=to_datetime(now))
        )

    def _close_ledger(self, provider: str, ids: list[str], now: float) -> None:
        with self._lock, transaction(self.engine) as conn:
            self._close_ledger_row(conn, provider, ids, now)

    # -- NodeProvider: terminating -----------------------------------------------------------

    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        with self._nodes() as nodes:
            record = nodes.get(node_id)
        if record is None:
            return None
        if record.get("driver") is None:  # the head: this machine is not ours to delete
            self._stop_head()
            with self._nodes() as nodes:
                nodes.pop(node_id, None)
            return None
        said = self._drain(node_id)
        log.info("terminating %s: %s", node_id, said, extra={"action": "terminate"})
        self._delete(node_id, record)
        return None

    def _delete(self, node_id: str, record: Mapping[str, Any]) -> None:
        """Delete a node's instance (raises if the driver cannot), close its ledger row
        and forget it."""
        provider = record["provider"]
        driver = self.drivers[provider]
        problem = driver.terminate(record["instance_id"])
        if problem is not None:
            raise RuntimeError(f"terminating {node_id} ({record['instance_id']}): {problem}")
        self._close_ledger(provider, _ledger_ids(record), time.time())
        with self._nodes() as nodes:
            nodes.pop(node_id, None)

    def _stop_head(self) -> None:
        """``ray down`` ran ``ray stop`` on the head before it terminates the head, but
        swallows whatever kept that from running: stop the head's services and Ray here
        too (nothing to do when they are stopped), so nothing of the cluster is left."""
        try:
            result = subprocess.run(
                [sys.executable, "-m", "autoscaler.head", "stop"],
                env=head_environment(self),
                cwd=self.state_dir / HEAD_HOME,
                capture_output=True,
                text=True,
                timeout=STOP_HEAD_TIMEOUT_SECONDS,
                check=False,
            )
        except subprocess.TimeoutExpired:
            log.warning("stopping the head did not end in %.0f s", STOP_HEAD_TIMEOUT_SECONDS)
            return
        if result.returncode != 0:
            log.warning("stopping the head failed: %s", (result.stdout + result.stderr)[-2000:])

    def _drain(self, node_id: str) -> str:
        """Drain the node's Ray node (if it is alive) and wait, in a subprocess that carries
        the cluster's token (see :mod:`autoscaler.raynodes`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))
        deadline = self.config.scaling_rules.scale_down.drain_timeout_seconds
        try:
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "autoscaler.raynodes",
                    f"--address={self.head_address}",
                    f"--instance={node_id}",
                    f"--deadline={deadline}",
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=deadline + 60,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "the drain did not answer in time: terminating anyway"
        if result.returncode != 0:
            tail = (result.stderr or "").strip().splitlines()[-1:] or ["?"]
            return f"the drain failed ({tail[0]}): terminating anyway"
        return result.stdout.strip()

    # -- running commands on the head (this machine) ------------------------------------------

    def get_command_runner(
        self,
        log_prefix: str,
        node_id: str,
        auth_config: dict[str, Any],
        cluster_name: str,
        process_runner: Any,
        use_internal_ip: bool,
        docker_config: dict[str, Any] | None = None,
    ) -> CommandRunnerInterface:
        return LocalCommandRunner(self, log_prefix)

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Check the provider section (a bad one stops ``ray up`` naming the key) and make
        its paths absolute: the head's monitor reads the same config from elsewhere."""
        provider = cluster_config["provider"]
        for key in ("scheduler_config", "state_dir", "token_path"):
            if isinstance(provider.get(key), str):
                provider[key] = str(Path(provider[key]).expanduser().resolve())
        from hypermedia.config import load_settings

        settings = parse_settings(provider)
        # A bad scheduler.json too, and one naming a queue the head's settings lack (its
        # services would start Ray's head and actors, then refuse).
        config = load_scheduler_config(settings.scheduler_config, load_settings().queue_names)
        scheduler_stale_seconds(settings, config)
        check_node_types(cluster_config, config)
        return cluster_config


def head_resources(config: SchedulerConfig, declared: Mapping[str, Any]) -> dict[str, float]:
    """The head's Ray resources: what its node type ``declared`` but ``queue_<name>``,
    and one ``queue_<name>`` slot per pipeline actor the VPS runs
    (:func:`autoscaler.placement.vps_pools`): the head's services start exactly those
    actors, and the scheduler's ``request_resources`` counts the head's slots as the
    VPS's share, so Ray launches burst nodes for the rest."""
    from hypermedia.worker.cluster import queue_resources

    kept = {k: float(v) for k, v in declared.items() if not k.startswith("queue_")}
    return {**kept, **queue_resources(placement.vps_pools(config))}


def check_node_types(cluster_config: Mapping[str, Any], config: SchedulerConfig) -> None:
    """Each burst node type serves one queue of scheduler.json, and each queue has at
    most one node type: the provider admits a launch by the queue's workers, and counts
    a queue's cloud workers by its node type's ledger rows (two node types of one
    queue would each pass its max_workers). In a mode that launches, every
    cloud-enabled queue has a node type (its cloud workers, and in ``cloud_first`` part
    of its baseline, would find none). The head's ``queue_<name>`` resources, if the
    yaml gives any, are the VPS's pools (:func:`head_resources` sets them: other
    numbers would be ignored). A cluster yaml that breaks this stops ``ray up`` naming
    the node type."""
    from hypermedia.worker.cluster import queue_resources

    head = cluster_config.get("head_node_type")
    node_types = cluster_config.get("available_node_types") or {}
    head_declared = {
        k: float(v)
        for k, v in ((node_types.get(head) or {}).get("resources") or {}).items()
        if k.startswith("queue_")
    }
    vps = queue_resources(placement.vps_pools(config))
    if head_declared and head_declared != vps:

        def shown(resources: Mapping[str, float]) -> str:
            return ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) or "none"

        raise ConfigError(
            f"available_node_types.{head}.resources",
            f"{shown(head_declared)}, but the head advertises a queue_<name> slot per VPS"
            f" pipeline actor of scheduler.json (mode {config.mode}: {shown(vps)}); leave"
            " queue_<name> out of the head's resources",
        )
    served: dict[str, str] = {}
    for name, node_type in sorted(node_types.items()):
        if name == head:
            continue
        key = f"available_node_types.{name}.resources"
        resources = (node_type or {}).get("resources") or {}
        queues = sorted(k.removeprefix("queue_") for k in resources if k.startswith("queue_"))
        if len(queues) != 1:
            found = ", ".join(f"queue_{q}" for q in queues) or "none"
            raise ConfigError(key, f"a burst node type needs exactly one queue_<name> ({found})")
        queue = queues[0]
        if queue not in config.queues:
            known = ", ".join(config.queues)
            raise ConfigError(
                key, f"queue_{queue}: scheduler.json has no queue {queue!r} ({known})"
            )
        if queue in served:
            raise ConfigError(
                key, f"queue_{queue} is served by node type {served[queue]!r} already: one a queue"
            )
        served[queue] = name
    if not node_types or config.mode == "vps_only":
        return
    for queue, queue_config in config.queues.items():
        if queue_config.cloud_enabled and queue not in served:
            raise ConfigError(
                "available_node_types",
                f"no node type serves queue_{queue}, which scheduler.json bursts to the"
                f" cloud (cloud_enabled, mode {config.mode}): add one with resources"
                f" {{queue_{queue}: 1}}",
            )


def waiting(conn: Connection, queue: str, now: float) -> QueueState:
    """The queue's queued jobs by priority, from the record: what routes a launch made
    without the scheduler's order (the long-transcode rule needs the scheduler's view)."""
    j = t.jobs.c
    rows = conn.execute(
        select(j.priority, func.count(), func.min(j.queued_at))
        .where((j.queue == queue) & (j.status == JobStatus.QUEUED.value))
        .group_by(j.priority)
    ).all()
    return queue_state(
        queue,
        (
            (int(priority), int(count), max(0.0, now - epoch(first)) if first else 0.0)
            for priority, count, first in rows
        ),
    )


def _ledger_ids(record: Mapping[str, Any]) -> list[str]:
    """The ids a node's ledger row may have: its instance id, or its launch's request id
    (the row's id until the launch answered, and after a crash before it was renamed)."""
    return [str(record[k]) for k in ("instance_id", "request_id") if record.get(k)]


def vps_workers(conn: Connection, queue: str) -> int:
    """The queue's VPS workers, as the scheduler counts them: its live workers rows on
    the head's Ray node (:data:`VPS_NODE`) or outside Ray; an actor on a burst node
    counts with its node, through the ledger."""
    w = t.workers
    recorded = read_state(conn, VPS_NODE)
    on_vps: ColumnElement[bool] = w.c.node_id.is_(None)
    if recorded is not None:
        on_vps = on_vps | (w.c.node_id == str(recorded["node_id"]))
    return int(
        conn.execute(
            select(func.count())
            .select_from(w)
            .where((w.c.queue == queue) & w.c.status.in_(LIVE_WORKER_STATUSES) & on_vps)
        ).scalar_one()
    )


def record_vps_node(engine: Engine, node_id: str, now: float) -> None:
    """Name the head's Ray node (the head's services, once Ray is connected)."""
    with transaction(engine) as conn:
        write_state(conn, VPS_NODE, {"node_id": node_id}, now)


def head_environment(provider: HypermediaNodeProvider) -> dict[str, str]:
    """What every command on the head runs with: its own HOME (``~/ray_bootstrap_config.yaml``
    stays with the cluster), the token settings, and where the head's Ray lives."""
    from hypermedia.worker.cluster import ensure_token, port_arguments, short_temp_dir

    home = provider.state_dir / HEAD_HOME
    home.mkdir(parents=True, exist_ok=True)
    ensure_token(provider.token_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(provider.token_path),
        RAY_USAGE_STATS_ENABLED="0",
        # Ray's monitor runs ray/autoscaler/v2/monitor.py as a script, whose directory
        # holds an autoscaler.py that would shadow this package: no script dir on sys.path.
        PYTHONSAFEPATH="1",
        HM_HEAD_IP=provider.settings.head_ip,
        HM_RAY_PORT=str(provider.settings.ray_port),
        HM_RAY_ADDRESS=provider.head_address,
        HM_HEAD_TEMP_DIR=str(short_temp_dir(provider.state_dir, "head")),
        HM_STATE_DIR=str(provider.state_dir),
        # Free ports for everything but the GCS (Ray's defaults collide between clusters);
        # none for the Ray client server, which the head's `ray start` (ray-start:
        # hypermedia.worker.ray_start) does not start unless given a port.
        HM_HEAD_PORTS=" ".join(
            a for a in port_arguments(head=True, client_server=False) if not a.startswith("--port=")
        ),
    )
    return env


class LocalCommandRunner(CommandRunnerInterface):
    """Runs ``ray up``'s commands on this machine, the head, with :func:`head_environment`.

    ``ray down`` runs ``ray stop`` on the head, which would kill every Ray process on the
    host; here it stops this cluster's head only (the hypermedia services, then the Ray
    processes of the head's temp dir)."""

    def __init__(self, provider: HypermediaNodeProvider, log_prefix: str) -> None:
        self.provider = provider
        self.log_prefix = log_prefix

    def _env(self, extra: Mapping[str, Any] | None) -> dict[str, str]:
        env = head_environment(self.provider)
        for key, value in (extra or {}).items():
            env[key] = value if isinstance(value, str) else json.dumps(value)
        env["RAY_USAGE_STATS_ENABLED"] = "0"  # `ray up` turns it on in its own process
        # Ray's updater passes the head node type's resources here; `ray start` reads them.
        declared = json.loads(env.get(RESOURCES_VARIABLE) or "{}")
        env[RESOURCES_VARIABLE] = json.dumps(head_resources(self.provider.config, declared))
        return env

    def run(
        self,
        cmd: str | None = None,
        timeout: int = 120,
        exit_on_fail: bool = False,
        port_forward: Any = None,
        with_output: bool = False,
        environment_variables: dict[str, object] | None = None,
        run_env: str = "auto",
        ssh_options_override_ssh_key: str = "",
        shutdown_after_run: bool = False,
        silent: bool = False,
    ) -> str:
        if not cmd:
            return ""
        env = self._env(environment_variables)
        if cmd.strip().endswith("ray stop"):
            cmd = f"{shlex.quote(sys.executable)} -m autoscaler.head stop"
        log.info("%s running: %s", self.log_prefix, cmd)
        result = subprocess.run(
            ["/bin/bash", "-c", cmd],
            env=env,
            cwd=env["HOME"],
            capture_output=True,
            text=True,
            check=False,
        )
        output = (result.stdout or "") + (result.stderr or "")
        if not silent and output.strip():
            print(output.rstrip(), flush=True)
        if result.returncode != 0:
            if exit_on_fail:
                sys.exit(result.returncode)
            raise subprocess.CalledProcessError(result.returncode, cmd, output)
        return output if with_output else ""

    def _local(self, path: str) -> Path:
        return Path(path.replace("~", str(self.provider.state_dir / HEAD_HOME), 1))

    def run_rsync_up(self, source: str, target: str, options: Any = None) -> None:
        destination = self._local(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        if Path(source).is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True)
        else:
            shutil.copy(source, destination)

    def run_rsync_down(self, source: str, target: str, options: Any = None) -> None:
        origin = self._local(source)
        if origin.is_dir():
            shutil.copytree(origin, target, dirs_exist_ok=True)
        else:
            shutil.copy(origin, target)

    def remote_shell_command_str(self) -> str:
        return "bash"

    def run_init(self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool) -> None:
        return None
