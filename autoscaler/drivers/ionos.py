"""IONOS Cloud driver: servers in one datacenter through ``ionoscloud`` (Cloud API v6).

Keeps the contract of :mod:`autoscaler.drivers.base`:

* **launch** lists the datacenter's servers and answers the one named
  ``hm-<request id>.<cluster>`` (or ``hm-<request id>``, the name before the cluster was
  in it) if there is one (IONOS has no client token: the name is the idempotency key); a
  leftover of a failed create (state FAILED) is deleted and replaced.
  Otherwise one ``POST /datacenters/{dc}/servers`` creates the server with its boot
  volume (``image`` or ``imageAlias``, ``userData`` = base64 of the boot script, unchanged)
  and, with ``lan_id``, a DHCP NIC in that LAN. The answer is 202 with
  ``Location: …/requests/{id}/status``; the driver polls that request until DONE.
  FAILED: the server is deleted and the launch answers ``capacity`` (retryable). Still
  unfinished after ``launch_timeout_seconds`` (or the poll failing): the labelled server is
  answered as ``pending``; it is real, it bills, and :meth:`IonosDriver.instances` follows it.
* **The name says whose the server is** from its first moment (:func:`server_name`):
  IONOS takes no labels in the create, unlike AWS (tags in ``RunInstances``) and GCP
  (labels in the insert). A cluster (``[a-z0-9_-]``, 63 at most) and a request id
  (``[a-z0-9-]``, 40 at most) hold no dot, so the name parses back unambiguously; it is
  107 characters at most (the provider's request ids make it 25 + the cluster's). The
  Cloud API sets no length or character rule on ``name`` (only on ``hostname``, which
  the driver leaves to IONOS); the test server accepts any non-empty name.
* **Tags are server labels** (``/datacenters/{dc}/servers/{id}/labels``, one per
  :data:`~autoscaler.drivers.base.TAG_KEYS` key), written right after the create is
  accepted, while IONOS builds the server (if IONOS refuses one then, the missing ones are
  written again once the wait is over). A launch answers an
  :class:`~autoscaler.drivers.base.Instance` only when every label is on; when they cannot
  be written the server is deleted and the launch answers the error, so no launch leaves
  an unlabelled server behind. When the delete fails too, the launch answers the error as
  ``maybe_launched`` and :meth:`IonosDriver.instances` lists the server under the launch's
  tags (kept in memory) until it is gone, so the provider counts it and can terminate it.
  A crash between the create and its labels (a few requests), or a restart before such a
  server is gone, leaves a server with no labels or only some: it is listed by its name
  (below), and launching again with the same request id finds it by name and labels it.
  :meth:`IonosDriver.instances` reads every label with one ``GET /labels`` and rebuilds
  instances with :meth:`Instance.from_tags`: a fresh process sees the cluster from IONOS
  alone.
* **instances**: the datacenter's servers whose ``hypermedia-cluster`` label is the
  cluster, and those without that label whose name is ``hm-<request id>.<cluster>``:
  their tags are what labels they have over what the name says (cluster, request id,
  not spot, launched at the server's ``createdDate``; no node type, queue nor price, so
  the provider counts them at the on-demand list price). Only a server named the old way
  (by a driver from before the cluster was in the name) that lost its labels stays
  unseen. A server without the launch time label (those listed by name, one labelled
  by hand with the cluster's label, a label removed) is launched at its
  ``metadata.createdDate``, so the provider counts what it billed before it was seen.
  State from ``metadata.state`` and ``properties.vmState``
  (:func:`server_state`). IONOS shows a server being deleted as BUSY, like one being
  built: the ids this driver deleted read ``terminating`` until they are gone.
* **terminate**: ``DELETE …/servers/{id}?deleteVolumes=True`` (the boot volume goes
  too), not waited on; 404 is a success.
* **price**: ``on_demand_cents_per_hour`` from the options (IONOS publishes no price API);
  IONOS has no spot market, so ``price(spot=True)`` answers ``invalid``.

Configuration: :class:`~autoscaler.config.IonosConfig` (``datacenter``: a datacenter id
or a location such as ``de/fra`` with exactly one datacenter of the account in it;
``server_type``: ENTERPRISE or VCPU, sized by the options; CUBE servers take their size
from a template and are refused, as is anything else; ``image``: an image id, an alias
such as ``ubuntu:latest``, or the name of exactly one HDD image in the datacenter's
location) and the ``ionos`` section of the cluster yaml's provider config:

======================== ===================================================== =======
option                   meaning                                               default
======================== ===================================================== =======
on_demand_cents_per_hour what one server costs, cents per hour (> 0)           required
cores                    cores per server                                      4
ram_mb                   RAM per server, MB, a multiple of 256                 8192
disk_gb                  boot volume size, GB                                  20
lan_id                   LAN of the server's NIC (DHCP); none: no NIC          none
ssh_keys                 public keys for the boot volume (public images need   none
                         keys or a password; the driver sets no password)
wait_seconds             the SDK's wait before retrying a 429/502/503/504 (and  5
                         its cap on Retry-After); also the request poll interval
launch_timeout_seconds   how long a launch waits for the create request         900
host                     API base URL (tests)                  https://api.ionos.com/cloudapi/v6
======================== ===================================================== =======

Unknown keys and bad values raise :class:`~hypermedia.errors.ConfigError` naming
``provider.drivers.ionos.<key>``. Credentials come from the environment only: ``IONOS_TOKEN``
(Bearer) or ``IONOS_USERNAME`` + ``IONOS_PASSWORD`` (Basic); they never reach user data.

Errors, translated where they enter (:meth:`IonosDriver._call`): 401/403 ``auth``;
400/422 and other 4xx ``invalid``; 404 ``not_found``; 429 ``quota`` (retryable);
5xx, connection failures and timeouts ``unavailable`` (retryable). The SDK retries a
429/502/503/504 once after ``wait_seconds`` (its default: three tries 100 s apart), and
every HTTP call has a connect/read timeout; the driver polls request status itself rather
than through ``ApiClient.wait_for_completion``, which sets no HTTP timeout.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from autoscaler.config import IonosConfig, ionos_server_type_problem
from autoscaler.drivers.base import (
    TAG_CLUSTER,
    TAG_REQUEST,
    TAG_SPOT,
    DriverError,
    Instance,
    InstanceState,
    LaunchRequest,
    launch_outcome,
)
from hypermedia.config_errors import close_key
from hypermedia.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_HOST = "https://api.ionos.com/cloudapi/v6"
NAME_PREFIX = "hm-"
VOLUME_TYPE = "SSD Standard"
TIMEOUT = (10.0, 60.0)  # connect, read: seconds, for every HTTP call
SDK_TRIES = 2  # the SDK's tries of one call on 429/502/503/504
PAGE = 1000
TAG_PREFIX = "hypermedia-"

# A server's name: NAME_PREFIX, the request id, ".", the cluster (neither holds a dot).
_NAME = re.compile(r"^hm-(?P<request>[a-z][a-z0-9-]{5,39})\.(?P<cluster>[a-z0-9_-]{1,63})$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_STATUS_PATH = re.compile(r"/requests/([^/?#]+)/status")
_DEAD = frozenset({"FAILED", "DESTROYING", "FAILED_DESTROYING", "INACTIVE", "TERMINATED"})
_UNFINISHED = frozenset({"BUSY", "DEPLOYING", "UPDATING"})

T = TypeVar("T")


@dataclass(frozen=True)  # not slots: parse() reads the defaults off the class
class IonosOptions:
    """The ``ionos`` provider options (see the module docstring), validated."""

    on_demand_cents_per_hour: float
    host: str = DEFAULT_HOST
    cores: int = 4
    ram_mb: int = 8192
    disk_gb: int = 20
    lan_id: int | None = None
    ssh_keys: tuple[str, ...] = ()
    wait_seconds: float = 5.0
    launch_timeout_seconds: float = 900.0

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> IonosOptions:
        known = {f.name for f in dataclasses.fields(cls)}
        for key in options:
            if key in ("username", "password", "token"):
                raise ConfigError(
                    _key(key),
                    "credentials come from the environment only"
                    " (IONOS_TOKEN, or IONOS_USERNAME and IONOS_PASSWORD)",
                )
            if key not in known:
                close = close_key(str(key), known)
                hint = f"did you mean {close}? " if close else ""
                raise ConfigError(
                    _key(str(key)), f"unknown key ({hint}known: {', '.join(sorted(known))})"
                )
        price = _number(options, "on_demand_cents_per_hour", None)
        ram_mb = _integer(options, "ram_mb", cls.ram_mb, minimum=256)
        if ram_mb % 256:
            raise ConfigError(_key("ram_mb"), f"{ram_mb} is not a multiple of 256")
        lan_id = options.get("lan_id")
        return cls(
            on_demand_cents_per_hour=price,
            host=_host(options.get("host", DEFAULT_HOST)),
            cores=_integer(options, "cores", cls.cores, minimum=1),
            ram_mb=ram_mb,
            disk_gb=_integer(options, "disk_gb", cls.disk_gb, minimum=1),
            lan_id=None if lan_id is None else _integer(options, "lan_id", None, minimum=1),
            ssh_keys=_ssh_keys(options.get("ssh_keys", [])),
            wait_seconds=_number(options, "wait_seconds", cls.wait_seconds),
            launch_timeout_seconds=_number(
                options, "launch_timeout_seconds", cls.launch_timeout_seconds
            ),
        )


def server_state(metadata_state: str | None, vm_state: str | None) -> InstanceState:
    """What an IONOS server's ``metadata.state`` and ``properties.vmState`` mean here.

    Gone or going (DESTROYING, FAILED, INACTIVE, ...): terminating. RUNNING: running.
    Still being built (BUSY/DEPLOYING, or no vmState yet): pending. Anything else
    (SHUTOFF, SHUTDOWN, CRASHED, PAUSED, ...): terminating, since a worker that is not
    running does not come back by itself and the provider should replace it.
    """
    meta = (metadata_state or "").upper()
    vm = (vm_state or "").upper()
    if meta in _DEAD:
        return "terminating"
    if vm == "RUNNING":
        return "running"
    if meta in _UNFINISHED or vm in ("", "NOSTATE"):
        return "pending"
    return "terminating"


class IonosDriver:
    """Lifecycle I/O against IONOS Cloud (see the module docstring)."""

    name = "ionos"

    def __init__(self, config: IonosConfig, options: Mapping[str, Any]) -> None:
        self.options = IonosOptions.parse(options)
        self.server_type = _server_type(config.server_type)
        self.datacenter = _required(config.datacenter, "datacenter")
        self.image = _required(config.image, "image")
        credentials = _credentials()
        try:
            import ionoscloud  # type: ignore[import-untyped]  # untyped SDK
            import urllib3
        except ImportError as exc:
            raise ConfigError(
                "cloud_providers.ionos",
                "the IONOS driver needs its SDK (ionoscloud): pip install 'hypermedia[ionos]'",
            ) from exc
        configuration = ionoscloud.Configuration(host=self.options.host, **credentials)
        configuration.max_retries = SDK_TRIES
        configuration.wait_time = self.options.wait_seconds
        configuration.max_wait_time = self.options.wait_seconds
        self._sdk: Any = ionoscloud
        self._client: Any = ionoscloud.ApiClient(configuration)
        self._datacenters: Any = ionoscloud.DataCentersApi(self._client)
        self._images: Any = ionoscloud.ImagesApi(self._client)
        self._servers: Any = ionoscloud.ServersApi(self._client)
        self._labels: Any = ionoscloud.LabelsApi(self._client)
        self._requests: Any = ionoscloud.RequestsApi(self._client)
        self._api_error: type[Exception] = ionoscloud.ApiException
        self._transport_errors: tuple[type[Exception], ...] = (
            urllib3.exceptions.HTTPError,
            OSError,
        )
        self._lock = threading.Lock()
        self._place: tuple[str, str] | None = None  # (datacenter id, location), resolved once
        self._image_fields: dict[str, str] | None = None
        self._terminating: set[str] = set()
        # Servers a launch made but could neither label nor delete: listed under the
        # launch's tags (no label names their cluster) until they are gone.
        self._unlabelled: dict[str, dict[str, str]] = {}

    # -- the Driver interface --------------------------------------------------------

    def launch(self, request: LaunchRequest) -> Instance | DriverError:
        """See :meth:`_create`; an ``unavailable`` answer may have left an instance
        (:func:`~autoscaler.drivers.base.launch_outcome`)."""
        return launch_outcome(self._create(request))

    def _create(self, request: LaunchRequest) -> Instance | DriverError:
        place = self._resolve_datacenter()
        if isinstance(place, DriverError):
            return place
        dc, location = place
        name = server_name(request.cluster, request.request_id)
        servers = self._list_servers(dc)
        if isinstance(servers, DriverError):
            return servers
        # A server of this request named the way drivers before the cluster was in the
        # name did (its launch began before an upgrade) is this launch's too.
        names = {name, NAME_PREFIX + request.request_id}
        existing = self._existing(dc, names, servers)
        if existing is not None:
            if isinstance(existing, DriverError):
                return existing
            server, present = existing
            labels = self._write_labels(dc, str(server.id), request.tags(), present)
            if isinstance(labels, DriverError):
                return labels
            return self._answer(dc, server, labels)
        image = self._resolve_image(location)
        if isinstance(image, DriverError):
            return image
        body = self._server_body(name, request.user_data, image)
        created = self._call(
            f"create server {name}",
            lambda: self._servers.datacenters_servers_post_with_http_info(
                dc, body, _request_timeout=TIMEOUT
            ),
        )
        if isinstance(created, DriverError):
            return created
        server, _status, headers = created
        server_id, wanted = str(server.id), request.tags()
        # The labels go on at once, while IONOS builds the server: a crash or a timeout
        # during the minutes of provisioning leaves a server instances() can see.
        labels = self._write_labels(dc, server_id, wanted, {})
        waited = self._wait(_request_id(headers), f"create server {name}")
        if waited is not None and waited.code == "capacity":  # the create FAILED
            self._delete(dc, server_id)
            return waited
        if isinstance(labels, DriverError):  # a second chance, now that time has passed
            labels = self._write_labels(dc, server_id, wanted, None)
        if isinstance(labels, DriverError):
            # An unlabelled server would be nobody's: deleted. One the delete leaves
            # running is listed under the launch's tags (instances) and the launch may
            # have made it: the provider keeps counting it and adopts it.
            undone = self._delete(dc, server_id)
            if undone is None:
                return labels
            logger.error(
                "ionos server %s (%s) could not be labelled (%s) nor deleted (%s): listed"
                " under its launch's tags while it runs",
                name,
                server_id,
                labels,
                undone,
                extra={"action": "launch_unlabelled", "instance_id": server_id},
            )
            with self._lock:
                self._unlabelled[server_id] = dict(wanted)
            return dataclasses.replace(labels, maybe_launched=True)
        if waited is not None:
            logger.warning(
                "ionos server %s answered as pending: %s", name, waited, extra={"action": "launch"}
            )
        logger.info("ionos server %s created", name, extra={"action": "launch"})
        return self._answer(dc, server, labels)

    def instances(self, cluster: str) -> list[Instance] | DriverError:
        place = self._resolve_datacenter()
        if isinstance(place, DriverError):
            return place
        dc = place[0]
        servers = self._list_servers(dc)
        if isinstance(servers, DriverError):
            return servers
        labels = self._read_labels()
        if isinstance(labels, DriverError):
            return labels
        with self._lock:  # forget deletions that are over
            present = {str(s.id) for s in servers}
            self._terminating &= present
            self._unlabelled = {k: v for k, v in self._unlabelled.items() if k in present}
            unlabelled = dict(self._unlabelled)
        found: list[Instance] = []
        for server in servers:
            # The labels win over what this process knows of a launch it could not label,
            # which wins over what the name says (cluster, request id): a server whose
            # launcher died before labelling it is still the cluster's, and counted.
            tags = {
                **_tags_from_name(server),
                **unlabelled.get(str(server.id), {}),
                **labels.get(str(server.id), {}),
            }
            if tags.get(TAG_CLUSTER) == cluster:
                found.append(self._instance(dc, server, tags))
        return found

    def terminate(self, instance_id: str) -> DriverError | None:
        place = self._resolve_datacenter()
        if isinstance(place, DriverError):
            return place
        return self._delete(place[0], instance_id)

    def price(self, spot: bool) -> float | DriverError:
        if spot:
            return DriverError("invalid", "IONOS has no spot market: on-demand servers only")
        return float(self.options.on_demand_cents_per_hour)

    # -- steps -----------------------------------------------------------------------

    def _call(self, action: str, call: Callable[[], T]) -> T | DriverError:
        """Run one SDK call; what IONOS or the network answers comes back as a value."""
        try:
            return call()
        except self._api_error as exc:
            return api_error(action, getattr(exc, "status", None), getattr(exc, "body", None))
        except KeyError as exc:
            # ionoscloud 6.1 reads Retry-After off a 429 without checking that it is there:
            # the KeyError escapes while the 429 is handled. Anything else is a bug: raise.
            answer = exc.__context__
            if not isinstance(answer, self._api_error):
                raise
            return api_error(action, getattr(answer, "status", None), getattr(answer, "body", None))
        except self._transport_errors as exc:
            problem = f"{type(exc).__name__}: {exc}"
            return DriverError("unavailable", f"{action}: IONOS unreachable ({problem})", True)

    def _collect(self, action: str, fetch: Callable[[int], Any]) -> list[Any] | DriverError:
        """Every item of a paged collection (``offset``/``limit``)."""
        items: list[Any] = []
        while True:
            page = self._call(action, functools.partial(fetch, len(items)))
            if isinstance(page, DriverError):
                return page
            batch = list(page.items or [])
            items.extend(batch)
            if len(batch) < PAGE:
                return items

    def _existing(
        self, dc: str, names: set[str], servers: list[Any]
    ) -> tuple[Any, dict[str, str]] | DriverError | None:
        """The server an earlier launch of one of these names made (with its labels), if any.

        Leftovers of a failed create are deleted and skipped, as are servers this driver
        is deleting; of several candidates (a replacement beside a leftover still being
        deleted, seen by another process) the most completely labelled, then the newest.
        """
        candidates = []
        for server in servers:
            if server.properties is None or server.properties.name not in names:
                continue
            with self._lock:
                deleting = str(server.id) in self._terminating
            if _metadata_state(server) in _DEAD:
                self._delete(dc, str(server.id))
            elif not deleting:
                candidates.append(server)
        if not candidates:
            return None
        labels = self._read_labels()
        if isinstance(labels, DriverError):
            return labels
        best = max(
            candidates,
            key=lambda s: (len(labels.get(str(s.id), {})), str(_created(s) or "")),
        )
        return best, labels.get(str(best.id), {})

    def _resolve_datacenter(self) -> tuple[str, str] | DriverError:
        if self._place is not None:
            return self._place
        found = self._collect(
            "list datacenters",
            lambda offset: self._datacenters.datacenters_get(
                depth=1, offset=offset, limit=PAGE, _request_timeout=TIMEOUT
            ),
        )
        if isinstance(found, DriverError):
            return found
        wanted = self.datacenter
        key = "cloud_providers.ionos.datacenter"
        if _UUID.match(wanted):
            matches = [d for d in found if str(d.id).lower() == wanted.lower()]
            if not matches:
                return DriverError("not_found", f"{key}: no datacenter {wanted} in this account")
        else:
            matches = [d for d in found if d.properties and d.properties.location == wanted]
            if len(matches) != 1:
                ids = ", ".join(str(d.id) for d in matches) or "none"
                return DriverError(
                    "invalid",
                    f"{key}: {len(matches)} datacenters in location {wanted} ({ids});"
                    " name exactly one, by id if need be",
                )
        properties = matches[0].properties
        self._place = (str(matches[0].id), str(properties.location if properties else ""))
        return self._place

    def _resolve_image(self, location: str) -> dict[str, str] | DriverError:
        if self._image_fields is not None:
            return self._image_fields
        image = self.image
        if _UUID.match(image):
            self._image_fields = {"image": image}
        elif ":" in image:
            self._image_fields = {"image_alias": image}
        else:
            found = self._call(
                "list images",
                lambda: self._images.images_get(depth=1, _request_timeout=TIMEOUT),
            )
            if isinstance(found, DriverError):
                return found
            matches = [
                str(i.id)
                for i in found.items or []
                if i.properties is not None
                and i.properties.name == image
                and i.properties.location == location
                and (i.properties.image_type or "HDD") == "HDD"
            ]
            if len(matches) != 1:
                return DriverError(
                    "invalid",
                    f"cloud_providers.ionos.image: {len(matches)} HDD images named {image!r}"
                    f" in {location}; give an image id or alias instead",
                )
            self._image_fields = {"image": matches[0]}
        return self._image_fields

    def _list_servers(self, dc: str) -> list[Any] | DriverError:
        return self._collect(
            "list servers",
            lambda offset: self._servers.datacenters_servers_get(
                dc, depth=3, offset=offset, limit=PAGE, _request_timeout=TIMEOUT
            ),
        )

    def _read_labels(self) -> dict[str, dict[str, str]] | DriverError:
        """Our labels of every server: server id -> key -> value."""
        found = self._call(
            "list labels", lambda: self._labels.labels_get(depth=1, _request_timeout=TIMEOUT)
        )
        if isinstance(found, DriverError):
            return found
        labels: dict[str, dict[str, str]] = {}
        for label in found.items or []:
            p = label.properties
            if p is None or p.resource_type != "server" or not str(p.key).startswith(TAG_PREFIX):
                continue
            labels.setdefault(str(p.resource_id), {})[str(p.key)] = str(p.value)
        return labels

    def _server_body(self, name: str, user_data: str, image: Mapping[str, str]) -> Any:
        sdk = self._sdk
        volume = sdk.Volume(
            properties=sdk.VolumeProperties(
                name=f"{name}-boot",
                type=VOLUME_TYPE,
                size=self.options.disk_gb,
                user_data=base64.b64encode(user_data.encode()).decode("ascii"),
                ssh_keys=list(self.options.ssh_keys) or None,
                **image,
            )
        )
        nics = []
        if self.options.lan_id is not None:
            nic = sdk.NicProperties(name=f"{name}-nic", lan=self.options.lan_id, dhcp=True)
            nics.append(sdk.Nic(properties=nic))
        return sdk.Server(
            properties=sdk.ServerProperties(
                name=name,
                cores=self.options.cores,
                ram=self.options.ram_mb,
                type=self.server_type,
            ),
            entities=sdk.ServerEntities(
                volumes=sdk.AttachedVolumes(items=[volume]),
                nics=sdk.Nics(items=nics) if nics else None,
            ),
        )

    def _wait(self, request_id: str | None, action: str) -> DriverError | None:
        """Poll one provisioning request until DONE (None) or FAILED/too long (an error)."""
        if request_id is None:
            problem = "IONOS answered no request to follow (no Location header)"
            return DriverError("unavailable", f"{action}: {problem}", True)
        deadline = time.monotonic() + self.options.launch_timeout_seconds
        while True:
            status = self._call(
                action,
                lambda: self._requests.requests_status_get(request_id, _request_timeout=TIMEOUT),
            )
            if isinstance(status, DriverError):
                return status
            metadata = status.metadata
            state = str(metadata.status) if metadata is not None else "UNKNOWN"
            if state == "DONE":
                return None
            if state == "FAILED":
                message = metadata.message if metadata is not None else ""
                problem = f"IONOS request {request_id} FAILED: {message}"
                return DriverError("capacity", f"{action}: {problem}", True)
            left = deadline - time.monotonic()
            if left <= 0:
                timeout = self.options.launch_timeout_seconds
                problem = f"request {request_id} still {state} after {timeout:g} s"
                return DriverError("unavailable", f"{action}: {problem}", True)
            time.sleep(min(self.options.wait_seconds, left))

    def _write_labels(
        self, dc: str, server_id: str, wanted: Mapping[str, str], present: Mapping[str, str] | None
    ) -> dict[str, str] | DriverError:
        """Put the labels ``wanted`` on the server (``present``: those it has, None: read
        them); answer the labels it then carries, or why they are not all on."""
        if present is None:
            read = self._read_labels()
            if isinstance(read, DriverError):
                return read
            present = read.get(server_id, {})
        for key, value in wanted.items():
            if key in present:
                continue
            posted = self._post_label(dc, server_id, key, value)
            if isinstance(posted, DriverError):
                # Another process launching the same request may have written it first.
                read = self._read_labels()
                if isinstance(read, DriverError):
                    return posted
                present = read.get(server_id, {})
                if not wanted.keys() <= present.keys():
                    return posted
                break
        return {**wanted, **present}

    def _answer(self, dc: str, server: Any, labels: Mapping[str, str]) -> Instance:
        """The server as an instance, as IONOS reports it now (else as it was)."""
        fresh = self._call(
            f"read server {server.id}",
            lambda: self._servers.datacenters_servers_find_by_id(
                dc, server.id, depth=3, _request_timeout=TIMEOUT
            ),
        )
        return self._instance(dc, server if isinstance(fresh, DriverError) else fresh, labels)

    def _post_label(self, dc: str, server_id: str, key: str, value: str) -> Any:
        sdk = self._sdk
        label = sdk.LabelResource(properties=sdk.LabelResourceProperties(key=key, value=value))
        return self._call(
            f"label server {server_id}",
            lambda: self._labels.datacenters_servers_labels_post(
                dc, server_id, label, _request_timeout=TIMEOUT
            ),
        )

    def _delete(self, dc: str, server_id: str) -> DriverError | None:
        deleted = self._call(
            f"delete server {server_id}",
            lambda: self._servers.datacenters_servers_delete_with_http_info(
                dc, server_id, delete_volumes=True, _request_timeout=TIMEOUT
            ),
        )
        with self._lock:
            if isinstance(deleted, DriverError):
                if deleted.code != "not_found":
                    return deleted
                self._terminating.discard(server_id)
                return None
            self._terminating.add(server_id)
        logger.info("ionos server %s deleted", server_id, extra={"action": "terminate"})
        return None

    def _instance(self, dc: str, server: Any, tags: Mapping[str, str]) -> Instance:
        properties = server.properties
        vm_state = properties.vm_state if properties is not None else None
        with self._lock:
            deleting = str(server.id) in self._terminating
        state = "terminating" if deleting else server_state(_metadata_state(server), vm_state)
        instance = Instance.from_tags(
            str(server.id), self.name, tags, state, _private_ip(server), created=_epoch(server)
        )
        extra = {"datacenter": dc, "name": str(properties.name if properties else "")}
        return dataclasses.replace(instance, extra=extra)


def server_name(cluster: str, request_id: str) -> str:
    """The name of the server a launch creates: ``hm-<request id>.<cluster>``.

    IONOS has no tags at create time: the name is the only fact that is on the server
    from its first moment, so it says whose the server is until the labels are on. A
    cluster (``[a-z0-9_-]``) and a request id (``[a-z0-9-]``) hold no dot, so the name
    parses back unambiguously (:func:`_tags_from_name`); at most 107 characters."""
    return f"{NAME_PREFIX}{request_id}.{cluster}"


def _tags_from_name(server: Any) -> dict[str, str]:
    """What a server's name says of it (cluster, request id; IONOS has no spot; its
    launch time is its creation, :func:`_epoch`): {} for a name :func:`server_name` did
    not make."""
    properties = server.properties
    match = _NAME.match(str(properties.name or "")) if properties is not None else None
    if match is None:
        return {}
    return {TAG_CLUSTER: match["cluster"], TAG_REQUEST: match["request"], TAG_SPOT: "false"}


def api_error(action: str, status: int | None, body: object) -> DriverError:
    """An IONOS API answer as a :class:`DriverError` (the message from IONOS's body)."""
    status = int(status or 0)
    where = f"{action}: IONOS answered {status}" + (f" ({m})" if (m := _message(body)) else "")
    if status in (401, 403):
        return DriverError("auth", f"{where}; check IONOS_TOKEN or IONOS_USERNAME/PASSWORD")
    if status == 404:
        return DriverError("not_found", where)
    if status == 429:
        return DriverError("quota", f"{where}: rate limited", retryable=True)
    if 400 <= status < 500:
        return DriverError("invalid", where)
    return DriverError("unavailable", where, retryable=True)  # 5xx, or no answer (0)


def _message(body: object) -> str:
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        decoded = json.loads(body)
        messages = decoded.get("messages") or []
        text = "; ".join(str(m.get("message", "")) for m in messages if isinstance(m, dict))
    except (ValueError, AttributeError):
        text = body
    return text[:300]


def _request_id(headers: Any) -> str | None:
    location = headers.get("Location") if headers is not None else None
    match = _STATUS_PATH.search(str(location or ""))
    return match.group(1) if match else None


def _created(server: Any) -> object:
    return None if server.metadata is None else server.metadata.created_date


def _epoch(server: Any) -> float | None:
    """When IONOS created the server (``metadata.createdDate``), in epoch seconds."""
    created = _created(server)
    if not isinstance(created, datetime.datetime):
        return None
    if created.tzinfo is None:  # IONOS answers UTC
        created = created.replace(tzinfo=datetime.UTC)
    return created.timestamp()


def _metadata_state(server: Any) -> str | None:
    metadata = server.metadata
    return None if metadata is None else metadata.state


def _private_ip(server: Any) -> str | None:
    entities = server.entities
    nics = entities.nics if entities is not None else None
    for nic in (nics.items or []) if nics is not None else []:
        ips = nic.properties.ips if nic.properties is not None else None
        if ips:
            return str(ips[0])
    return None


def _credentials() -> dict[str, str]:
    token = os.environ.get("IONOS_TOKEN", "").strip()
    if token:
        return {"token": token}
    username = os.environ.get("IONOS_USERNAME", "").strip()
    password = os.environ.get("IONOS_PASSWORD", "")
    if username and password:
        return {"username": username, "password": password}
    missing = "IONOS_PASSWORD" if username else "IONOS_USERNAME" if password else "IONOS_TOKEN"
    raise ConfigError(
        missing,
        "not set: the IONOS driver reads its credentials from the environment only"
        " (IONOS_TOKEN, or IONOS_USERNAME and IONOS_PASSWORD)",
    )


def _server_type(value: str | None) -> str:
    server_type = _required(value, "server_type")
    problem = ionos_server_type_problem(server_type)
    if problem is not None:
        raise ConfigError("cloud_providers.ionos.server_type", problem)
    return server_type.upper()


def _required(value: str | None, name: str) -> str:
    if value is None or not value.strip():
        raise ConfigError(f"cloud_providers.ionos.{name}", "required by the IONOS driver")
    return value.strip()


def _key(name: str) -> str:
    return f"provider.drivers.ionos.{name}"


def _integer(options: Mapping[str, Any], name: str, default: int | None, *, minimum: int) -> int:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(_key(name), f"expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(_key(name), f"{value} is below {minimum}")
    return value


def _number(options: Mapping[str, Any], name: str, default: float | None) -> float:
    value = options.get(name, default)
    if value is None:
        raise ConfigError(_key(name), "required (a number above 0)")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(_key(name), f"expected a number, got {value!r}")
    if value <= 0:
        raise ConfigError(_key(name), f"{value} must be above 0")
    return float(value)


def _host(value: object) -> str:
    if not isinstance(value, str) or not re.match(r"^https?://[^/\s]+", value):
        raise ConfigError(_key("host"), f"expected an http(s) URL, got {value!r}")
    return value.rstrip("/")


def _ssh_keys(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(k, str) and k.strip() for k in value
    ):
        raise ConfigError(_key("ssh_keys"), "expected a list of public keys")
    return tuple(value)
