"""Cloud drivers: one small interface over AWS, GCP, IONOS and a local driver.

The node provider (:mod:`autoscaler.provider`) decides *what* to launch (the queue,
the provider, spot or not, at what price) and keeps Ray's bookkeeping; a driver only
does the lifecycle I/O against one cloud. The contract every driver keeps (and
``tests/driver_contract.py`` checks on each of them, from each driver's tests):

* **Idempotent launch.** ``launch(request)`` called again with the same
  ``request.request_id`` (after a timeout, a crash, or from the other process that
  builds a provider: ``ray up`` and the head's monitor each have one) answers the
  instance launched the first time and never starts a second one. Drivers use the
  provider's own idempotency where it exists (AWS ``ClientToken``) and a name derived
  from the request id otherwise (GCP instance names, IONOS server names).
* **Eventual consistency.** An instance just launched may be missing from
  :meth:`Driver.instances` for a while; one just terminated may still be listed with
  state ``terminating``. Callers reconcile by ``request_id`` and ``instance_id`` and
  never assume read-after-write.
* **Errors are values.** Whatever the provider can answer (no capacity, quota,
  refused credentials, a bad request, unreachable endpoint) comes back as a
  :class:`DriverError`, translated where it enters; only programming errors raise.
  ``terminate`` of an instance that is already gone is a success.
* **Tags say whose it is.** Every instance carries :data:`TAG_KEYS` (cluster, node
  type, queue, request id, spot, launch time, price) as tags, labels or a name
  prefix, so a fresh process can list the cluster's instances from the cloud alone.
  An instance without a launch time tag (started by hand with the cluster's tag, a tag
  removed, a launch that died before tagging) is listed as launched when its cloud
  says it was created (:meth:`Instance.from_tags`' ``created``), so the spend it
  billed before the provider first saw it is counted.
* **No secrets in user data.** ``request.user_data`` is the boot script the provider
  rendered (:func:`autoscaler.bootstrap.user_data`); it names where the node finds
  its Ray token, never the token or a cloud credential. Drivers pass it unchanged
  (base64 where the API wants it).
* **Billing is read, when it can be, at the operator's cost in mind.** A driver that
  can read its cloud's billing has :meth:`BillingReader.charges` (see
  :class:`BillingReader`): what the bill says the cluster's resources cost, per UTC day,
  named by instance id or by the request id tag. The scheduler asks only once a day or
  an instance has ended and its bill had time to settle
  (:attr:`BillingReader.billing_settle_seconds`), and at most every
  :attr:`BillingReader.billing_interval_seconds` (AWS Cost Explorer charges $0.01 a
  request): a reconciliation is a few requests a day of bursting, not one a turn.
* **SDKs load lazily.** Importing a driver module imports no SDK; building a driver
  whose SDK is missing raises :class:`~hypermedia.errors.ConfigError` with the
  ``pip install`` that fixes it.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, runtime_checkable

from autoscaler.cost import from_microusd, to_microusd

InstanceState = Literal["pending", "running", "terminating", "terminated"]
ErrorCode = Literal["capacity", "quota", "auth", "invalid", "unavailable", "not_found"]

# Tag keys every driver writes (GCP labels allow only [a-z0-9_-], so do all of them).
TAG_CLUSTER = "hypermedia-cluster"
TAG_NODE_TYPE = "hypermedia-node-type"
TAG_QUEUE = "hypermedia-queue"
TAG_REQUEST = "hypermedia-request"
TAG_SPOT = "hypermedia-spot"  # "true" / "false"
TAG_LAUNCHED = "hypermedia-launched-at"  # integer epoch seconds
TAG_PRICE = "hypermedia-price-microusd"  # integer micro-dollars per instance-hour
TAG_KEYS = (TAG_CLUSTER, TAG_NODE_TYPE, TAG_QUEUE, TAG_REQUEST, TAG_SPOT, TAG_LAUNCHED, TAG_PRICE)

_TAG_VALUE = re.compile(r"^[a-z0-9_-]{1,63}$")
REQUEST_ID = re.compile(r"^[a-z][a-z0-9-]{5,39}$")


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One instance to start. Every value is already a valid tag/label value."""

    request_id: str  # idempotency key: REQUEST_ID (GCP/IONOS derive the name from it)
    cluster: str
    node_type: str  # the Ray node type, e.g. "burst_ocr"
    queue: str
    spot: bool
    price_cents_per_hour: float  # the price it was chosen at (recorded as a tag)
    launched_at: float  # epoch seconds
    user_data: str  # the boot script (shell), free of secrets

    def __post_init__(self) -> None:
        if not REQUEST_ID.match(self.request_id):
            raise ValueError(f"request_id {self.request_id!r} must match {REQUEST_ID.pattern}")
        for name in ("cluster", "node_type", "queue"):
            value = getattr(self, name)
            if not _TAG_VALUE.match(value):
                raise ValueError(f"{name} {value!r} must match {_TAG_VALUE.pattern}")

    @property
    def price_microusd(self) -> int:
        return to_microusd(self.price_cents_per_hour)

    def tags(self) -> dict[str, str]:
        """The tags (labels) that make the instance findable and priced."""
        return {
            TAG_CLUSTER: self.cluster,
            TAG_NODE_TYPE: self.node_type,
            TAG_QUEUE: self.queue,
            TAG_REQUEST: self.request_id,
            TAG_SPOT: "true" if self.spot else "false",
            TAG_LAUNCHED: str(int(self.launched_at)),
            TAG_PRICE: str(self.price_microusd),
        }


@dataclass(frozen=True, slots=True)
class Instance:
    """One of the cluster's instances as its cloud reports it."""

    instance_id: str
    provider: str  # "aws", "google", "ionos", "local"
    cluster: str
    node_type: str
    queue: str
    request_id: str
    spot: bool
    state: InstanceState
    launched_at: float
    price_cents_per_hour: float
    private_ip: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)  # driver-specific facts

    @classmethod
    def from_tags(
        cls,
        instance_id: str,
        provider: str,
        tags: Mapping[str, str],
        state: InstanceState,
        private_ip: str | None = None,
        created: float | None = None,
    ) -> Instance:
        """Rebuild an instance from the tags :meth:`LaunchRequest.tags` wrote.

        ``created`` is when the cloud says it created the instance (epoch seconds): its
        launch time when the tags carry none, never later than now (a cloud's clock
        ahead of ours). A launch time tag stays authoritative; with neither,
        ``launched_at`` is 0 and the provider counts the instance from when it sees it."""
        launched_at = _tag_number(tags, TAG_LAUNCHED)
        if launched_at <= 0 and created is not None and created > 0:
            launched_at = min(created, time.time())
        return cls(
            instance_id=instance_id,
            provider=provider,
            cluster=tags.get(TAG_CLUSTER, ""),
            node_type=tags.get(TAG_NODE_TYPE, ""),
            queue=tags.get(TAG_QUEUE, ""),
            request_id=tags.get(TAG_REQUEST, ""),
            spot=tags.get(TAG_SPOT) == "true",
            state=state,
            launched_at=launched_at,
            price_cents_per_hour=from_microusd(int(_tag_number(tags, TAG_PRICE))),
            private_ip=private_ip,
        )


def _tag_number(tags: Mapping[str, str], key: str) -> float:
    """The number a tag holds; 0, as if it were missing, when it holds none (tags can be
    edited by hand in the cloud's console: "soon", "1e400", "nan"). One such tag must not
    stop the listing of every instance: the instance is counted as one without it (from
    its creation, at the on-demand list price)."""
    try:
        value = float(tags.get(key) or 0)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


@dataclass(frozen=True, slots=True)
class DriverError:
    """What went wrong, as a value. ``retryable``: the same call may work later.
    ``maybe_launched``: a launch that failed this way may have left an instance behind
    (a timeout, a 5xx, an operation still running): the caller keeps counting its spend
    until a listing shows whether it exists."""

    code: ErrorCode
    message: str
    retryable: bool = False
    maybe_launched: bool = False

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Driver(Protocol):
    """Lifecycle I/O against one cloud (see the module docstring for the contract)."""

    name: str  # "aws", "google", "ionos", "local"

    def launch(self, request: LaunchRequest) -> Instance | DriverError:
        """Start one instance (idempotent per ``request.request_id``)."""
        ...

    def instances(self, cluster: str) -> list[Instance] | DriverError:
        """The cluster's instances that are not terminated (eventually consistent)."""
        ...

    def terminate(self, instance_id: str) -> DriverError | None:
        """Stop and delete one instance; an instance already gone is a success."""
        ...

    def price(self, spot: bool) -> float | DriverError:
        """What one instance of the configured type costs now, cents per hour
        (``spot``: the current spot / preemptible price)."""
        ...


@dataclass(frozen=True, slots=True)
class Charge:
    """What a cloud's billing says one of the cluster's resources cost on one UTC day.

    ``request_id`` is the :data:`TAG_REQUEST` value the bill carries (cost allocation
    tags, billing-export labels), ``instance_id`` the provider's id where the bill names
    it; at least one is set when the bill can tell whose the charge is. A charge with
    neither (the cluster's, by its tag, but of no instance: a volume left behind, an
    address) counts toward the day's bill and belongs to no instance."""

    day: str  # "YYYY-MM-DD", UTC
    cents: float
    request_id: str = ""
    instance_id: str = ""


@runtime_checkable
class BillingReader(Protocol):
    """A driver that can read its cloud's billing (the contract's "Billing is read")."""

    #: How long after a day (or an instance) ended its bill is complete enough to
    #: compare with the ledger: the provider's billing lag, with a margin.
    billing_settle_seconds: float
    #: The least time between two reads (a read may cost money).
    billing_interval_seconds: float

    def charges(self, cluster: str, first_day: str, last_day: str) -> list[Charge] | DriverError:
        """Every charge the billing holds for ``cluster``'s resources (by
        :data:`TAG_CLUSTER`) on the UTC days ``first_day`` .. ``last_day`` (both
        included, ``YYYY-MM-DD``). Days the billing has not processed yet are simply
        missing. A billing that is not set up (tags not activated, no export table)
        answers an ``invalid`` error saying what to set up."""
        ...


def launch_outcome(result: Instance | DriverError) -> Instance | DriverError:
    """A cloud launch's answer as the provider reads it: an ``unavailable`` error (the
    endpoint timed out or failed after the request may have reached it, or the create
    operation is still running) may have left an instance behind (``maybe_launched``).
    The other codes are the cloud refusing the create."""
    if isinstance(result, DriverError) and result.code == "unavailable":
        return replace(result, maybe_launched=True)
    return result
