"""The AWS driver (:mod:`autoscaler.drivers.aws`) against moto's server over real HTTP.

boto3 talks to a ThreadedMotoServer on 127.0.0.1; nothing of boto3 or of the driver is
replaced. What the driver sends is recorded with botocore's own event hooks (the
parameters before serialization and the HTTP body on the wire), and what moto
stored is read back with a separate client, so a test sees both the request shape
and its effect. moto's state is reset before every test.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import boto3
import httpx
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from autoscaler.config import AwsConfig
from autoscaler.drivers.aws import AwsDriver, driver_error, root_volume_mapping
from autoscaler.drivers.base import (
    TAG_CLUSTER,
    TAG_KEYS,
    TAG_LAUNCHED,
    TAG_PRICE,
    TAG_REQUEST,
    BillingReader,
    Charge,
    DriverError,
    Instance,
)
from hypermedia import tls
from hypermedia.embedded import free_port
from hypermedia.errors import ConfigError
from tests import support
from tests.driver_contract import check_contract, listed, request

KEY = "provider.drivers.aws"  # where these options live in the cluster yaml

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client

REGION = "us-east-1"
INSTANCE_TYPE = "m5.large"
KEY_ID = "AKIAHYPERMEDIATEST"
SECRET_KEY = "hypermedia-test-secret-do-not-leak"
RAY_TOKEN = "ray-token-text-never-on-the-wire"
ON_DEMAND_CENTS = 9.6
MOTO_SPOT_CENTS = 0.001  # moto answers every spot price as "0.00001" dollars

# What the provider renders (autoscaler.bootstrap): where the token is, never the token.
USER_DATA = (
    "#!/bin/bash\n"
    "set -euo pipefail\n"
    "export RAY_AUTH_TOKEN_PATH=/etc/hypermedia/ray_auth_token\n"
    "aws ssm get-parameter --name /hypermedia/ray-token --with-decryption \\\n"
    '  --query Parameter.Value --output text > "$RAY_AUTH_TOKEN_PATH"\n'
    "exec hypermedia node join --head 10.0.0.1:6379\n"
)


# -- moto and the driver ------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    with support.moto_server() as url:
        yield url


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials from the environment (boto3's default chain), as on a head node;
    no profile files and no instance metadata to fall back on."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def endpoint(moto_server: str) -> str:
    """moto, emptied."""
    httpx.post(
        f"{moto_server}/moto-api/reset", timeout=10, verify=tls.client_context()
    ).raise_for_status()
    return moto_server


@pytest.fixture
def ec2(endpoint: str) -> EC2Client:
    """A client of the test's own, to set moto up and read what it stored."""
    client: EC2Client = boto3.client(
        "ec2",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET_KEY,
    )
    return client


@pytest.fixture
def ami(ec2: EC2Client) -> str:
    return ec2.register_image(Name="hm-burst-test")["ImageId"]


def aws_config(ami_id: str, **overrides: Any) -> AwsConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "max_instances": 5,
        "region": REGION,
        "instance_type": INSTANCE_TYPE,
        "ami_id": ami_id,
        "spot_enabled": True,
        "spot_max_price": "0.05",
    }
    values.update(overrides)
    return AwsConfig(**values)


MakeDriver = Callable[..., AwsDriver]


@pytest.fixture
def make_driver(endpoint: str, ami: str) -> MakeDriver:
    """``make_driver(config_overrides..., options=...)``: a driver on moto."""

    def make(options: dict[str, Any] | None = None, **config: Any) -> AwsDriver:
        chosen: dict[str, Any] = {
            "endpoint_url": endpoint,
            "on_demand_cents_per_hour": ON_DEMAND_CENTS,
        }
        chosen.update(options or {})
        return AwsDriver(aws_config(ami, **config), chosen)

    return make


@dataclass
class Sent:
    """What a client sent for RunInstances: its parameters and its HTTP bodies."""

    params: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, list[str]]] = field(default_factory=list)


def record_run_instances(client: EC2Client) -> Sent:
    sent = Sent()

    def on_params(params: dict[str, Any], **_: Any) -> None:
        sent.params.append(copy.deepcopy(params))

    def on_send(request: Any, **_: Any) -> None:
        body = request.body
        text = body.decode() if isinstance(body, bytes) else str(body)
        sent.bodies.append(parse_qs(text))

    client.meta.events.register("provide-client-params.ec2.RunInstances", on_params)
    client.meta.events.register("before-send.ec2.RunInstances", on_send)
    return sent


def stored(ec2: EC2Client, instance_id: str) -> Any:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservations[0]["Instances"][0]


def stored_user_data(ec2: EC2Client, instance_id: str) -> str:
    attribute = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attribute["UserData"]["Value"]).decode()


def launched(driver: AwsDriver, *args: Any, **kwargs: Any) -> Instance:
    instance = driver.launch(request(*args, **kwargs))
    assert isinstance(instance, Instance), instance
    return instance


# -- the contract -------------------------------------------------------------------------


def test_contract_on_demand(make_driver: MakeDriver, ec2: EC2Client) -> None:
    instance = check_contract(make_driver(), spot=False)
    assert "InstanceLifecycle" not in stored(ec2, instance.instance_id)


def test_contract_spot(make_driver: MakeDriver, ec2: EC2Client) -> None:
    instance = check_contract(make_driver(), spot=True)
    assert stored(ec2, instance.instance_id)["InstanceLifecycle"] == "spot"


# -- what a launch sends and what EC2 keeps ------------------------------------------------


def expected_tags(instance: Instance, spot: bool) -> dict[str, str]:
    return {
        "hypermedia-cluster": "contract",
        "hypermedia-node-type": "burst_ocr",
        "hypermedia-queue": "ocr",
        "hypermedia-request": instance.request_id,
        "hypermedia-spot": "true" if spot else "false",
        "hypermedia-launched-at": str(int(instance.launched_at)),
        "hypermedia-price-microusd": "125000",
        "Name": f"hm-{instance.request_id}",
    }


def tag_dict(tags: Any) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in tags}


def check_user_data(sent: Sent, ec2: EC2Client, instance_id: str) -> None:
    """The boot script arrives unchanged, base64 on the wire, and carries no secret."""
    assert sent.params[0]["UserData"] == USER_DATA
    assert base64.b64decode(sent.bodies[0]["UserData"][0]).decode() == USER_DATA
    assert stored_user_data(ec2, instance_id) == USER_DATA
    wire = repr(sent.bodies[0]) + repr(sent.params[0])
    for secret in (SECRET_KEY, "AWS_SECRET", RAY_TOKEN):
        assert secret not in wire
        assert secret not in stored_user_data(ec2, instance_id)


def test_a_spot_launch_sends_and_stores_what_it_should(
    make_driver: MakeDriver, ec2: EC2Client, ami: str
) -> None:
    driver = make_driver()
    sent = record_run_instances(driver.client)
    instance = launched(driver, "spot-0001", spot=True, user_data=USER_DATA)

    assert len(sent.params) == 1
    params = sent.params[0]
    tags = [{"Key": k, "Value": v} for k, v in expected_tags(instance, spot=True).items()]
    assert params == {
        "ImageId": ami,
        "InstanceType": INSTANCE_TYPE,
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": USER_DATA,
        "ClientToken": "spot-0001",
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [
            {"DeviceName": "/dev/sda1", "Ebs": {"DeleteOnTermination": True, "VolumeSize": 15}}
        ],
        "InstanceMarketOptions": {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
                "MaxPrice": "0.05",
            },
        },
    }
    assert sent.bodies[0]["ClientToken"] == ["spot-0001"]
    assert sent.bodies[0]["InstanceMarketOptions.SpotOptions.MaxPrice"] == ["0.05"]

    kept = stored(ec2, instance.instance_id)
    assert kept["InstanceLifecycle"] == "spot"
    assert kept["MetadataOptions"]["HttpTokens"] == "required"
    assert kept["MetadataOptions"]["HttpEndpoint"] == "enabled"
    assert kept["ImageId"] == ami
    assert kept["InstanceType"] == INSTANCE_TYPE
    assert tag_dict(kept["Tags"]) == expected_tags(instance, spot=True)
    assert set(TAG_KEYS) <= set(tag_dict(kept["Tags"]))
    volumes = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [instance.instance_id]}]
    )["Volumes"]
    assert volumes
    for volume in volumes:
        assert tag_dict(volume["Tags"]) == expected_tags(instance, spot=True)
    check_user_data(sent, ec2, instance.instance_id)

    assert instance.spot is True
    assert instance.private_ip == kept["PrivateIpAddress"]
    assert instance.extra["instance_type"] == INSTANCE_TYPE


def test_the_root_volume_is_deleted_with_the_instance_whatever_the_ami_says(
    make_driver: MakeDriver, ec2: EC2Client, ami: str
) -> None:
    """An AMI whose root mapping says DeleteOnTermination false (moto registers every
    image so) left an EBS volume billing after each terminated instance: the launch
    sent no mapping and took the AMI's. The launch maps the AMI's root device
    (described once per driver) to be deleted, at the AMI's size, and the volume
    carries the launch's tags. moto ignores an AMI's mapping at launch (it deletes a
    default root volume anyway), so the request is what proves it; what moto stores
    and deletes shows EC2 takes it."""
    image = ec2.describe_images(ImageIds=[ami])["Images"][0]
    root = image["RootDeviceName"]
    (ami_root,) = [m for m in image["BlockDeviceMappings"] if m["DeviceName"] == root]
    assert ami_root["Ebs"]["DeleteOnTermination"] is False
    driver = make_driver()
    sent = record_run_instances(driver.client)
    described: list[Any] = []
    driver.client.meta.events.register(
        "provide-client-params.ec2.DescribeImages", lambda params, **_: described.append(params)
    )
    first = launched(driver, "root-0001")
    launched(driver, "root-0002")
    mapping = {"DeviceName": root, "Ebs": {"DeleteOnTermination": True, "VolumeSize": 15}}
    assert [p["BlockDeviceMappings"] for p in sent.params] == [[mapping], [mapping]]
    assert sent.bodies[0]["BlockDeviceMapping.1.Ebs.DeleteOnTermination"] == ["true"]
    assert described == [{"ImageIds": [ami]}]  # once: an AMI id names one image

    (kept,) = stored(ec2, first.instance_id)["BlockDeviceMappings"]
    assert (kept["DeviceName"], kept["Ebs"]["DeleteOnTermination"]) == (root, True)
    volume_id = kept["Ebs"]["VolumeId"]
    (volume,) = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"]
    assert tag_dict(volume["Tags"])["hypermedia-request"] == "root-0001"
    assert driver.terminate(first.instance_id) is None
    assert volume_id not in [v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]]


@pytest.mark.parametrize(
    ("image", "mapping"),
    [
        ({}, None),  # nothing described
        ({"RootDeviceName": "/dev/xvda"}, None),  # no mapping: the AMI's own
        (
            {
                "RootDeviceName": "/dev/sda1",
                "RootDeviceType": "instance-store",
                "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "VirtualName": "ephemeral0"}],
            },
            None,
        ),
        (
            {
                "RootDeviceName": "/dev/xvda",
                "BlockDeviceMappings": [
                    {"DeviceName": "/dev/sdb", "Ebs": {"VolumeSize": 100}},
                    {"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": False}},
                ],
            },
            {"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": True}},
        ),
        (
            {
                "RootDeviceName": "/dev/xvda",
                "RootDeviceType": "ebs",
                "BlockDeviceMappings": [
                    {
                        "DeviceName": "/dev/xvda",
                        "Ebs": {"VolumeSize": 30, "VolumeType": "gp3", "Encrypted": True},
                    }
                ],
            },
            {"DeviceName": "/dev/xvda", "Ebs": {"DeleteOnTermination": True, "VolumeSize": 30}},
        ),
    ],
)
def test_the_root_override_maps_only_an_ebs_root(image: Any, mapping: Any) -> None:
    """Only the AMI's EBS root device is mapped, with nothing of it but its size: the
    rest (snapshot, type, encryption) EC2 takes from the AMI, and an encryption flag
    sent back could be refused."""
    assert root_volume_mapping(image) == mapping


def test_an_on_demand_launch_has_no_market_options_and_no_max_price(
    make_driver: MakeDriver, ec2: EC2Client
) -> None:
    driver = make_driver(spot_max_price=None)
    sent = record_run_instances(driver.client)
    instance = launched(driver, "demand-0001", user_data=USER_DATA)
    assert "InstanceMarketOptions" not in sent.params[0]
    assert not any(key.startswith("InstanceMarketOptions") for key in sent.bodies[0])
    kept = stored(ec2, instance.instance_id)
    assert "InstanceLifecycle" not in kept
    assert kept["MetadataOptions"]["HttpTokens"] == "required"
    assert tag_dict(kept["Tags"]) == expected_tags(instance, spot=False)
    check_user_data(sent, ec2, instance.instance_id)


def test_a_spot_launch_without_a_max_price_leaves_ec2_s_default(make_driver: MakeDriver) -> None:
    driver = make_driver(spot_max_price=None)
    sent = record_run_instances(driver.client)
    launched(driver, "spot-0002", spot=True)
    assert "MaxPrice" not in sent.params[0]["InstanceMarketOptions"]["SpotOptions"]


def test_network_and_profile_options_reach_the_instance(
    make_driver: MakeDriver, ec2: EC2Client, endpoint: str
) -> None:
    vpc = ec2.create_vpc(CidrBlock="10.40.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.40.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="hm-burst", Description="burst", VpcId=vpc)
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET_KEY,
    )
    profile = iam.create_instance_profile(InstanceProfileName="hm-burst-node")
    driver = make_driver(
        options={
            "subnet_id": subnet,
            "security_group_ids": [group["GroupId"]],
            "iam_instance_profile": "hm-burst-node",
        }
    )
    sent = record_run_instances(driver.client)
    instance = launched(driver, "network-0001")

    assert sent.params[0]["SubnetId"] == subnet
    assert sent.params[0]["SecurityGroupIds"] == [group["GroupId"]]
    assert sent.params[0]["IamInstanceProfile"] == {"Name": "hm-burst-node"}
    kept = stored(ec2, instance.instance_id)
    assert kept["SubnetId"] == subnet
    assert [g["GroupId"] for g in kept["SecurityGroups"]] == [group["GroupId"]]
    assert kept["IamInstanceProfile"]["Arn"] == profile["InstanceProfile"]["Arn"]
    assert instance.private_ip is not None and instance.private_ip.startswith("10.40.1.")


def test_launch_is_idempotent_across_processes(make_driver: MakeDriver, ec2: EC2Client) -> None:
    """``ray up`` and the head's monitor each build a driver: the second one to see a
    request finds its instance instead of starting another."""
    first = launched(make_driver(), "shared-0001", spot=True)
    other = make_driver()
    sent = record_run_instances(other.client)
    again = launched(other, "shared-0001", spot=True)
    assert again.instance_id == first.instance_id
    assert again.request_id == "shared-0001" and again.spot is True
    assert sent.params == []  # found by its tag: no second RunInstances at all
    tagged = ec2.describe_instances(
        Filters=[{"Name": "tag:hypermedia-request", "Values": ["shared-0001"]}]
    )["Reservations"]
    assert sum(len(r["Instances"]) for r in tagged) == 1


# -- listing and terminating ---------------------------------------------------------------


def test_instances_are_listed_by_cluster(make_driver: MakeDriver, ec2: EC2Client, ami: str) -> None:
    driver = make_driver()
    alpha_1 = launched(driver, "alpha-0001", cluster="alpha", queue="ocr")
    alpha_2 = launched(driver, "alpha-0002", cluster="alpha", queue="video", spot=True)
    beta = launched(driver, "beta-00001", cluster="beta")
    ec2.run_instances(ImageId=ami, InstanceType="t3.micro", MinCount=1, MaxCount=1)  # not ours

    alpha = listed(driver, "alpha")
    assert {i.instance_id for i in alpha} == {alpha_1.instance_id, alpha_2.instance_id}
    assert alpha == sorted(alpha, key=lambda i: (i.launched_at, i.instance_id))
    by_id = {i.instance_id: i for i in alpha}
    assert by_id[alpha_2.instance_id].queue == "video"
    assert by_id[alpha_2.instance_id].node_type == "burst_video"
    assert by_id[alpha_2.instance_id].spot is True
    assert by_id[alpha_1.instance_id].spot is False
    for instance in alpha:
        assert instance.provider == "aws"
        assert instance.cluster == "alpha"
        assert instance.state in ("pending", "running")
        assert instance.private_ip == stored(ec2, instance.instance_id)["PrivateIpAddress"]
        assert instance.price_cents_per_hour == 12.5
    assert [i.instance_id for i in listed(driver, "beta")] == [beta.instance_id]
    assert listed(driver, "gamma") == []

    # A stopped node is on its way out; a terminated one is gone from the list.
    ec2.stop_instances(InstanceIds=[alpha_1.instance_id])
    states = {i.instance_id: i.state for i in listed(driver, "alpha")}
    assert states[alpha_1.instance_id] == "terminating"
    assert driver.terminate(alpha_2.instance_id) is None
    assert [i.instance_id for i in listed(driver, "alpha")] == [alpha_1.instance_id]


def run_by_hand(ec2: EC2Client, ami: str, tags: dict[str, str]) -> str:
    """An instance started outside the driver (the console, a script) with ``tags``."""
    reply = ec2.run_instances(
        ImageId=ami,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )
    return reply["Instances"][0]["InstanceId"]


def test_an_instance_without_a_launch_time_tag_is_launched_at_its_launch_time(
    make_driver: MakeDriver, ec2: EC2Client, ami: str
) -> None:
    """Started by hand with the cluster's tag, or its launch time tag removed: it was
    listed as launched at 0, so the provider counted its spend from when it first saw it
    and the hours it had billed before were missing from the daily cap. It is listed as
    launched at EC2's LaunchTime now; a launch time tag stays what counts."""
    driver = make_driver()
    by_hand = run_by_hand(ec2, ami, {TAG_CLUSTER: "contract", TAG_REQUEST: "byhand-0001"})
    three_hours_ago = float(int(time.time()) - 3 * 3600)
    support.set_moto_launch_time(by_hand, three_hours_ago)
    tagged = launched(driver, "tagged-0001")
    support.set_moto_launch_time(tagged.instance_id, three_hours_ago)  # the tag says otherwise

    found = {i.instance_id: i for i in listed(driver, "contract")}
    assert found[by_hand].launched_at == three_hours_ago
    assert stored(ec2, by_hand)["LaunchTime"].timestamp() == three_hours_ago
    assert found[tagged.instance_id].launched_at == tagged.launched_at > three_hours_ago

    # As moto starts it: its LaunchTime, strictly before the listing.
    fresh = run_by_hand(ec2, ami, {TAG_CLUSTER: "contract"})
    (listing,) = [i for i in listed(driver, "contract") if i.instance_id == fresh]
    assert listing.launched_at == stored(ec2, fresh)["LaunchTime"].timestamp() > 0
    assert listing.launched_at <= time.time()


def test_a_launch_time_ahead_of_our_clock_counts_from_now(
    make_driver: MakeDriver, ec2: EC2Client, ami: str
) -> None:
    """EC2's clock ahead of ours: no instance is launched later than it is listed."""
    driver = make_driver()
    by_hand = run_by_hand(ec2, ami, {TAG_CLUSTER: "contract"})
    support.set_moto_launch_time(by_hand, time.time() + 3600)
    before = time.time()
    (found,) = listed(driver, "contract")
    assert before <= found.launched_at <= time.time()


@pytest.mark.parametrize("value", ["soon", "1e400", "nan", "-inf", "12 cents"])
def test_a_tag_edited_by_hand_to_no_number_leaves_the_listing_whole(
    make_driver: MakeDriver, ec2: EC2Client, ami: str, value: str
) -> None:
    """A launch time or price tag edited in the console to something that is no number
    made the whole listing raise ValueError (every cycle: no instance counted, none
    terminated). The instance is listed as one without the tag: launched at its
    LaunchTime, priced 0 (the provider then counts it at the on-demand list price)."""
    driver = make_driver()
    edited = launched(driver, "edited-0001")
    other = launched(driver, "other-0001")
    ec2.create_tags(
        Resources=[edited.instance_id],
        Tags=[{"Key": TAG_LAUNCHED, "Value": value}, {"Key": TAG_PRICE, "Value": value}],
    )
    found = {i.instance_id: i for i in listed(driver, "contract")}
    assert set(found) == {edited.instance_id, other.instance_id}
    assert (
        found[edited.instance_id].launched_at
        == stored(ec2, edited.instance_id)["LaunchTime"].timestamp()
    )
    assert found[edited.instance_id].price_cents_per_hour == 0
    untouched = found[other.instance_id]
    assert (untouched.launched_at, untouched.price_cents_per_hour) == (
        other.launched_at,
        other.price_cents_per_hour,
    )
    assert other.price_cents_per_hour > 0


def test_terminate(make_driver: MakeDriver, ec2: EC2Client) -> None:
    driver = make_driver()
    instance = launched(driver, "doomed-0001")
    assert driver.terminate(instance.instance_id) is None
    assert stored(ec2, instance.instance_id)["State"]["Name"] in ("shutting-down", "terminated")
    assert listed(driver, "contract") == []
    assert driver.terminate(instance.instance_id) is None  # already gone: a success
    assert driver.terminate("i-0123456789abcdef0") is None  # never existed: a success


# -- prices -------------------------------------------------------------------------------


def test_on_demand_price_is_the_operator_s_list_price(make_driver: MakeDriver) -> None:
    price = make_driver().price(False)
    assert isinstance(price, float)
    assert price == ON_DEMAND_CENTS
    assert make_driver(options={"on_demand_cents_per_hour": 20}).price(False) == 20.0


def test_spot_price_is_ec2_s_in_cents(make_driver: MakeDriver) -> None:
    price = make_driver().price(True)  # cap 0.05 dollars = 5 cents
    assert isinstance(price, float)
    assert price == pytest.approx(MOTO_SPOT_CENTS)


def test_a_spot_price_at_the_cap_is_accepted(make_driver: MakeDriver) -> None:
    assert make_driver(spot_max_price="0.00001").price(True) == pytest.approx(MOTO_SPOT_CENTS)


def test_a_spot_price_above_the_cap_is_a_capacity_error(make_driver: MakeDriver) -> None:
    error = make_driver(spot_max_price="0.000009").price(True)
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == ("capacity", True)
    assert "0.001" in error.message and "0.0009" in error.message


def test_without_a_max_price_spot_is_capped_at_on_demand(make_driver: MakeDriver) -> None:
    cheap = make_driver(spot_max_price=None, options={"on_demand_cents_per_hour": 0.0009})
    error = cheap.price(True)
    assert isinstance(error, DriverError) and error.code == "capacity", error
    dear = make_driver(spot_max_price=None, options={"on_demand_cents_per_hour": 0.001})
    assert dear.price(True) == pytest.approx(MOTO_SPOT_CENTS)


def test_spot_when_spot_is_not_enabled_is_invalid(make_driver: MakeDriver, ec2: EC2Client) -> None:
    driver = make_driver(spot_enabled=False, spot_max_price=None)
    price = driver.price(True)
    assert isinstance(price, DriverError) and price.code == "invalid", price
    sent = record_run_instances(driver.client)
    error = driver.launch(request("nospot-0001", spot=True))
    assert isinstance(error, DriverError) and error.code == "invalid", error
    assert not error.retryable
    assert sent.params == []
    assert ec2.describe_instances()["Reservations"] == []
    assert driver.price(False) == ON_DEMAND_CENTS  # on demand is still fine


# -- errors as values ----------------------------------------------------------------------


def test_an_unreachable_endpoint_is_unavailable(ami: str) -> None:
    driver = AwsDriver(
        aws_config(ami),
        {
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "on_demand_cents_per_hour": ON_DEMAND_CENTS,
        },
    )
    started = time.monotonic()
    answers = [
        driver.launch(request("nowhere-0001")),
        driver.instances("contract"),
        driver.terminate("i-0123456789abcdef0"),
        driver.price(True),
    ]
    for answer in answers:
        assert isinstance(answer, DriverError), answer
        assert (answer.code, answer.retryable) == ("unavailable", True)
    assert time.monotonic() - started < 60  # retried, but not forever
    # A launch that failed so may have reached EC2: the provider keeps its spend counted.
    assert [a.maybe_launched for a in answers if isinstance(a, DriverError)] == [
        True,
        False,
        False,
        False,
    ]


def test_a_refused_request_is_invalid(make_driver: MakeDriver) -> None:
    driver = make_driver(options={"subnet_id": "subnet-0000000000000dead"})
    error = driver.launch(request("subnet-0001"))
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable, error.maybe_launched) == ("invalid", False, False)
    assert "InvalidSubnetID.NotFound" in error.message


def test_missing_credentials_are_auth(
    make_driver: MakeDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing in boto3's chain (the environment is emptied before the driver is built:
    the chain is read when the client is)."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    for name in (
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    driver = make_driver()
    for answer in (driver.launch(request("nocreds-0001")), driver.instances("contract")):
        assert isinstance(answer, DriverError), answer
        assert (answer.code, answer.retryable) == ("auth", False)


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {
                "RequestId": "req-1",
                "HostId": "",
                "HTTPStatusCode": status,
                "HTTPHeaders": {},
                "RetryAttempts": 0,
            },
        },
        "RunInstances",
    )


@pytest.mark.parametrize(
    ("error", "code", "retryable"),
    [
        (client_error("InsufficientInstanceCapacity", 500), "capacity", True),
        (client_error("SpotMaxPriceTooLow"), "capacity", True),
        (client_error("MaxSpotInstanceCountExceeded"), "capacity", True),
        (client_error("InstanceLimitExceeded"), "quota", False),
        (client_error("VcpuLimitExceeded"), "quota", False),
        (client_error("AuthFailure", 401), "auth", False),
        (client_error("UnauthorizedOperation", 403), "auth", False),
        (client_error("AuthFailure.ServiceLinkedRoleCreationNotPermitted", 403), "auth", False),
        (client_error("InvalidClientTokenId", 401), "auth", False),
        (client_error("AccessDeniedException"), "auth", False),  # JSON protocol (ce)
        (client_error("UnrecognizedClientException"), "auth", False),
        (client_error("InvalidParameterValue"), "invalid", False),
        (client_error("InvalidParameterCombination"), "invalid", False),
        (client_error("InvalidAMIID.NotFound"), "invalid", False),
        (client_error("InvalidAMIID.Malformed"), "invalid", False),
        (client_error("IdempotentParameterMismatch"), "invalid", False),
        (client_error("RequestLimitExceeded", 503), "unavailable", True),
        (client_error("Throttling"), "unavailable", True),
        (client_error("InternalError", 500), "unavailable", True),
        (client_error("SomethingNew", 502), "unavailable", True),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "unavailable", True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), "unavailable", True),
        (NoCredentialsError(), "auth", False),
    ],
    ids=lambda value: getattr(value, "__name__", None) or str(value)[:40],
)
def test_botocore_errors_become_driver_errors(error: Exception, code: str, retryable: bool) -> None:
    """The translation table for answers moto cannot be made to give."""
    translated = driver_error(error)
    assert (translated.code, translated.retryable) == (code, retryable)


def test_our_own_bugs_still_raise() -> None:
    with pytest.raises(ParamValidationError):
        driver_error(ParamValidationError(report="MinCount is missing"))
    with pytest.raises(KeyError):
        driver_error(KeyError("not botocore's"))


# -- billing (Cost Explorer) ----------------------------------------------------------------
#
# moto's GetCostAndUsage answers canned results, queued with an HTTP POST: a request
# takes the next one from the queue and keeps it for its exact body (so a page asked
# again with the same NextPageToken gets the same page), or answers nothing when the
# queue is empty. moto checks nothing of the request: what is sent is checked here.

COST_RESULTS = "/moto-api/static/ce/cost-and-usage-results"


def queue_cost_results(endpoint: str, *results: dict[str, Any]) -> None:
    reply = httpx.post(
        f"{endpoint}{COST_RESULTS}",
        json={"results": list(results)},
        timeout=10,
        verify=tls.client_context(),
    )
    assert reply.status_code == 201, reply.text


def cost_day(day: str, end: str, groups: dict[str, str], unit: str = "USD") -> dict[str, Any]:
    """One day of a GetCostAndUsage answer: ``groups`` maps a request id ("" for the
    cluster's cost without one) to its UnblendedCost in dollars."""
    return {
        "TimePeriod": {"Start": day, "End": end},
        "Total": {},
        "Groups": [
            {
                "Keys": [f"hypermedia-request${request_id}"],
                "Metrics": {"UnblendedCost": {"Amount": amount, "Unit": unit}},
            }
            for request_id, amount in groups.items()
        ],
        "Estimated": True,
    }


def record_cost_requests(driver: AwsDriver) -> list[dict[str, Any]]:
    """The parameters of each GetCostAndUsage the driver's Cost Explorer client sends."""
    sent: list[dict[str, Any]] = []

    def on_params(params: dict[str, Any], **_: Any) -> None:
        sent.append(copy.deepcopy(params))

    driver.cost_explorer.meta.events.register("provide-client-params.ce.GetCostAndUsage", on_params)
    return sent


def charges_of(driver: AwsDriver, first_day: str, last_day: str) -> list[Charge]:
    charges = driver.charges("alpha", first_day, last_day)
    assert isinstance(charges, list), charges
    return charges


def test_the_driver_is_a_billing_reader_that_reads_rarely(make_driver: MakeDriver) -> None:
    reader: BillingReader = make_driver()  # mypy checks the protocol
    assert reader.billing_settle_seconds == 48 * 3600  # Cost Explorer lags up to ~24 h
    assert reader.billing_interval_seconds == 6 * 3600  # $0.01 a request


def test_charges_are_cost_explorer_s_groups_in_cents(
    make_driver: MakeDriver, endpoint: str
) -> None:
    queue_cost_results(
        endpoint,
        {
            "ResultsByTime": [
                cost_day(
                    "2026-03-01",
                    "2026-03-02",
                    {"spot-0001": "0.5", "": "0.0101516483", "demand-0002": "0"},
                ),
                cost_day(
                    "2026-03-02",
                    "2026-03-03",
                    {"spot-0001": "1.25", "": "0.0000000000", "demand-0002": "0.04"},
                ),
            ],
            "DimensionValueAttributes": [],
        },
    )
    charges = charges_of(make_driver(), "2026-03-01", "2026-03-02")
    assert [(c.day, c.request_id, c.instance_id) for c in charges] == [
        ("2026-03-01", "", ""),  # the cluster's, tagged with no request
        ("2026-03-01", "spot-0001", ""),
        ("2026-03-02", "demand-0002", ""),
        ("2026-03-02", "spot-0001", ""),
    ]  # zero amounts left out
    assert [c.cents for c in charges] == pytest.approx([1.01516483, 50.0, 4.0, 125.0])


def test_nothing_billed_is_no_charges(make_driver: MakeDriver) -> None:
    """moto's empty answer, as Cost Explorer's for days not processed yet or for cost
    allocation tags not activated: no charges, not an error."""
    assert charges_of(make_driver(), "2026-03-01", "2026-03-02") == []


def test_charges_follow_the_pages(make_driver: MakeDriver, endpoint: str) -> None:
    """Two pages: the first request takes the first canned answer, the second (the same
    body plus NextPageToken) the next one."""
    queue_cost_results(
        endpoint,
        {
            "ResultsByTime": [cost_day("2026-03-01", "2026-03-02", {"spot-0001": "0.5"})],
            "DimensionValueAttributes": [],
            "NextPageToken": "page-2-token",
        },
        {
            "ResultsByTime": [
                # Cost Explorer may split a day across pages; should it split a group
                # too, it is still one charge per day and request.
                cost_day("2026-03-01", "2026-03-02", {"demand-0002": "0.2", "spot-0001": "0.25"}),
                cost_day("2026-03-02", "2026-03-03", {"spot-0001": "0.1"}),
            ],
            "DimensionValueAttributes": [],
        },
    )
    driver = make_driver()
    sent = record_cost_requests(driver)
    charges = charges_of(driver, "2026-03-01", "2026-03-02")
    assert [(c.day, c.request_id) for c in charges] == [
        ("2026-03-01", "demand-0002"),
        ("2026-03-01", "spot-0001"),
        ("2026-03-02", "spot-0001"),
    ]
    assert [c.cents for c in charges] == pytest.approx([20.0, 75.0, 10.0])
    assert len(sent) == 2
    assert "NextPageToken" not in sent[0]
    assert sent[1] == {**sent[0], "NextPageToken": "page-2-token"}


def test_a_page_token_answered_twice_stops_the_read(make_driver: MakeDriver, endpoint: str) -> None:
    """Each page costs $0.01: a token that comes back again would page forever (moto
    answers the same body the same page, so without the stop this would not end)."""
    page = {
        "ResultsByTime": [cost_day("2026-03-01", "2026-03-02", {"spot-0001": "0.5"})],
        "DimensionValueAttributes": [],
        "NextPageToken": "same-token",
    }
    queue_cost_results(endpoint, page, page)
    driver = make_driver()
    sent = record_cost_requests(driver)
    error = driver.charges("alpha", "2026-03-01", "2026-03-01")
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == ("invalid", False)
    assert "same-token" in error.message
    assert [params.get("NextPageToken") for params in sent] == [None, "same-token"]


def test_what_a_billing_read_sends(make_driver: MakeDriver, endpoint: str) -> None:
    """Daily unblended cost of what carries the cluster's tag, grouped by request id,
    End the day after last_day (exclusive), from us-east-1 whatever the EC2 region,
    at the driver's endpoint_url."""
    driver = make_driver(region="eu-west-1")
    sent = record_cost_requests(driver)
    wire: list[Any] = []
    driver.cost_explorer.meta.events.register(
        "before-send.ce.GetCostAndUsage", lambda request, **_: wire.append(request)
    )
    assert driver.charges("alpha", "2026-02-27", "2026-02-28") == []
    assert sent == [
        {
            "TimePeriod": {"Start": "2026-02-27", "End": "2026-03-01"},
            "Granularity": "DAILY",
            "Metrics": ["UnblendedCost"],
            "Filter": {"Tags": {"Key": "hypermedia-cluster", "Values": ["alpha"]}},
            "GroupBy": [{"Type": "TAG", "Key": "hypermedia-request"}],
        }
    ]
    assert len(wire) == 1
    assert wire[0].url.startswith(endpoint)
    assert wire[0].headers["X-Amz-Target"] == b"AWSInsightsIndexService.GetCostAndUsage"
    assert b"/us-east-1/ce/aws4_request" in wire[0].headers["Authorization"]
    assert json.loads(wire[0].body)["TimePeriod"] == {"Start": "2026-02-27", "End": "2026-03-01"}
    assert driver.client.meta.region_name == "eu-west-1"  # EC2 stays where it was


def test_one_day_is_start_to_the_next_day(make_driver: MakeDriver) -> None:
    driver = make_driver()
    sent = record_cost_requests(driver)
    assert driver.charges("alpha", "2024-12-31", "2024-12-31") == []
    assert sent[0]["TimePeriod"] == {"Start": "2024-12-31", "End": "2025-01-01"}


@pytest.mark.parametrize(
    ("first_day", "last_day", "says"),
    [
        ("2026-03-02", "2026-03-01", "is before"),
        ("2026-3-1", "2026-03-02", "not a YYYY-MM-DD day"),
        ("2026-03-01", "20260302", "not a YYYY-MM-DD day"),
        ("2026-02-30", "2026-03-02", "day is out of range"),
    ],
)
def test_bad_days_are_the_caller_s_bug(
    make_driver: MakeDriver, first_day: str, last_day: str, says: str
) -> None:
    driver = make_driver()
    sent = record_cost_requests(driver)
    with pytest.raises(ValueError, match=says):
        driver.charges("alpha", first_day, last_day)
    assert sent == []


def test_an_amount_in_another_currency_is_invalid(make_driver: MakeDriver, endpoint: str) -> None:
    queue_cost_results(
        endpoint,
        {
            "ResultsByTime": [
                cost_day("2026-03-01", "2026-03-02", {"spot-0001": "0.5"}, unit="EUR")
            ],
            "DimensionValueAttributes": [],
        },
    )
    error = make_driver().charges("alpha", "2026-03-01", "2026-03-01")
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == ("invalid", False)
    assert "'EUR', not USD" in error.message


@pytest.mark.parametrize(
    "group",
    [
        {"Keys": ["hypermedia-cluster$alpha"], "Metrics": {"UnblendedCost": {"Amount": "1"}}},
        {"Keys": ["hypermedia-request$x"], "Metrics": {"BlendedCost": {"Amount": "1"}}},
        {
            "Keys": ["hypermedia-request$x"],
            "Metrics": {"UnblendedCost": {"Amount": "lots", "Unit": "USD"}},
        },
    ],
    ids=["another-group-key", "no-unblended-cost", "not-a-number"],
)
def test_an_answer_that_is_not_dollars_by_request_is_invalid(
    make_driver: MakeDriver, endpoint: str, group: dict[str, Any]
) -> None:
    day = {"TimePeriod": {"Start": "2026-03-01", "End": "2026-03-02"}, "Groups": [group]}
    queue_cost_results(endpoint, {"ResultsByTime": [day], "DimensionValueAttributes": []})
    error = make_driver().charges("alpha", "2026-03-01", "2026-03-01")
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == ("invalid", False)


def test_an_unreachable_cost_explorer_is_unavailable(ami: str) -> None:
    driver = AwsDriver(
        aws_config(ami),
        {
            "endpoint_url": f"http://127.0.0.1:{free_port()}",
            "on_demand_cents_per_hour": ON_DEMAND_CENTS,
        },
    )
    started = time.monotonic()
    error = driver.charges("alpha", "2026-03-01", "2026-03-02")
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == ("unavailable", True)
    assert error.message.startswith("Cost Explorer endpoint: ")
    assert time.monotonic() - started < 60  # retried, but not forever


class CostExplorerRefusing:
    """An HTTP server answering every request with one Cost Explorer error (JSON
    protocol, as AWS sends it): errors moto's Cost Explorer cannot be made to give."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        body = json.dumps({"__type": error_type, "Message": message}).encode()
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.1")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.mark.parametrize(
    ("status", "error_type", "code", "retryable", "says"),
    [
        (
            400,
            "AccessDeniedException",
            "auth",
            False,
            "need the IAM permission ce:GetCostAndUsage",
        ),
        (
            400,
            "com.amazonaws.awsinsightsindexservice#DataUnavailableException",
            "unavailable",
            True,
            "the billing data is not available yet",
        ),
        (400, "LimitExceededException", "unavailable", True, "LimitExceededException"),
        (400, "BillExpirationException", "invalid", False, "BillExpirationException"),
        (400, "UnrecognizedClientException", "auth", False, "UnrecognizedClientException"),
    ],
)
def test_cost_explorer_s_refusals_become_driver_errors(
    ami: str, status: int, error_type: str, code: str, retryable: bool, says: str
) -> None:
    server = CostExplorerRefusing(status, error_type, "refused for the test")
    try:
        driver = AwsDriver(
            aws_config(ami),
            {"endpoint_url": server.url, "on_demand_cents_per_hour": ON_DEMAND_CENTS},
        )
        error = driver.charges("alpha", "2026-03-01", "2026-03-02")
    finally:
        server.close()
    assert isinstance(error, DriverError), error
    assert (error.code, error.retryable) == (code, retryable)
    assert says in error.message
    assert "refused for the test" in error.message
    assert server.requests >= 1


# -- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"on_demand_cents_per_hour": 9.6, "regoin": "eu-west-1"}, f"{KEY}.regoin"),
        (
            {"on_demand_cents_per_hour": 9.6, "aws_secret_access_key": SECRET_KEY},
            f"{KEY}.aws_secret_access_key",
        ),
        ({}, f"{KEY}.on_demand_cents_per_hour"),
        ({"on_demand_cents_per_hour": 0}, f"{KEY}.on_demand_cents_per_hour"),
        ({"on_demand_cents_per_hour": -1.5}, f"{KEY}.on_demand_cents_per_hour"),
        ({"on_demand_cents_per_hour": "9.6"}, f"{KEY}.on_demand_cents_per_hour"),
        ({"on_demand_cents_per_hour": True}, f"{KEY}.on_demand_cents_per_hour"),
        (
            {"on_demand_cents_per_hour": float("nan")},
            f"{KEY}.on_demand_cents_per_hour",
        ),
        (
            {"on_demand_cents_per_hour": 9.6, "endpoint_url": "127.0.0.1:5000"},
            f"{KEY}.endpoint_url",
        ),
        ({"on_demand_cents_per_hour": 9.6, "subnet_id": ""}, f"{KEY}.subnet_id"),
        ({"on_demand_cents_per_hour": 9.6, "subnet_id": 7}, f"{KEY}.subnet_id"),
        (
            {"on_demand_cents_per_hour": 9.6, "security_group_ids": "sg-1"},
            f"{KEY}.security_group_ids",
        ),
        (
            {"on_demand_cents_per_hour": 9.6, "security_group_ids": []},
            f"{KEY}.security_group_ids",
        ),
        (
            {"on_demand_cents_per_hour": 9.6, "security_group_ids": ["sg-1", 2]},
            "provider.drivers.aws.security_group_ids.1",
        ),
        (
            {"on_demand_cents_per_hour": 9.6, "iam_instance_profile": ["x"]},
            f"{KEY}.iam_instance_profile",
        ),
    ],
)
def test_a_bad_option_is_a_config_error_naming_its_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        AwsDriver(aws_config("ami-12345678"), options)
    assert raised.value.key == key
    assert str(raised.value).startswith(f"{key}: ")
    assert SECRET_KEY not in str(raised.value)  # credentials are not options, nor echoed


def test_a_missing_config_field_is_a_config_error() -> None:
    config = AwsConfig(max_instances=0, region=REGION, instance_type=INSTANCE_TYPE)
    with pytest.raises(ConfigError) as raised:
        AwsDriver(config, {"on_demand_cents_per_hour": 9.6})
    assert raised.value.key == "cloud_providers.aws.ami_id"


def test_the_sdk_loads_lazily_and_its_absence_says_what_to_install() -> None:
    """In a fresh interpreter: importing the driver imports no SDK; building it
    without boto3 is a ConfigError with the ``pip install``."""
    script = (
        "import sys\n"
        "import autoscaler.drivers.aws as aws\n"
        "from autoscaler.config import AwsConfig\n"
        "from hypermedia.errors import ConfigError\n"
        "assert not {'boto3', 'botocore'} & set(sys.modules), 'imported an SDK'\n"
        "sys.modules['boto3'] = None  # as if it were not installed\n"
        "config = AwsConfig(max_instances=0, region='us-east-1', instance_type='m5.large',"
        " ami_id='ami-1')\n"
        "try:\n"
        "    aws.AwsDriver(config, {'on_demand_cents_per_hour': 9.6})\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'hypermedia[aws]'" in result.stdout
    assert result.stdout.startswith("provider.drivers.aws:")
