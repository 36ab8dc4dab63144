"""The Google Compute Engine driver (google-cloud-compute, REST transport), and its
billing read from the Cloud Billing export to BigQuery (google-cloud-bigquery).

One zone, one machine type, one image (:class:`~autoscaler.config.GoogleConfig`);
the rest comes from the cluster yaml's ``provider.drivers.google`` options, checked when the
driver is built (an unknown key or a bad value raises
:class:`~hypermedia.errors.ConfigError` naming ``provider.drivers.google.<key>``):

==========================  ==========================================================
``project``                 required: the GCP project id
``on_demand_cents_per_hour`` required, > 0: what :meth:`GcpDriver.price` answers
``spot_cents_per_hour``     required when ``preemptible`` is on (and refused when off)
``network``                 the VPC network (default ``global/networks/default``)
``subnetwork``              the subnetwork (``regions/<r>/subnetworks/<name>``)
``external_ip``             bool, default true: an ephemeral public IP, so a node
                            reaches the head without Cloud NAT
``service_account_email``   the instance's service account (cloud-platform scope)
``disk_size_gb``            int, default 20: the boot disk
``api_endpoint``            ``http(s)://host:port`` instead of Google's (tests)
``anonymous_credentials``   bool, default false: no credentials at all (tests);
                            otherwise ``google.auth.default()``
``billing_export_table``    ``project.dataset.table``: the Cloud Billing *detailed*
                            export (``gcp_billing_export_resource_v1_<ACCOUNT>``)
                            that :meth:`GcpDriver.charges` reads; without it the
                            driver reads no billing
==========================  ==========================================================

How the contract (:mod:`autoscaler.drivers.base`) is kept here:

* The instance name is ``hm-<request_id>``: a second insert of the same request
  answers 409 and the driver answers the instance that already has the name.
* Labels carry :data:`~autoscaler.drivers.base.TAG_KEYS`, on the instance and on its
  boot disk; :meth:`GcpDriver.instances` lists by the ``hypermedia-cluster`` label.
  An instance without the launch time label (created by hand with the cluster's label,
  the label removed) is launched at its ``creationTimestamp``, so the provider counts
  what it billed before it was seen.
  ``STOPPING``, ``SUSPENDED`` and ``TERMINATED`` instances are listed as
  ``terminating`` rather than left out: a stopped instance still exists (and its disk
  still bills) until it is deleted.
* Operations are waited on with ``ZoneOperationsClient.wait`` built with the same
  endpoint and credentials (``ExtendedOperation.result()`` would poll Google's
  host whatever the endpoint), for at most ``operation_timeout`` seconds.
* Every ``google.api_core`` / ``google.auth`` / connection error is translated into a
  :class:`~autoscaler.drivers.base.DriverError` where it enters (:func:`translate`).
* **Billing** (:class:`~autoscaler.drivers.base.BillingReader`): Google Cloud has no
  per-instance billing API; the resource-level costs are in the Cloud Billing detailed
  export to BigQuery, which the operator enables (Billing > Billing export > Detailed
  usage cost) and names in ``billing_export_table``. :meth:`GcpDriver.charges` runs one
  parameterized standard-SQL query (:func:`billing_sql`) in ``project`` (the driver's
  credentials need ``roles/bigquery.jobUser`` there and ``roles/bigquery.dataViewer``
  on the export's dataset): cost plus credits per UTC day of ``usage_start_time``, per
  ``hypermedia-request`` label and per ``resource.name``, for the rows labelled with the
  cluster, scanning only the days' partitions (a day's margin on each side). The BigQuery
  client uses ``api_endpoint`` and ``anonymous_credentials`` as the Compute client does.
  The export lags hours, up to a day (:data:`BILLING_SETTLE_SECONDS`), and a query bills
  at least 10 MB scanned (:data:`BILLING_INTERVAL_SECONDS`). The SQL is checked against
  BigQuery's documented export schema only: the tests run the real SDK against a local
  server that speaks BigQuery's REST API and answers canned rows, not a real BigQuery.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from autoscaler.config import GoogleConfig
from autoscaler.drivers.base import (
    TAG_CLUSTER,
    TAG_REQUEST,
    Charge,
    DriverError,
    ErrorCode,
    Instance,
    InstanceState,
    LaunchRequest,
    launch_outcome,
)
from hypermedia.config_errors import unknown_key
from hypermedia.errors import ConfigError

_KEY = "provider.drivers.google"  # where these options live in the cluster yaml

if TYPE_CHECKING:
    from google.cloud import bigquery, compute_v1

log = logging.getLogger(__name__)

PROVIDER = "google"
INSTALL_HINT = "pip install 'hypermedia[gcp]'"
NAME_PREFIX = "hm-"
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"
NODE_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
BIGQUERY_SCOPE = "https://www.googleapis.com/auth/bigquery"

#: The Cloud Billing export to BigQuery lags the usage by hours, up to a day (and
#: credits can come later still): a day's charges are compared two days after it ended.
BILLING_SETTLE_SECONDS = 48 * 3600.0
#: A query bills at least 10 MB scanned, whatever it reads: once an hour at most.
BILLING_INTERVAL_SECONDS = 3600.0
#: The longest a billing query is waited for (in the scheduler's turn).
BILLING_WAIT_SECONDS = 60.0
#: The export's partitions (``_PARTITIONTIME``, daily) are not the UTC days of the usage:
#: Google's billing days are Pacific time, and rows are exported hours later. So a UTC
#: day's rows are searched in the partitions of the day before and the day after as well
#: (the filter on ``usage_start_time`` keeps the days asked). This is a reading of the
#: docs and of public queries of the export, not checked against a real export here.
PARTITION_MARGIN = timedelta(days=1)

_STATES: dict[str, InstanceState] = {
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "REPAIRING": "pending",
    "RUNNING": "running",
    "STOPPING": "terminating",
    "SUSPENDING": "terminating",
    "SUSPENDED": "terminating",
    "TERMINATED": "terminating",
}

# Reasons (HTTP error ``errors[].reason``, ``ErrorInfo.reason``) and operation error
# codes, upper-cased, that say more than the HTTP status (a quota answers 403 too).
_RATE = frozenset({"RATELIMITEXCEEDED", "RATE_LIMIT_EXCEEDED", "USERRATELIMITEXCEEDED"})
_QUOTA = _RATE | {"QUOTAEXCEEDED", "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED"}
_CAPACITY = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "STOCKOUT",
    }
)
# Deleting an instance whose insert is still running answers 400 resourceNotReady.
_NOT_READY = frozenset({"RESOURCENOTREADY", "RESOURCE_NOT_READY"})
_EXISTS = frozenset({"ALREADY_EXISTS", "RESOURCE_ALREADY_EXISTS", "ALREADYEXISTS"})
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{1,63}$")
_DAY = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")
# project (optionally domain-scoped, "example.com:project") . dataset . table: the
# characters BigQuery allows in each, less the ones that could leave the back quotes.
_TABLE = re.compile(
    r"^(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]"
    r"\.[A-Za-z0-9_]{1,1024}\.[A-Za-z0-9_-]{1,1024}$"
)
_OPTIONS = frozenset(
    {
        "project",
        "api_endpoint",
        "anonymous_credentials",
        "network",
        "subnetwork",
        "external_ip",
        "service_account_email",
        "disk_size_gb",
        "on_demand_cents_per_hour",
        "spot_cents_per_hour",
        "billing_export_table",
    }
)


class GcpDriver:
    """Lifecycle I/O against Compute Engine in one zone, and a
    :class:`~autoscaler.drivers.base.BillingReader` of the billing export (see the
    module docstring)."""

    name = PROVIDER
    billing_settle_seconds = BILLING_SETTLE_SECONDS
    billing_interval_seconds = BILLING_INTERVAL_SECONDS

    def __init__(
        self,
        config: GoogleConfig,
        options: Mapping[str, Any],
        *,
        request_timeout: float = 60.0,
        operation_timeout: float = 300.0,
    ) -> None:
        self.zone = _required_config(config.zone, "zone")
        self.machine_type = _required_config(config.machine_type, "machine_type")
        self.image = _required_config(config.image, "image")
        self.preemptible = config.preemptible
        self.request_timeout = request_timeout
        self.operation_timeout = operation_timeout

        if not isinstance(options, Mapping):
            raise ConfigError(_KEY, "expected a mapping of options")
        unknown = sorted(str(key) for key in options if key not in _OPTIONS)
        if unknown:
            raise ConfigError(f"{_KEY}.{unknown[0]}", unknown_key(unknown[0], _OPTIONS))
        project = _string(options, "project")
        if project is None:
            raise ConfigError(f"{_KEY}.project", "required")
        self.project = project
        self.network = _string(options, "network")
        self.subnetwork = _string(options, "subnetwork")
        self.service_account_email = _string(options, "service_account_email")
        if self.service_account_email is not None and "@" not in self.service_account_email:
            raise ConfigError(f"{_KEY}.service_account_email", "expected an e-mail address")
        self.external_ip = _bool(options, "external_ip", default=True)
        self.disk_size_gb = _int(options, "disk_size_gb", default=20, low=10, high=65_536)
        on_demand = _price(options, "on_demand_cents_per_hour")
        if on_demand is None:
            raise ConfigError(f"{_KEY}.on_demand_cents_per_hour", "required")
        self.on_demand_cents_per_hour = on_demand
        self.spot_cents_per_hour = _price(options, "spot_cents_per_hour")
        if self.preemptible and self.spot_cents_per_hour is None:
            raise ConfigError(
                f"{_KEY}.spot_cents_per_hour",
                "required when cloud_providers.google.preemptible is true",
            )
        if not self.preemptible and self.spot_cents_per_hour is not None:
            raise ConfigError(
                f"{_KEY}.spot_cents_per_hour",
                "set but cloud_providers.google.preemptible is false: it would never be used",
            )
        endpoint = _string(options, "api_endpoint")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(
                f"{_KEY}.api_endpoint",
                f"{endpoint!r} needs its scheme (http://, https://)",
            )
        anonymous = _bool(options, "anonymous_credentials", default=False)
        self.billing_export_table = _string(options, "billing_export_table")
        if self.billing_export_table is not None and not _TABLE.match(self.billing_export_table):
            raise ConfigError(
                f"{_KEY}.billing_export_table",
                f"expected project.dataset.table (the detailed billing export), not"
                f" {self.billing_export_table!r}",
            )

        try:
            from google.api_core.client_options import ClientOptions
            from google.cloud import compute_v1
        except ImportError as exc:
            raise ConfigError(
                _KEY, f"google-cloud-compute is not installed ({INSTALL_HINT})"
            ) from exc
        credentials = _credentials(anonymous, COMPUTE_SCOPE)
        client_options = ClientOptions(api_endpoint=endpoint) if endpoint is not None else None
        self._instances = compute_v1.InstancesClient(
            credentials=credentials, client_options=client_options, transport="rest"
        )
        self._operations = compute_v1.ZoneOperationsClient(
            credentials=credentials, client_options=client_options, transport="rest"
        )
        self._bigquery: bigquery.Client | None = None
        if self.billing_export_table is not None:
            try:
                from google.cloud import bigquery
            except ImportError as exc:
                raise ConfigError(
                    f"{_KEY}.billing_export_table",
                    f"reading the billing export needs google-cloud-bigquery, which is not"
                    f" installed ({INSTALL_HINT})",
                ) from exc
            self._bigquery = bigquery.Client(
                project=self.project,
                credentials=_credentials(anonymous, BIGQUERY_SCOPE),
                client_options=client_options,
            )

    # -- the Driver interface -----------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance | DriverError:
        """See :meth:`_create`; an ``unavailable`` answer may have left an instance
        (:func:`~autoscaler.drivers.base.launch_outcome`)."""
        return launch_outcome(self._create(request))

    def _create(self, request: LaunchRequest) -> Instance | DriverError:
        """Insert ``hm-<request_id>`` and wait for the operation; a name that exists
        already (a repeated launch) answers the instance that has it."""
        if request.spot and not self.preemptible:
            return DriverError(
                "invalid", "spot requested but cloud_providers.google.preemptible is false"
            )
        name = NAME_PREFIX + request.request_id
        try:
            operation = self._instances.insert_unary(
                project=self.project,
                zone=self.zone,
                instance_resource=self._instance_resource(name, request),
                retry=None,
                timeout=self.request_timeout,
            )
        except Exception as exc:
            if _status(exc) == 409:
                log.info(
                    "instance %s exists already: answering it",
                    name,
                    extra={"request_id": request.request_id, "action": "launch"},
                )
                return self._existing(name, request)
            return translate(exc, f"insert {name}")
        finished = self._wait(operation, f"insert {name}")
        if isinstance(finished, DriverError):
            return finished
        if not finished.done:
            return DriverError(
                "unavailable",
                f"insert {name}: operation {finished.name} still running after"
                f" {self.operation_timeout:.0f} s (launch again to answer it)",
                retryable=True,
            )
        if {e.code.upper() for e in finished.error.errors} & _EXISTS:
            return self._existing(name, request)
        failed = _operation_error(finished, f"insert {name}")
        if failed is not None:
            return failed
        found = self._get(name)
        if isinstance(found, Instance):
            return found
        # The insert is done, so the instance exists: only this read failed.
        return Instance.from_tags(name, PROVIDER, request.tags(), "pending")

    def instances(self, cluster: str) -> list[Instance] | DriverError:
        """Instances labelled with ``cluster`` in the zone, deleted ones excepted."""
        if not _LABEL_VALUE.match(cluster):
            return DriverError("invalid", f"cluster {cluster!r} is not a label value")
        from google.cloud import compute_v1

        request = compute_v1.ListInstancesRequest(
            project=self.project,
            zone=self.zone,
            filter=f'labels.{TAG_CLUSTER} = "{cluster}"',
            max_results=500,
        )
        try:
            pages = self._instances.list(request=request, retry=None, timeout=self.request_timeout)
            found = [self._instance(item) for item in pages]
        except Exception as exc:
            return translate(exc, f"list instances of {cluster}")
        return found

    def terminate(self, instance_id: str) -> DriverError | None:
        """Delete the instance; one already gone (404) is a success, and so is a
        deletion still running when ``operation_timeout`` runs out (it is listed
        as ``terminating`` until it is gone)."""
        try:
            operation = self._instances.delete_unary(
                project=self.project,
                zone=self.zone,
                instance=instance_id,
                retry=None,
                timeout=self.request_timeout,
            )
        except Exception as exc:
            error = translate(exc, f"delete {instance_id}")
            return None if error.code == "not_found" else error
        finished = self._wait(operation, f"delete {instance_id}")
        if isinstance(finished, DriverError):
            return finished
        if not finished.done:
            log.warning(
                "delete %s: operation %s still running after %.0f s",
                instance_id,
                finished.name,
                self.operation_timeout,
                extra={"action": "terminate"},
            )
            return None
        failed = _operation_error(finished, f"delete {instance_id}")
        return None if failed is None or failed.code == "not_found" else failed

    def price(self, spot: bool) -> float | DriverError:
        """The configured price (Compute Engine has no price API worth a call here)."""
        if not spot:
            return self.on_demand_cents_per_hour
        if not self.preemptible or self.spot_cents_per_hour is None:
            return DriverError(
                "invalid", "spot price asked but cloud_providers.google.preemptible is false"
            )
        return self.spot_cents_per_hour

    # -- the BillingReader interface ----------------------------------------------------

    def charges(self, cluster: str, first_day: str, last_day: str) -> list[Charge] | DriverError:
        """What the billing export says the resources labelled with ``cluster`` cost on
        the UTC days ``first_day`` .. ``last_day``: one :class:`Charge` per day, request
        label and resource name (cost plus credits, in cents). Days the export has not
        reached yet are missing."""
        table = self.billing_export_table
        if self._bigquery is None or table is None:
            return DriverError(
                "invalid",
                "Google Cloud bills no instance by itself: set"
                f" {_KEY}.billing_export_table to the detailed billing export table"
                " (project.dataset.gcp_billing_export_resource_v1_<BILLING_ACCOUNT>; Billing"
                " > Billing export > Detailed usage cost)",
            )
        if not _LABEL_VALUE.match(cluster):
            return DriverError("invalid", f"cluster {cluster!r} is not a label value")
        first, last = _day(first_day), _day(last_day)
        if first is None or last is None:
            return DriverError(
                "invalid", f"days {first_day!r} .. {last_day!r}: expected YYYY-MM-DD"
            )
        if last < first:
            return []
        from google.cloud import bigquery

        start = datetime(first.year, first.month, first.day, tzinfo=UTC)
        end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
        job_config = bigquery.QueryJobConfig(
            use_legacy_sql=False,
            query_parameters=[
                bigquery.ScalarQueryParameter("cluster_key", "STRING", TAG_CLUSTER),
                bigquery.ScalarQueryParameter("cluster", "STRING", cluster),
                bigquery.ScalarQueryParameter("request_key", "STRING", TAG_REQUEST),
                bigquery.ScalarQueryParameter("project", "STRING", self.project),
                bigquery.ScalarQueryParameter("usage_start", "TIMESTAMP", start),
                bigquery.ScalarQueryParameter("usage_end", "TIMESTAMP", end),
                bigquery.ScalarQueryParameter(
                    "partition_start", "TIMESTAMP", start - PARTITION_MARGIN
                ),
                bigquery.ScalarQueryParameter("partition_end", "TIMESTAMP", end + PARTITION_MARGIN),
            ],
        )
        action = f"read {cluster}'s charges of {first_day} .. {last_day} from {table}"
        try:
            rows = self._bigquery.query_and_wait(
                billing_sql(table),
                job_config=job_config,
                api_timeout=self.request_timeout,
                # Read in the leader's turn: a slow query must not hold the scaling up
                # (nor outlast the lease); the next read tries again.
                wait_timeout=min(self.operation_timeout, BILLING_WAIT_SECONDS),
                # No retries: the scheduler reads again at its next interval. (The SDK
                # takes None for both, as its docstring says, but annotates Retry.)
                retry=None,  # type: ignore[arg-type]
                job_retry=None,  # type: ignore[arg-type]
            )
            found = [dict(row.items()) for row in rows]  # the further pages load here
        except Exception as exc:
            return self._billing_error(exc, action, table)
        charges = []
        for row in found:
            charge = _charge(row)
            if isinstance(charge, str):
                return DriverError("invalid", f"{action}: {charge}")
            charges.append(charge)
        return charges

    def _billing_error(self, exc: BaseException, action: str, table: str) -> DriverError:
        try:
            error = translate(exc, action)
        except Exception:
            # Not an API, credentials or network error: say what it was, never raise.
            log.exception("%s: unexpected %s", action, type(exc).__name__)
            return DriverError("invalid", f"{action}: unexpected {type(exc).__name__}: {exc}")
        if error.code == "auth":
            dataset = table.rsplit(".", 1)[0]
            return replace(
                error,
                message=f"{error.message} (the driver's credentials need"
                f" roles/bigquery.jobUser on project {self.project}, where the query runs,"
                f" and roles/bigquery.dataViewer on the dataset {dataset})",
            )
        if error.code == "not_found":
            return DriverError(
                "invalid",
                f"{error.message} (is {_KEY}.billing_export_table = {table} the detailed"
                " billing export, and can the driver's credentials see it?)",
            )
        return error

    # -- helpers ------------------------------------------------------------------------

    def _instance_resource(self, name: str, request: LaunchRequest) -> compute_v1.Instance:
        from google.cloud import compute_v1 as compute

        disk = compute.AttachedDisk(
            boot=True,
            auto_delete=True,
            # The disk carries the instance's labels too, so its cost in the billing
            # export is the cluster's and the request's.
            initialize_params=compute.AttachedDiskInitializeParams(
                source_image=self.image, disk_size_gb=self.disk_size_gb, labels=request.tags()
            ),
        )
        interface = compute.NetworkInterface(network=self.network or "global/networks/default")
        if self.subnetwork is not None:
            interface.subnetwork = self.subnetwork
        if self.external_ip:
            interface.access_configs = [
                compute.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
            ]
        if request.spot:
            scheduling = compute.Scheduling(
                provisioning_model="SPOT",
                instance_termination_action="DELETE",
                automatic_restart=False,
                on_host_maintenance="TERMINATE",
            )
        else:
            scheduling = compute.Scheduling(provisioning_model="STANDARD")
        instance = compute.Instance(
            name=name,
            machine_type=f"zones/{self.zone}/machineTypes/{self.machine_type}",
            disks=[disk],
            network_interfaces=[interface],
            labels=request.tags(),
            metadata=compute.Metadata(
                items=[compute.Items(key="startup-script", value=request.user_data)]
            ),
            scheduling=scheduling,
        )
        if self.service_account_email is not None:
            instance.service_accounts = [
                compute.ServiceAccount(email=self.service_account_email, scopes=[NODE_SCOPE])
            ]
        return instance

    def _existing(self, name: str, request: LaunchRequest) -> Instance | DriverError:
        found = self._get(name)
        if isinstance(found, DriverError) and found.code == "not_found":
            # Named but gone between the two calls (deleted, or its insert failed).
            return DriverError("not_found", f"{name} exists and is gone again", retryable=True)
        if isinstance(found, Instance) and found.request_id != request.request_id:
            return DriverError("invalid", f"{name} exists but belongs to another request")
        return found

    def _get(self, name: str) -> Instance | DriverError:
        try:
            item = self._instances.get(
                project=self.project,
                zone=self.zone,
                instance=name,
                retry=None,
                timeout=self.request_timeout,
            )
        except Exception as exc:
            return translate(exc, f"get {name}")
        return self._instance(item)

    def _instance(self, item: compute_v1.Instance) -> Instance:
        state = _STATES.get(item.status, "pending")
        private_ip = next((i.network_i_p for i in item.network_interfaces if i.network_i_p), None)
        found = Instance.from_tags(
            item.name,
            PROVIDER,
            dict(item.labels),
            state,
            private_ip,
            created=_timestamp(item.creation_timestamp),
        )
        return replace(found, extra={"zone": self.zone, "status": item.status})

    def _wait(
        self, operation: compute_v1.Operation, action: str
    ) -> compute_v1.Operation | DriverError:
        """The operation once done, or as it stands when ``operation_timeout`` runs out."""
        from requests.exceptions import Timeout

        deadline = time.monotonic() + self.operation_timeout
        pause = 0.1
        while not operation.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return operation
            started = time.monotonic()
            try:
                operation = self._operations.wait(
                    project=self.project,
                    zone=self.zone,
                    operation=operation.name,
                    retry=None,
                    # Google holds a wait up to 2 minutes; give up with the deadline.
                    timeout=max(remaining, 1.0),
                )
            except Timeout:
                continue  # held until our deadline: still running
            except Exception as exc:
                return translate(exc, f"{action} (waiting for {operation.name})")
            if not operation.done and time.monotonic() - started < pause:
                # A server that answers at once rather than holding the wait.
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, 2.0)
        return operation


def billing_sql(table: str) -> str:
    """The query :meth:`GcpDriver.charges` runs: every value is a query parameter; the
    table name (checked against ``_TABLE``) is the one thing in the text.

    Per row of the export labelled ``@cluster_key = @cluster`` in ``@project``: its
    cost plus its credits (negative amounts), summed per UTC day of
    ``usage_start_time``, ``@request_key`` label value and ``resource.name`` (a boot
    disk is named like its instance), with the currency. The ``_PARTITIONTIME`` bounds
    keep the scan to the days asked and their margin."""
    if not _TABLE.match(table):
        raise ValueError(f"{table!r} is not project.dataset.table")
    # S608: the table name is the one thing formatted in, matched against _TABLE above.
    return f"""\
WITH charged AS (
  SELECT
    DATE(usage_start_time, "UTC") AS usage_day,
    (SELECT kv.value FROM UNNEST(labels) AS kv WHERE kv.key = @request_key LIMIT 1)
      AS request_id,
    resource.name AS resource_name,
    currency,
    cost + IFNULL((SELECT SUM(credit.amount) FROM UNNEST(credits) AS credit), 0) AS amount
  FROM `{table}`
  WHERE _PARTITIONTIME >= @partition_start AND _PARTITIONTIME < @partition_end
    AND usage_start_time >= @usage_start AND usage_start_time < @usage_end
    AND project.id = @project
    AND EXISTS (
      SELECT 1 FROM UNNEST(labels) AS kv WHERE kv.key = @cluster_key AND kv.value = @cluster
    )
)
SELECT usage_day, request_id, resource_name, currency, SUM(amount) AS amount
FROM charged
GROUP BY usage_day, request_id, resource_name, currency
ORDER BY usage_day, request_id, resource_name, currency
"""  # noqa: S608


def _charge(row: Mapping[str, Any]) -> Charge | str:
    """One result row as a :class:`Charge`, or what is wrong with it."""
    day, amount, currency = row.get("usage_day"), row.get("amount"), row.get("currency")
    if currency != "USD":
        return (
            f"the billing export is in {currency!r}, not USD: the ledger counts US cents"
            " (a billing account's currency is set when it is created)"
        )
    if isinstance(day, datetime) or not isinstance(day, date) or isinstance(amount, bool):
        return f"unexpected row {dict(row)!r}"
    if not isinstance(amount, int | float | Decimal) or not math.isfinite(amount):
        return f"unexpected amount in row {dict(row)!r}"
    request_id, resource_name = row.get("request_id"), row.get("resource_name")
    return Charge(
        day=day.isoformat(),
        cents=round(float(amount) * 100.0, 6),
        request_id=request_id if isinstance(request_id, str) else "",
        instance_id=resource_name if isinstance(resource_name, str) else "",
    )


def _timestamp(text: str) -> float | None:
    """An RFC 3339 time Compute Engine answers (``creationTimestamp``:
    ``2026-12-06T01:02:03.456-08:00``) in epoch seconds; None when absent or unreadable."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _day(text: str) -> date | None:
    if not isinstance(text, str) or not _DAY.match(text):
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def translate(exc: BaseException, action: str) -> DriverError:
    """The :class:`DriverError` for what the SDK (or the network under it) raised."""
    from google.api_core import exceptions as core
    from google.auth import exceptions as auth

    if isinstance(exc, core.GoogleAPICallError):
        return classify(_status(exc), _reasons(exc), f"{action}: {exc.message}")
    if isinstance(exc, core.RetryError):
        return DriverError("unavailable", f"{action}: {exc}", retryable=True)
    if isinstance(exc, auth.RefreshError | auth.DefaultCredentialsError):
        # Includes a 401 that credentials could not refresh their way out of.
        return DriverError("auth", f"{action}: {exc}")
    if isinstance(exc, auth.TransportError | auth.TimeoutError | OSError):
        # requests' ConnectionError and Timeout are OSErrors.
        return DriverError("unavailable", f"{action}: {type(exc).__name__}: {exc}", retryable=True)
    if isinstance(exc, auth.GoogleAuthError):
        return DriverError("auth", f"{action}: {exc}")
    raise exc


def classify(status: int | None, reasons: Iterable[str], message: str) -> DriverError:
    """An HTTP status and Google's error reasons / operation error codes as a value."""
    upper = {reason.upper() for reason in reasons if reason}
    code: ErrorCode
    if upper & _CAPACITY:
        return DriverError("capacity", message, retryable=True)
    if upper & _NOT_READY:
        return DriverError("unavailable", message, retryable=True)
    if upper & _QUOTA or status == 429:
        return DriverError("quota", message, retryable=bool(upper & _RATE) or status == 429)
    if status in (401, 403):
        code, retryable = "auth", False
    elif status == 404:
        code, retryable = "not_found", False
    elif status in (400, 409, 412, 422):
        code, retryable = "invalid", False
    else:  # 5xx, no status at all, the unexpected: the same call may work later
        code, retryable = "unavailable", True
    return DriverError(code, message, retryable)


def _operation_error(operation: compute_v1.Operation, action: str) -> DriverError | None:
    """What a finished operation failed with, or None."""
    errors = list(operation.error.errors)
    if not errors and operation.http_error_status_code < 400:
        return None
    detail = "; ".join(f"{e.code}: {e.message}" for e in errors) or operation.http_error_message
    status = operation.http_error_status_code or None
    return classify(status, (e.code for e in errors), f"{action}: {detail or 'failed'}")


def _status(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def _reasons(exc: Any) -> list[str]:
    found = [exc.reason] if isinstance(exc.reason, str) else []
    for error in exc.errors or ():
        reason = error.get("reason") if isinstance(error, Mapping) else None
        if isinstance(reason, str):
            found.append(reason)
    return found


def _credentials(anonymous: bool, scope: str) -> Any:
    from google.auth import default as google_auth_default
    from google.auth import exceptions as auth
    from google.auth.credentials import AnonymousCredentials

    if anonymous:
        return AnonymousCredentials()  # type: ignore[no-untyped-call]  # unannotated __init__
    try:
        credentials, _project = google_auth_default(scopes=[scope])
    except auth.DefaultCredentialsError as exc:
        raise ConfigError(_KEY, f"no Google credentials (google.auth.default): {exc}") from None
    return credentials


def _required_config(value: str | None, key: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(f"cloud_providers.google.{key}", "required by the google driver")
    return value


def _string(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{_KEY}.{key}", f"expected a non-empty string, not {value!r}")
    return value


def _bool(options: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{_KEY}.{key}", f"expected true or false, not {value!r}")
    return value


def _int(options: Mapping[str, Any], key: str, *, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{_KEY}.{key}",
            f"expected a whole number from {low} to {high}, not {value!r}",
        )
    return value


def _price(options: Mapping[str, Any], key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{_KEY}.{key}", f"expected a number of cents, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{_KEY}.{key}", f"expected a price above 0, not {value!r}")
    return float(value)
