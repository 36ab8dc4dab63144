"""The contract every cloud driver keeps (autoscaler/drivers/base.py), as one suite.

Each driver's test module calls :func:`check_contract` with a driver pointed at its
server (moto for AWS, local REST servers for GCP and IONOS, real Ray nodes for the
local driver).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from autoscaler.drivers.base import Driver, DriverError, Instance, LaunchRequest


def request(
    request_id: str,
    *,
    cluster: str = "contract",
    queue: str = "ocr",
    spot: bool = False,
    price: float = 12.5,
    user_data: str = "#!/bin/sh\necho hello\n",
) -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        cluster=cluster,
        node_type=f"burst_{queue}",
        queue=queue,
        spot=spot,
        price_cents_per_hour=price,
        launched_at=float(int(time.time())),
        user_data=user_data,
    )


def listed(driver: Driver, cluster: str) -> list[Instance]:
    found = driver.instances(cluster)
    assert not isinstance(found, DriverError), found
    return found


def eventually(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the driver never became consistent"
        time.sleep(0.2)


def check_contract(driver: Driver, *, spot: bool = False, timeout: float = 30.0) -> Instance:
    """Launch (twice, one instance), list, terminate (twice), price. The terminated
    instance is answered for further checks of the caller's server."""
    first = request("contract-0001", spot=spot)
    launched = driver.launch(first)
    assert isinstance(launched, Instance), launched
    assert launched.provider == driver.name
    assert launched.state in ("pending", "running")
    assert (launched.cluster, launched.node_type, launched.queue) == (
        "contract",
        "burst_ocr",
        "ocr",
    )
    assert launched.request_id == "contract-0001"
    assert launched.spot is spot
    assert launched.price_cents_per_hour == 12.5
    assert launched.launched_at == first.launched_at

    again = driver.launch(first)
    assert isinstance(again, Instance), again
    assert again.instance_id == launched.instance_id, "launch is not idempotent"

    eventually(
        lambda: [i.instance_id for i in listed(driver, "contract")] == [launched.instance_id],
        timeout,
    )
    assert listed(driver, "another") == []

    assert driver.terminate(launched.instance_id) is None
    eventually(
        lambda: all(
            i.instance_id != launched.instance_id or i.state == "terminating"
            for i in listed(driver, "contract")
        ),
        timeout,
    )
    assert driver.terminate(launched.instance_id) is None, "terminating a gone instance failed"

    price = driver.price(False)
    assert isinstance(price, float) and price > 0, price
    return launched
