"""``scheduler.json``: the seed's schema (seed 000, "Settings File"), validated strictly.

Three keys are ours, optional: ``scaling_rules.scale_down.drain_timeout_seconds`` (default
300, the seed's "timeout after 5 min" of a drain),
``scaling_rules.scale_down.claims_paused_drain_seconds`` (default 600: a cloud worker
whose disk is low is drained after it) and ``alerts``, the thresholds of the
seed's alert rules ("Monitoring & Alerts"), each defaulting to the seed's value (see
:class:`AlertsConfig`; the rules themselves are :mod:`autoscaler.alerts`).

Loaded once at startup by :func:`load` from the path given, else
``$HYPERMEDIA_SCHEDULER_CONFIG``, else ``/etc/hypermedia/scheduler.json``; when none of
them is set and the default file does not exist, the shipped defaults
(``etc/scheduler.json``: ``vps_only``, every queue on the VPS, no cloud) apply. A
file that exists is never half-read: an unknown key, a wrong type (``"10"`` for 10,
``1`` for ``true``), a negative number, ``max_workers`` below ``baseline_workers``, a
queue bursting to a provider that is not enabled, an enabled provider without its
required fields (or with the seed's ``...`` placeholders) all raise
:class:`~hypermedia.errors.ConfigError` naming the key path
(``queues.ocr.max_workers``). The mode changes only by editing the file: nothing
here is reachable from an API.

Pure: pydantic and the standard library; :func:`load` reads one file.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hypermedia.config_errors import chosen_error, is_unknown_key, unknown_key_problem
from hypermedia.errors import ConfigError
from hypermedia.etc import shipped_etc

DEFAULT_PATH = Path("/etc/hypermedia/scheduler.json")
ENV_VAR = "HYPERMEDIA_SCHEDULER_CONFIG"
SHIPPED = shipped_etc() / "scheduler.json"

Mode = Literal["vps_only", "hybrid", "cloud_first"]
ProviderName = Literal["aws", "google", "ionos"]
PROVIDERS: tuple[ProviderName, ...] = ("aws", "google", "ionos")
log = logging.getLogger(__name__)
PLACEHOLDER = "..."


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class QueueConfig(_Strict):
    baseline_workers: int = Field(ge=0, le=1000)
    max_workers: int = Field(ge=0, le=1000)
    cloud_enabled: bool = False
    cloud_provider: ProviderName | None = None  # None: the cheapest eligible
    spot_preferred: bool = False

    @model_validator(mode="after")
    def _max_not_below_baseline(self) -> QueueConfig:
        if self.max_workers < self.baseline_workers:
            raise _KeyError(
                "max_workers",
                f"{self.max_workers} is below baseline_workers ({self.baseline_workers})",
            )
        return self


class _Provider(_Strict):
    enabled: bool = False
    max_instances: int = Field(ge=0, le=10_000)

    # Fields that must hold a real value when the provider is enabled.
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _complete_when_enabled(self) -> _Provider:
        if self.enabled:
            for name in self.REQUIRED:
                value = getattr(self, name)
                if value is None or not str(value).strip():
                    raise _KeyError(name, "required when the provider is enabled")
                if PLACEHOLDER in str(value):
                    raise _KeyError(name, f"{value!r} is the example's placeholder")
            if self.max_instances < 1:
                raise _KeyError("max_instances", "an enabled provider needs at least 1")
        return self


class AwsConfig(_Provider):
    region: str | None = None
    instance_type: str | None = None
    ami_id: str | None = None
    spot_enabled: bool = False
    # Dollars per instance-hour, a string as in the seed ("0.05"); None: on-demand cap.
    spot_max_price: str | None = None

    REQUIRED = ("region", "instance_type", "ami_id")

    @field_validator("spot_max_price")
    @classmethod
    def _price(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            price = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a price in dollars") from None
        if not price.is_finite() or price <= 0:
            raise ValueError(f"{value!r} must be a positive price in dollars")
        return value

    @property
    def spot_max_price_cents(self) -> float | None:
        return None if self.spot_max_price is None else float(Decimal(self.spot_max_price) * 100)


class GoogleConfig(_Provider):
    zone: str | None = None
    machine_type: str | None = None
    image: str | None = None
    preemptible: bool = False

    REQUIRED = ("zone", "machine_type", "image")


class IonosConfig(_Provider):
    datacenter: str | None = None
    server_type: str | None = None
    image: str | None = None

    REQUIRED = ("datacenter", "server_type", "image")

    @model_validator(mode="after")
    def _a_server_type_the_driver_launches(self) -> IonosConfig:
        # Checked here, not first when the node provider builds its driver: that is in
        # Ray's monitor after `ray up` has accepted the file.
        if self.enabled and self.server_type and PLACEHOLDER not in self.server_type:
            problem = ionos_server_type_problem(self.server_type)
            if problem is not None:
                raise _KeyError("server_type", problem)
        return self


IONOS_SERVER_TYPES = ("ENTERPRISE", "VCPU")


def ionos_server_type_problem(value: str) -> str | None:
    """Why the IONOS driver cannot launch servers of type ``value``, or None."""
    server_type = value.strip().upper()
    if server_type.startswith("CUBE"):
        return (
            f"{value!r}: CUBE servers are sized by a template, which this driver does not"
            " pick; use ENTERPRISE or VCPU (sized by provider.drivers.ionos.cores and ram_mb)"
        )
    if server_type not in IONOS_SERVER_TYPES:
        return f"{value!r} is not an IONOS server type: use ENTERPRISE or VCPU"
    return None


class CloudProviders(_Strict):
    aws: AwsConfig = AwsConfig(max_instances=0)
    google: GoogleConfig = GoogleConfig(max_instances=0)
    ionos: IonosConfig = IonosConfig(max_instances=0)

    def get(self, name: ProviderName) -> _Provider:
        provider: _Provider = getattr(self, name)
        return provider

    def enabled(self) -> list[ProviderName]:
        return [name for name in PROVIDERS if self.get(name).enabled]

    def spot_allowed(self, name: ProviderName) -> bool:
        """Whether the provider may launch spot / preemptible instances."""
        if name == "aws":
            return self.aws.spot_enabled
        if name == "google":
            return self.google.preemptible
        return False  # IONOS has no spot market


class ScaleUp(_Strict):
    queue_depth_threshold: int = Field(ge=1)
    oldest_job_age_seconds: int = Field(ge=1)
    cooldown_seconds: int = Field(ge=0)


class ScaleDown(_Strict):
    idle_minutes: int = Field(ge=1)
    queue_depth_below: int = Field(ge=0)
    cooldown_seconds: int = Field(ge=0)
    # The seed's "wait for current jobs to finish (or timeout after 5 min)": how long a
    # drain lasts before its jobs are handed back and the instance terminated. Not in
    # the seed's file; the one setting the policy, the node provider's Ray drain and the
    # actors' hand-back all read.
    drain_timeout_seconds: int = Field(default=300, ge=1, le=86_400)
    # Not in the seed's file either: a cloud worker that has claimed no job this long
    # because its disk is low (every actor on its node paused by the disk guard,
    # ``worker_min_free_disk_mb``) is drained, so it stops costing money and a
    # replacement can be launched; a VPS worker is only alerted (``worker_disk_low``).
    claims_paused_drain_seconds: int = Field(default=600, ge=1, le=86_400)


class ScalingRules(_Strict):
    scale_up: ScaleUp
    scale_down: ScaleDown


class CostLimits(_Strict):
    max_hourly_spend_cents: int = Field(ge=0)
    max_daily_spend_cents: int = Field(ge=0)
    alert_threshold_cents: int = Field(ge=0)

    @model_validator(mode="after")
    def _alert_below_daily(self) -> CostLimits:
        if self.alert_threshold_cents > self.max_daily_spend_cents:
            raise _KeyError(
                "alert_threshold_cents",
                f"{self.alert_threshold_cents} is above max_daily_spend_cents"
                f" ({self.max_daily_spend_cents}): the alert would come after the cap",
            )
        return self


class QueueDepthAlert(_Strict):
    """Ready jobs of one queue above ``above`` for ``for_seconds`` (seed: > 50, 10 min)."""

    above: int = Field(default=50, ge=0)
    for_seconds: int = Field(default=600, ge=0, le=86_400)


class OldestJobAlert(_Strict):
    """The oldest ready job of priority 1-3 older than ``above_seconds`` (seed: 15 min)."""

    above_seconds: int = Field(default=900, ge=1)


class WorkerCpuAlert(_Strict):
    """A worker's ``worker_metrics.cpu_percent`` above ``above_percent`` for ``for_seconds``
    (seed: > 90 %, 10 min)."""

    above_percent: float = Field(default=90.0, gt=0)
    for_seconds: int = Field(default=600, ge=0, le=86_400)


class FailureRateAlert(_Strict):
    """Failed attempts among the last ``last_jobs`` finished ones above ``above_percent``
    (seed: > 10 % of the last 100), once ``min_jobs`` have finished (fewer say nothing)."""

    above_percent: float = Field(default=10.0, ge=0, lt=100)
    last_jobs: int = Field(default=100, ge=1, le=100_000)
    min_jobs: int = Field(default=20, ge=1, le=100_000)

    @model_validator(mode="after")
    def _min_within_window(self) -> FailureRateAlert:
        if self.min_jobs > self.last_jobs:
            raise _KeyError("min_jobs", f"{self.min_jobs} is above last_jobs ({self.last_jobs})")
        return self


class FailureSpikeAlert(_Strict):
    """The critical one: failed attempts among the last ``last_jobs`` at or above
    ``above_percent`` (a short window, so a sudden spike shows within a few jobs)."""

    above_percent: float = Field(default=50.0, ge=0, lt=100)
    last_jobs: int = Field(default=20, ge=1, le=100_000)


class DailySpendAlert(_Strict):
    """Today's cloud spend above ``above_percent`` of ``max_daily_spend_cents`` (seed: 80 %)."""

    above_percent: float = Field(default=80.0, gt=0, le=100)


class HeartbeatAlert(_Strict):
    """A worker's last heartbeat older than ``older_than_seconds`` (seed: 2 min)."""

    older_than_seconds: int = Field(default=120, ge=1)


class WorkerDiskLowAlert(_Strict):
    """A live worker that has claimed no job for ``for_seconds`` because its workdirs'
    disk is below ``worker_min_free_disk_mb`` (its row's ``claims_paused_since``;
    default 5 min: a job's cleanup that frees the disk within minutes says nothing)."""

    for_seconds: int = Field(default=300, ge=0, le=86_400)


class AlertsConfig(_Strict):
    """The alert rules' thresholds (:mod:`autoscaler.alerts`), the seed's by default.
    ``repeat_interval_seconds``: a firing alert is sent again this often while it fires."""

    repeat_interval_seconds: int = Field(default=3600, ge=60, le=7 * 86_400)
    queue_depth: QueueDepthAlert = QueueDepthAlert()
    oldest_job: OldestJobAlert = OldestJobAlert()
    worker_cpu: WorkerCpuAlert = WorkerCpuAlert()
    failure_rate: FailureRateAlert = FailureRateAlert()
    failure_spike: FailureSpikeAlert = FailureSpikeAlert()
    daily_spend: DailySpendAlert = DailySpendAlert()
    heartbeat: HeartbeatAlert = HeartbeatAlert()
    worker_disk_low: WorkerDiskLowAlert = WorkerDiskLowAlert()


class SchedulerConfig(_Strict):
    mode: Mode = "vps_only"
    evaluation_interval_seconds: int = Field(default=60, ge=1, le=3600)
    queues: dict[str, QueueConfig]
    cloud_providers: CloudProviders = CloudProviders()
    scaling_rules: ScalingRules
    cost_limits: CostLimits
    alerts: AlertsConfig = AlertsConfig()

    @model_validator(mode="after")
    def _bursts_go_somewhere(self) -> SchedulerConfig:
        enabled = self.cloud_providers.enabled()
        for name, queue in self.queues.items():
            if not queue.cloud_enabled:
                continue
            provider = queue.cloud_provider
            if provider is not None and provider not in enabled:
                raise _KeyError(
                    f"queues.{name}.cloud_provider",
                    f"{provider!r} is not enabled in cloud_providers",
                )
            if not enabled:
                raise _KeyError(
                    f"queues.{name}.cloud_enabled", "no provider in cloud_providers is enabled"
                )
        return self

    def burst_providers(self, queue: str) -> list[ProviderName]:
        """The providers ``queue`` may burst onto (none unless it is cloud-enabled)."""
        config = self.queues[queue]
        if not config.cloud_enabled:
            return []
        if config.cloud_provider is not None:
            return [config.cloud_provider]
        return self.cloud_providers.enabled()


class _KeyError(ValueError):
    """A validator's complaint about one key (relative to the model it validates)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


def parse(data: Any, source: str = "scheduler.json") -> SchedulerConfig:
    """Validate decoded JSON; the first problem as a :class:`ConfigError` naming its key."""
    if not isinstance(data, dict):
        raise ConfigError(source, "expected a JSON object")
    try:
        return SchedulerConfig.model_validate(data)
    except ValidationError as exc:
        first = chosen_error(exc)
        path = [str(part) for part in first["loc"]]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, _KeyError):
            # A model validator names a key of the model it validated (loc = the model).
            key_path = ".".join([*path, cause.key])
            raise ConfigError(f"{source}: {key_path}", cause.problem) from None
        if is_unknown_key(first):
            problem = unknown_key_problem(exc, first, SchedulerConfig)
        else:
            problem = first["msg"]
        raise ConfigError(f"{source}: {'.'.join(path) or '(top level)'}", problem) from None


def chosen_path(path: Path | str | None = None) -> Path:
    """The file :func:`load` reads for ``path`` (see the module docstring)."""
    explicit = path if path is not None else os.environ.get(ENV_VAR) or None
    chosen = Path(explicit) if explicit is not None else DEFAULT_PATH
    if explicit is None and not chosen.exists():
        chosen = SHIPPED
    return chosen


def check_queues(config: SchedulerConfig, deployment: Iterable[str], source: str) -> None:
    """Every queue of ``config`` is one of the deployment's (``HYPERMEDIA_QUEUES``): one
    that is not would get VPS slots and bursts that no pipeline actor serves."""
    known = list(deployment)
    unknown = sorted(set(config.queues) - set(known))
    if unknown:
        raise ConfigError(
            f"{source}: queues.{unknown[0]}",
            f"not a queue of this deployment ({', '.join(known)}; HYPERMEDIA_QUEUES"
            " or the settings file's [queues.<name>] adds one)",
        )
    missing = [name for name in known if name not in config.queues]
    if missing:
        # Not an error (a deployment may leave a queue to its joined nodes), but a queue
        # added to the settings and forgotten here gets no worker: its operations are
        # refused at submit, and nothing said why.
        log.warning(
            "%s has no entry for the queue(s) %s: no worker of this file runs them (their"
            " operations are refused at submit unless a joined node serves them); add"
            " queues.<name> to it",
            source,
            ", ".join(missing),
        )


def load(path: Path | str | None = None, queues: Iterable[str] | None = None) -> SchedulerConfig:
    """The scheduler's configuration (see the module docstring for where it comes from).
    ``queues``: the deployment's (the settings' ``queue_names``), which every queue of the
    file must be one of; a process that starts anything passes them, so that a file
    naming another queue refuses before it starts."""
    chosen = chosen_path(path)
    try:
        text = chosen.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(chosen), f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(chosen), f"not UTF-8 text (byte {exc.start})") from None
    config = parse(read_json(text, str(chosen)), str(chosen))
    if queues is not None:
        check_queues(config, queues, str(chosen))
    return config


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it was given more than once."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.twice: list[str] = []
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                self.twice.append(key)
            seen.add(key)


def read_json(text: str, source: str) -> Any:
    """A configuration file's JSON; ConfigError naming ``source`` for text that is not
    JSON, and naming the key for one an object was given twice (JSON would keep the
    last silently)."""
    try:
        data = json.loads(text, object_pairs_hook=_Object)
    except json.JSONDecodeError as exc:
        raise ConfigError(source, f"not JSON: {exc}") from None
    twice = _duplicate(data, ())
    if twice is not None:
        raise ConfigError(
            f"{source}: {'.'.join(twice)}", "given twice (JSON would keep the last silently)"
        )
    return data


def _duplicate(value: Any, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The path of the first key some object of ``value`` was given twice."""
    if isinstance(value, _Object) and value.twice:
        return (*path, value.twice[0])
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in children:
        found = _duplicate(child, (*path, str(key)))
        if found is not None:
            return found
    return None
