"""The AWS driver: EC2 instances through boto3, on-demand or spot.

It keeps the contract of :mod:`autoscaler.drivers.base` this way:

* **Idempotent launch.** ``launch`` first looks for a live instance tagged with the
  request id (another process may have launched it), and only then calls
  ``RunInstances`` with ``ClientToken=request_id``, which EC2 itself deduplicates for
  the case the lookup cannot see yet (a launch a moment ago, not listed yet).
* **Errors are values.** Every botocore error is translated by :func:`driver_error`
  where it enters: capacity (retryable), quota, auth, invalid, unavailable
  (retryable). ``ParamValidationError`` is our bug and still raises.
* **Tags** go on the instance and its volumes, with ``Name=hm-<request id>`` for
  people reading the console. An instance listed without the launch time tag (started
  by hand with the cluster's tag, the tag removed) is launched at its ``LaunchTime``,
  so the provider counts what it billed before it was seen (EC2's ``LaunchTime`` is
  its last start: the hours of one stopped and started again before that go uncounted).
* **No volume outlives its instance.** A launch maps the AMI's root device (its
  ``RootDeviceName``, read once with ``DescribeImages``) with ``DeleteOnTermination``
  true, whatever the AMI says: an AMI registered with it false would leave an EBS
  volume billing after every terminated instance. The override keeps the AMI's size
  (the rest of the AMI's mapping applies as it is); an AMI whose root is not EBS, or
  that maps no root device, is launched with its own mapping.
* **No secrets.** Credentials come from boto3's default chain (environment, instance
  role), never from the cluster yaml; the user data is passed unchanged (boto3
  base64-encodes it) and the instance metadata service requires IMDSv2 tokens.
* **Lazy SDK.** boto3 is imported when a driver is built, not with this module.
* **Billing is read** from AWS Cost Explorer (:meth:`AwsDriver.charges`, so the driver
  is a :class:`~autoscaler.drivers.base.BillingReader`): one ``GetCostAndUsage`` a
  read, daily ``UnblendedCost`` of what carries the cluster's tag, grouped by the
  request id tag. The instances' volumes carry the same tags as the instances
  (``TagSpecifications`` for ``instance`` and ``volume``), so their cost lands in the
  same request's group. What the operator sets up, once:

  - the head's credentials need the IAM permission ``ce:GetCostAndUsage``;
  - Cost Explorer enabled for the account (opening it once in the Billing console
    does; its data is ready up to 24 hours later);
  - the user-defined cost allocation tags ``hypermedia-cluster`` and
    ``hypermedia-request`` activated in the Billing console (Cost allocation tags) or
    with ``aws ce update-cost-allocation-tags-status --cost-allocation-tags-status
    TagKey=hypermedia-cluster,Status=Active TagKey=hypermedia-request,Status=Active``.
    A key can be activated once resources carrying it exist (it shows up to 24 hours
    after the first launch), and costs from before its activation do not carry it
    (unless a backfill is requested). Without them Cost Explorer answers nothing for
    the cluster: an empty list, not an error (the answer cannot tell "not activated"
    from "nothing billed yet", and asking ``ListCostAllocationTags`` would be one more
    paid request and one more permission).

  Cost Explorer costs $0.01 a request (each page is one), and its data lags up to
  about 24 hours: the scheduler reads only once a day or an instance has ended and
  :attr:`AwsDriver.billing_settle_seconds` (48 h) have passed, and at most every
  :attr:`AwsDriver.billing_interval_seconds` (6 h). Cost Explorer lives in
  ``us-east-1`` whatever the EC2 region (``endpoint_url`` serves both, for tests).

Options (the ``aws`` section of the provider config, checked when the driver is
built; a bad one is a :class:`~hypermedia.errors.ConfigError` naming
``provider.drivers.aws.<key>``): ``endpoint_url``, ``subnet_id``, ``security_group_ids``,
``iam_instance_profile`` (a name or an ARN), ``on_demand_cents_per_hour`` (required:
the operator's list price, since the Pricing API is neither regional nor cheap to
ask on every decision).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import threading
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Protocol, cast

from autoscaler.config import AwsConfig
from autoscaler.drivers.base import (
    TAG_CLUSTER,
    TAG_REQUEST,
    Charge,
    DriverError,
    Instance,
    InstanceState,
    LaunchRequest,
    launch_outcome,
)
from hypermedia import aws_sdk
from hypermedia.config_errors import close_key
from hypermedia.errors import ConfigError

_KEY = "provider.drivers.aws"  # where these options live in the cluster yaml

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceStateNameType, InstanceTypeType
    from mypy_boto3_ec2.type_defs import (
        BlockDeviceMappingTypeDef,
        EbsBlockDeviceTypeDef,
        FilterTypeDef,
        ImageTypeDef,
        InstanceTypeDef,
        RunInstancesRequestTypeDef,
        SpotMarketOptionsTypeDef,
        TagSpecificationTypeDef,
        TagTypeDef,
    )

log = logging.getLogger(__name__)

OPTION_KEYS = frozenset(
    {
        "endpoint_url",
        "subnet_id",
        "security_group_ids",
        "iam_instance_profile",
        "on_demand_cents_per_hour",
    }
)

# Not terminated: what ``instances`` lists and what a repeated launch finds.
LIVE_STATES: tuple[InstanceStateNameType, ...] = (
    "pending",
    "running",
    "shutting-down",
    "stopping",
    "stopped",
)
_STATES: dict[str, InstanceState] = {
    "pending": "pending",
    "running": "running",
    "shutting-down": "terminating",
    "stopping": "terminating",
    "stopped": "terminating",  # a burst node is never restarted: it is on its way out
    "terminated": "terminated",
}

# Short timeouts and few attempts: the provider calls the driver inside a control
# loop and would rather get ``unavailable`` and decide again than hang.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
MAX_ATTEMPTS = 3

# Cost Explorer: one global endpoint in us-east-1; its data lags up to ~24 h, and every
# request (every page) costs $0.01.
BILLING_REGION = "us-east-1"
BILLING_SETTLE_SECONDS = 48 * 3600.0
BILLING_INTERVAL_SECONDS = 6 * 3600.0
BILLING_METRIC = "UnblendedCost"
BILLING_PERMISSION = "ce:GetCostAndUsage"
_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")

_CAPACITY = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
    }
)
_QUOTA = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "ResourceLimitExceeded"})
_AUTH = frozenset(
    {
        "AuthFailure",
        "UnauthorizedOperation",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "RequestExpired",
        "AccessDenied",
        "AccessDeniedException",  # JSON-protocol services (Cost Explorer)
        "UnrecognizedClientException",  # the same, for an unknown access key id
        "OptInRequired",
        "Blocked",
        "PendingVerification",
    }
)
_UNAVAILABLE = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)


def driver_error(exc: Exception, service: str = "EC2") -> DriverError:
    """What a botocore error means for the caller, as a :class:`DriverError`
    (``service`` names the endpoint in the message when it could not be reached).

    Raises ``exc`` again when it is ``ParamValidationError`` (a request we built
    wrong) or not a botocore error at all: those are bugs, not answers.
    """
    from botocore import exceptions as boto_errors

    if isinstance(exc, boto_errors.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = f"{exc.operation_name}: {code}: {error.get('Message', '')}"
        family = code.split(".", 1)[0]  # "AuthFailure.ServiceLinkedRole..." is AuthFailure
        if code in _CAPACITY:
            return DriverError("capacity", message, retryable=True)
        if code in _QUOTA:
            return DriverError("quota", message)
        if family in _AUTH:
            return DriverError("auth", message)
        if code in _UNAVAILABLE or status >= 500:
            return DriverError("unavailable", message, retryable=True)
        # InvalidParameter*, InvalidAMIID.*, MissingParameter, IdempotentParameterMismatch
        # and any other refusal: the request as sent, which sending again will not fix.
        return DriverError("invalid", message)
    if isinstance(exc, boto_errors.ParamValidationError):
        raise exc
    credential_errors = (
        boto_errors.NoCredentialsError,
        boto_errors.PartialCredentialsError,
        boto_errors.CredentialRetrievalError,
        boto_errors.TokenRetrievalError,
        boto_errors.NoAuthTokenError,
        boto_errors.SSOError,
        boto_errors.UnknownCredentialError,
    )
    if isinstance(exc, credential_errors):
        return DriverError("auth", f"AWS credentials: {exc}")
    if isinstance(exc, boto_errors.BotoCoreError):
        # Connection refused or reset, timeouts, TLS, the client's own retry quota
        # spent, a response it could not read: the endpoint, not the request.
        return DriverError("unavailable", f"{service} endpoint: {exc}", retryable=True)
    raise exc


def billing_error(exc: Exception) -> DriverError:
    """:func:`driver_error` for a Cost Explorer call, saying what fixes the answers an
    operator can fix: a refusal names the IAM permission, and
    ``DataUnavailableException`` (Cost Explorer not enabled yet, or its data not
    ready) is retryable: the billing data is not available yet."""
    error = driver_error(exc, service="Cost Explorer")
    code = _error_code(exc)
    if code.split(".", 1)[0] in ("AccessDenied", "AccessDeniedException"):
        return DriverError(
            "auth",
            f"{error.message} (the head's AWS credentials need the IAM permission"
            f" {BILLING_PERMISSION}, and the account Cost Explorer enabled)",
        )
    if code == "DataUnavailableException":
        return DriverError(
            "unavailable",
            f"the billing data is not available yet ({error.message}): Cost Explorer"
            " prepares an account's data up to 24 hours after it is enabled",
            retryable=True,
        )
    if code == "LimitExceededException":  # Cost Explorer's throttling
        return DriverError("unavailable", error.message, retryable=True)
    return error


class _CostExplorer(Protocol):
    """The part of boto3's Cost Explorer client the driver uses (the project installs
    no ``mypy_boto3_ce`` stubs)."""

    @property
    def meta(self) -> Any: ...

    def get_cost_and_usage(self, **params: Any) -> Mapping[str, Any]: ...


class AwsDriver:
    """EC2 lifecycle for one cluster's burst nodes, and their bill from Cost Explorer
    (see the module docstring for what the operator sets up for that)."""

    name = "aws"
    #: Cost Explorer's data lags up to ~24 h: a day's bill is read 48 h after it.
    billing_settle_seconds: float = BILLING_SETTLE_SECONDS
    #: Each Cost Explorer request costs $0.01: at most one read every 6 h.
    billing_interval_seconds: float = BILLING_INTERVAL_SECONDS

    def __init__(self, config: AwsConfig, options: Mapping[str, Any]) -> None:
        self.config = config
        self.region = _required(config.region, "region")
        self.instance_type = _required(config.instance_type, "instance_type")
        self.ami_id = _required(config.ami_id, "ami_id")
        parsed = _parse_options(options)
        self.endpoint_url: str | None = parsed.get("endpoint_url")
        self.subnet_id: str | None = parsed.get("subnet_id")
        self.security_group_ids: list[str] = list(parsed.get("security_group_ids", []))
        self.iam_instance_profile: str | None = parsed.get("iam_instance_profile")
        self.on_demand_cents_per_hour = float(parsed["on_demand_cents_per_hour"])
        try:
            import boto3  # noqa: F401 - here for the error below; aws_sdk makes the session
            from botocore import exceptions as boto_errors
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigError(
                _KEY, f"the AWS driver needs boto3 ({exc}): pip install 'hypermedia[aws]'"
            ) from None
        self._boto_errors: tuple[type[Exception], ...] = (
            boto_errors.ClientError,
            boto_errors.BotoCoreError,
        )
        self._client_config = Config(
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=READ_TIMEOUT,
            retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        )
        try:
            self._session = aws_sdk.session()
            #: The boto3 EC2 client (public so tests can watch what is sent).
            self.client: EC2Client = self._session.client(
                "ec2",
                region_name=self.region,
                endpoint_url=self.endpoint_url,
                config=self._client_config,
            )
        except boto_errors.BotoCoreError as exc:  # e.g. AWS_PROFILE names no profile
            raise ConfigError(_KEY, f"cannot build an EC2 client: {exc}") from None
        self._cost_explorer: _CostExplorer | None = None
        self._cost_explorer_lock = threading.Lock()
        # The launch's mapping of the AMI's root volume (root_volume_mapping), once read:
        # a list of none or one.
        self._root_volume: list[BlockDeviceMappingTypeDef] | None = None

    @property
    def cost_explorer(self) -> _CostExplorer:
        """The boto3 Cost Explorer client, built on first use (most drivers never read
        billing); in ``us-east-1`` whatever the EC2 region, at ``endpoint_url`` when
        set. Public so tests can watch what is sent."""
        with self._cost_explorer_lock:
            if self._cost_explorer is None:
                self._cost_explorer = cast(
                    "_CostExplorer",
                    self._session.client(
                        "ce",
                        region_name=BILLING_REGION,
                        endpoint_url=self.endpoint_url,
                        config=self._client_config,
                    ),
                )
            return self._cost_explorer

    # -- the Driver interface ---------------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance | DriverError:
        """See :meth:`_create`; an ``unavailable`` answer may have left an instance
        (:func:`~autoscaler.drivers.base.launch_outcome`)."""
        return launch_outcome(self._create(request))

    def _create(self, request: LaunchRequest) -> Instance | DriverError:
        """Start one instance for ``request`` unless one already carries its id."""
        if request.spot and not self.config.spot_enabled:
            return DriverError(
                "invalid", "a spot launch, but cloud_providers.aws.spot_enabled is false"
            )
        context = {"request_id": request.request_id, "queue": request.queue}
        try:
            existing = self._find_request(request)
            if existing is not None:
                log.info(
                    "request %s already has instance %s",
                    request.request_id,
                    existing.instance_id,
                    extra={**context, "action": "launch_found"},
                )
                return existing
            params = self._run_instances_request(request, self._root_volume_mappings())
            reply = self.client.run_instances(**params)
        except self._boto_errors as exc:
            error = driver_error(exc)
            log.warning(
                "launch for request %s failed: %s",
                request.request_id,
                error,
                extra={**context, "action": "launch_failed"},
            )
            return error
        launched = reply["Instances"][0]
        instance = self._instance(launched, tags={**_tags(launched), **request.tags()})
        log.info(
            "launched %s %s (%s) for request %s",
            "spot" if request.spot else "on-demand",
            instance.instance_id,
            self.instance_type,
            request.request_id,
            extra={**context, "instance_id": instance.instance_id, "action": "launch"},
        )
        return instance

    def instances(self, cluster: str) -> list[Instance] | DriverError:
        """The cluster's instances that are not terminated, oldest first."""
        try:
            found = self._describe([_filter(f"tag:{TAG_CLUSTER}", cluster)])
        except self._boto_errors as exc:
            return driver_error(exc)
        return sorted(found, key=lambda i: (i.launched_at, i.instance_id))

    def terminate(self, instance_id: str) -> DriverError | None:
        """Terminate ``instance_id``; one EC2 does not know (any more) is a success."""
        try:
            self.client.terminate_instances(InstanceIds=[instance_id])
        except self._boto_errors as exc:
            if _error_code(exc) == "InvalidInstanceID.NotFound":
                return None
            error = driver_error(exc)
            log.warning(
                "terminate %s failed: %s",
                instance_id,
                error,
                extra={"instance_id": instance_id, "action": "terminate_failed"},
            )
            return error
        log.info(
            "terminating %s",
            instance_id,
            extra={"instance_id": instance_id, "action": "terminate"},
        )
        return None

    def price(self, spot: bool) -> float | DriverError:
        """Cents per hour: the operator's list price on demand; for spot, the lowest
        current price across the region's zones, refused (``capacity``, retryable)
        above ``spot_max_price`` (or above the on-demand price when that is unset, as
        EC2's own default maximum)."""
        if not spot:
            return self.on_demand_cents_per_hour
        if not self.config.spot_enabled:
            return DriverError("invalid", "cloud_providers.aws.spot_enabled is false")
        try:
            dollars = self._spot_price_dollars()
        except self._boto_errors as exc:
            return driver_error(exc)
        if dollars is None:
            return DriverError(
                "invalid", f"no spot price for {self.instance_type} in {self.region}"
            )
        cents = float(dollars * 100)
        cap = self.config.spot_max_price_cents
        if cap is None:
            cap = self.on_demand_cents_per_hour
        if cents > cap:
            return DriverError(
                "capacity",
                f"spot {self.instance_type} costs {cents:g} cents/hour,"
                f" above the {cap:g} cents/hour cap",
                retryable=True,
            )
        return cents

    # -- the BillingReader interface ------------------------------------------------------

    def charges(self, cluster: str, first_day: str, last_day: str) -> list[Charge] | DriverError:
        """What Cost Explorer says ``cluster``'s resources cost on the UTC days
        ``first_day`` .. ``last_day`` (both included): one :class:`Charge` per day and
        request id tag, in cents (``UnblendedCost``), zero amounts left out and negative
        ones (a refund the bill puts on a tagged resource) kept. The cost of the
        cluster's resources without a request id tag comes back with ``request_id``
        "". Cost Explorer does not name instances here: ``instance_id`` stays "".

        One ``GetCostAndUsage`` per page ($0.01 each). Days are ``YYYY-MM-DD``; a
        malformed day or ``last_day`` before ``first_day`` is the caller's bug
        (``ValueError``)."""
        start = _day(first_day)
        end = _day(last_day)
        if end < start:
            raise ValueError(f"last_day {last_day} is before first_day {first_day}")
        params: dict[str, Any] = {
            # End is exclusive: the day after last_day.
            "TimePeriod": {
                "Start": start.isoformat(),
                "End": (end + timedelta(days=1)).isoformat(),
            },
            "Granularity": "DAILY",
            "Metrics": [BILLING_METRIC],
            "Filter": {"Tags": {"Key": TAG_CLUSTER, "Values": [cluster]}},
            "GroupBy": [{"Type": "TAG", "Key": TAG_REQUEST}],
        }
        context = {"cluster": cluster, "action": "billing_read"}
        dollars: dict[tuple[str, str], Decimal] = {}
        pages = 0
        seen_tokens: set[str] = set()
        try:
            while True:
                reply = self.cost_explorer.get_cost_and_usage(**params)
                pages += 1
                problem = _add_charges(dollars, reply)
                if problem is not None:
                    log.warning("billing read for %s: %s", cluster, problem, extra=context)
                    return problem
                token = reply.get("NextPageToken")
                if not token:
                    break
                if token in seen_tokens:  # never ending, at $0.01 a page: stop
                    return DriverError(
                        "invalid", f"Cost Explorer answered the page token {token!r} twice"
                    )
                seen_tokens.add(token)
                params["NextPageToken"] = token
        except self._boto_errors as exc:
            error = billing_error(exc)
            log.warning("billing read for %s failed: %s", cluster, error, extra=context)
            return error
        log.info(
            "billing read for %s, %s .. %s: %d charges in %d pages",
            cluster,
            first_day,
            last_day,
            len(dollars),
            pages,
            extra=context,
        )
        return [
            Charge(day=day, cents=float(amount * 100), request_id=request_id)
            for (day, request_id), amount in sorted(dollars.items())
        ]

    # -- EC2 calls ------------------------------------------------------------------------

    def _find_request(self, request: LaunchRequest) -> Instance | None:
        found = self._describe(
            [
                _filter(f"tag:{TAG_REQUEST}", request.request_id),
                _filter(f"tag:{TAG_CLUSTER}", request.cluster),
            ]
        )
        if len(found) > 1:
            log.warning(
                "request %s has %d instances: %s",
                request.request_id,
                len(found),
                ", ".join(i.instance_id for i in found),
                extra={"request_id": request.request_id, "action": "launch_duplicates"},
            )
        return min(found, key=lambda i: (i.launched_at, i.instance_id), default=None)

    def _describe(self, filters: list[FilterTypeDef]) -> list[Instance]:
        states: FilterTypeDef = {"Name": "instance-state-name", "Values": list(LIVE_STATES)}
        pages = self.client.get_paginator("describe_instances").paginate(Filters=[*filters, states])
        return [
            self._instance(described, tags=_tags(described))
            for page in pages
            for reservation in page.get("Reservations", [])
            for described in reservation.get("Instances", [])
        ]

    def _root_volume_mappings(self) -> list[BlockDeviceMappingTypeDef]:
        """The AMI's root volume mapped to be deleted with the instance (none when the
        AMI has no EBS root), read once: an AMI id names one image for good."""
        if self._root_volume is None:
            images = self.client.describe_images(ImageIds=[self.ami_id]).get("Images", [])
            mapping = root_volume_mapping(images[0]) if images else None
            if mapping is None:
                log.warning(
                    "AMI %s maps no EBS root device: launched with its own block device"
                    " mapping (a root volume it keeps after termination would go on billing)",
                    self.ami_id,
                    extra={"action": "ami_root_unmapped"},
                )
            self._root_volume = [] if mapping is None else [mapping]
        return list(self._root_volume)

    def _spot_price_dollars(self) -> Decimal | None:
        """The lowest of each zone's newest price (EC2 answers, for ``StartTime`` now,
        the price in effect in each zone)."""
        pages = self.client.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=[cast("InstanceTypeType", self.instance_type)],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=datetime.now(UTC),
        )
        newest: dict[str, tuple[datetime, Decimal]] = {}
        for page in pages:
            for entry in page.get("SpotPriceHistory", []):
                zone = entry.get("AvailabilityZone", "")
                when = entry.get("Timestamp", datetime.min.replace(tzinfo=UTC))
                try:
                    price = Decimal(entry.get("SpotPrice", ""))
                except InvalidOperation:
                    continue
                if not price.is_finite() or price <= 0:
                    continue
                if zone not in newest or when > newest[zone][0]:
                    newest[zone] = (when, price)
        return min((price for _, price in newest.values()), default=None)

    def _run_instances_request(
        self, request: LaunchRequest, volumes: list[BlockDeviceMappingTypeDef]
    ) -> RunInstancesRequestTypeDef:
        tags: list[TagTypeDef] = [{"Key": k, "Value": v} for k, v in request.tags().items()]
        tags.append({"Key": "Name", "Value": f"hm-{request.request_id}"})
        specs: list[TagSpecificationTypeDef] = [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ]
        params: RunInstancesRequestTypeDef = {
            "ImageId": self.ami_id,
            "InstanceType": cast("InstanceTypeType", self.instance_type),
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": request.user_data,
            "ClientToken": request.request_id,
            "TagSpecifications": specs,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if volumes:
            params["BlockDeviceMappings"] = volumes
        if self.subnet_id is not None:
            params["SubnetId"] = self.subnet_id
        if self.security_group_ids:
            params["SecurityGroupIds"] = self.security_group_ids
        if self.iam_instance_profile is not None:
            profile = self.iam_instance_profile
            params["IamInstanceProfile"] = (
                {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
            )
        if request.spot:
            spot_options: SpotMarketOptionsTypeDef = {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            }
            if self.config.spot_max_price is not None:
                spot_options["MaxPrice"] = self.config.spot_max_price
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": spot_options,
            }
        return params

    def _instance(self, described: InstanceTypeDef, tags: Mapping[str, str]) -> Instance:
        state = _STATES.get(described.get("State", {}).get("Name", ""), "pending")
        instance = Instance.from_tags(
            described["InstanceId"],
            self.name,
            tags,
            state,
            private_ip=described.get("PrivateIpAddress") or None,
            created=_epoch(described.get("LaunchTime")),
        )
        extra = {"instance_type": str(described.get("InstanceType", self.instance_type))}
        zone = described.get("Placement", {}).get("AvailabilityZone")
        if zone:
            extra["availability_zone"] = zone
        return dataclasses.replace(instance, extra=extra)


# -- helpers ------------------------------------------------------------------------------


def root_volume_mapping(image: ImageTypeDef) -> BlockDeviceMappingTypeDef | None:
    """The mapping a launch of ``image`` sends for its root device: deleted on
    termination, at the AMI's own size (EC2 takes the rest, its snapshot and volume
    type, from the AMI). None when the AMI has no EBS root device to map."""
    root = image.get("RootDeviceName")
    if not root or image.get("RootDeviceType", "ebs") == "instance-store":
        return None
    for mapping in image.get("BlockDeviceMappings", []):
        if mapping.get("DeviceName") == root and "Ebs" in mapping:
            ebs: EbsBlockDeviceTypeDef = {"DeleteOnTermination": True}
            size = mapping["Ebs"].get("VolumeSize")
            if size:
                ebs["VolumeSize"] = size
            return {"DeviceName": root, "Ebs": ebs}
    return None


def _filter(name: str, value: str) -> FilterTypeDef:
    return {"Name": name, "Values": [value]}


def _tags(described: InstanceTypeDef) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in described.get("Tags", []) if "Key" in t and "Value" in t}


def _epoch(moment: object) -> float | None:
    """A time EC2 answers (botocore parses it to an aware datetime) in epoch seconds."""
    if not isinstance(moment, datetime):
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _day(text: str) -> date:
    """A ``YYYY-MM-DD`` day (exactly that form: Cost Explorer takes no other)."""
    if not _DAY.fullmatch(text):
        raise ValueError(f"{text!r} is not a YYYY-MM-DD day")
    return date.fromisoformat(text)


def _add_charges(
    dollars: dict[tuple[str, str], Decimal], reply: Mapping[str, Any]
) -> DriverError | None:
    """Add one ``GetCostAndUsage`` page's groups to ``dollars`` by (day, request id);
    an answer the driver cannot read as dollars of a day is an ``invalid`` error."""
    prefix = f"{TAG_REQUEST}$"
    for result in reply.get("ResultsByTime", []):
        day = str(result.get("TimePeriod", {}).get("Start", ""))
        try:
            _day(day)
        except ValueError:
            return DriverError("invalid", f"Cost Explorer answered a period starting {day!r}")
        for group in result.get("Groups", []):
            keys = group.get("Keys", [])
            key = str(keys[0]) if keys else ""
            if not key.startswith(prefix):
                return DriverError(
                    "invalid", f"Cost Explorer answered the group {keys!r}, not {prefix}<id>"
                )
            where = f"{key} on {day}"
            metric = group.get("Metrics", {}).get(BILLING_METRIC)
            if not isinstance(metric, Mapping):
                return DriverError(
                    "invalid", f"Cost Explorer answered no {BILLING_METRIC}: {where}"
                )
            try:
                amount = Decimal(str(metric.get("Amount")))
            except InvalidOperation:
                amount = Decimal("NaN")
            if not amount.is_finite():
                return DriverError(
                    "invalid",
                    f"Cost Explorer answered the amount {metric.get('Amount')!r}: {where}",
                )
            if amount == 0:
                continue
            unit = metric.get("Unit")
            if unit != "USD":
                return DriverError(
                    "invalid",
                    f"Cost Explorer answered {BILLING_METRIC} in {unit!r}, not USD ({where}):"
                    " the driver reads dollars only",
                )
            request_id = key.removeprefix(prefix)
            dollars[(day, request_id)] = dollars.get((day, request_id), Decimal(0)) + amount
    return None


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def _required(value: str | None, key: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(f"cloud_providers.aws.{key}", "required by the AWS driver")
    return value


def _parse_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``provider.drivers.aws`` options, checked: unknown keys and wrong values are
    refused here rather than ignored at launch time."""
    if not isinstance(options, Mapping):
        raise ConfigError(_KEY, "expected a mapping of options")
    for key in options:
        if key not in OPTION_KEYS:
            close = close_key(str(key), OPTION_KEYS)
            hint = f"did you mean {close}? " if close else ""
            expected = ", ".join(sorted(OPTION_KEYS))
            raise ConfigError(f"{_KEY}.{key}", f"unknown key ({hint}expected one of {expected})")
    parsed: dict[str, Any] = {}
    for key in ("endpoint_url", "subnet_id", "iam_instance_profile"):
        if options.get(key) is not None:
            parsed[key] = _text(options[key], key)
    endpoint = parsed.get("endpoint_url")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"{_KEY}.endpoint_url", f"{endpoint!r} is not an http(s) URL")
    groups = options.get("security_group_ids")
    if groups is not None:
        if not isinstance(groups, list | tuple) or not groups:
            raise ConfigError(
                f"{_KEY}.security_group_ids", "expected a non-empty list of group ids"
            )
        parsed["security_group_ids"] = [
            _text(group, f"security_group_ids.{index}") for index, group in enumerate(groups)
        ]
    if "on_demand_cents_per_hour" not in options:
        raise ConfigError(
            f"{_KEY}.on_demand_cents_per_hour",
            "required: the instance type's on-demand list price in cents per hour",
        )
    price = options["on_demand_cents_per_hour"]
    if (
        isinstance(price, bool)
        or not isinstance(price, int | float)
        or not math.isfinite(price)
        or price <= 0
    ):
        raise ConfigError(
            f"{_KEY}.on_demand_cents_per_hour",
            f"{price!r} is not a positive number of cents per hour",
        )
    parsed["on_demand_cents_per_hour"] = price
    return parsed


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{_KEY}.{key}", f"{value!r} is not a non-empty string")
    return value
