"""Billing reconciliation's rules (autoscaler.billing): what has settled, the days one read
covers, and which settled bills differ from the ledger."""

from __future__ import annotations

from autoscaler import billing
from autoscaler.billing import Finding, LedgerRow
from autoscaler.drivers.base import Charge

DAY = 86_400.0
MON = billing.day_start("2026-11-30")  # 00:00 UTC
SETTLE = 48 * 3600.0


def row(
    spend_id: int,
    start: float,
    end: float | None,
    *,
    cents: float = 17.0,
    instance: str | None = None,
    request: str | None = None,
    reconciled: bool = False,
) -> LedgerRow:
    return LedgerRow(
        spend_id=spend_id,
        provider="aws",
        instance_id=instance or f"i-{spend_id}",
        request_id=request,
        launched_at=start,
        terminated_at=end,
        cents_per_hour=cents,
        reconciled=reconciled,
    )


def test_an_instance_and_its_days_settle_only_once_the_bill_had_time():
    ended = row(1, MON + 10 * 3600, MON + 11 * 3600)
    # Tuesday noon: Monday ended 12 h ago, the instance 25 h ago: nothing settled.
    assert billing.pending([ended], SETTLE, [], MON + 1.5 * DAY) == ([], [])
    # Wednesday 11:00: 48 h after the instance ended; Monday's end is 47 h ago.
    assert billing.pending([ended], SETTLE, [], MON + 2 * DAY + 11 * 3600) == ([ended], [])
    # Wednesday 00:00 + 1 day: Monday settled too.
    assert billing.pending([ended], SETTLE, [], MON + 3 * DAY) == ([ended], ["2026-11-30"])
    # Reconciled and compared: nothing left to read for.
    done = row(1, MON + 10 * 3600, MON + 11 * 3600, reconciled=True)
    assert billing.pending([done], SETTLE, ["2026-11-30"], MON + 3 * DAY) == ([], [])


def test_a_running_instance_settles_day_by_day():
    running = row(1, MON + 20 * 3600, None)
    instances, days = billing.pending([running], SETTLE, ["2026-11-30"], MON + 5 * DAY)
    assert instances == []  # still running: its total is not settled
    assert days == ["2026-12-01", "2026-12-02"]  # Mon compared; Tue and Wed settled
    assert billing.window(instances, days) == ("2026-12-01", "2026-12-02")


def test_the_window_covers_every_day_of_an_instance_to_reconcile():
    long = row(1, MON + 23 * 3600, MON + DAY + 2 * 3600)  # Mon 23:00 .. Tue 02:00
    assert billing.window([long], ["2026-12-03"]) == ("2026-11-30", "2026-12-03")
    assert billing.window([long], []) == ("2026-11-30", "2026-12-01")


def test_bills_are_matched_by_instance_id_or_request_id_and_differences_found():
    fair = row(1, MON + 10 * 3600, MON + 11 * 3600)  # 17 cents on the ledger
    odd = row(2, MON + 10 * 3600, MON + 11 * 3600, instance="i-odd", request="req-odd")
    rows = [fair, odd]
    charges = [
        Charge("2026-11-30", 17.1, instance_id="i-1"),
        Charge("2026-11-30", 40.0, request_id="req-odd"),  # the bill names only the tag
        Charge("2026-11-30", 30.0, request_id="req-nobody"),  # no ledger row has it
    ]
    outcome = billing.compare("aws", rows, charges, rows, ["2026-11-30"], MON + 3 * DAY)
    assert outcome.billed == {1: 17.1, 2: 40.0}
    assert outcome.days == ("2026-11-30",)
    instance, day = outcome.findings
    assert instance == Finding("aws", "instance i-odd", 17.0, 40.0)
    assert (day.subject, round(day.ledger_cents, 6), round(day.billed_cents, 6)) == (
        "2026-11-30",
        34.0,
        87.1,
    )
    assert "$0.30 of it on resources the ledger does not know" in day.message()
    assert instance.message() == (
        "aws's bill for instance i-odd is $0.40, the ledger counted $0.17"
    )


def test_a_bill_within_the_tolerance_is_no_finding():
    a = row(1, MON, MON + 10 * 3600, cents=100.0)  # $10.00 on the ledger
    near = [Charge("2026-11-30", 1090.0, instance_id="i-1")]  # 9 % more: disks, say
    assert billing.compare("aws", [a], near, [a], ["2026-11-30"], MON + 3 * DAY).findings == ()
    far = [Charge("2026-11-30", 1120.0, instance_id="i-1")]
    found = billing.compare("aws", [a], far, [a], ["2026-11-30"], MON + 3 * DAY).findings
    assert [f.subject for f in found] == ["instance i-1", "2026-11-30"]
    # Under a cent apart is never a finding, whatever the share.
    tiny = row(3, MON, MON + 60, cents=1.0)
    cheap = [Charge("2026-11-30", 0.5, instance_id="i-3")]
    assert billing.compare("aws", [tiny], cheap, [tiny], [], MON + 3 * DAY).findings == ()


def test_an_empty_bill_says_the_billing_may_not_be_set_up():
    a = row(1, MON, MON + 3600, cents=50.0)
    found = billing.compare("google", [a], [], [a], ["2026-11-30"], MON + 3 * DAY).findings
    assert len(found) == 2
    assert all("is its billing set up?" in f.message() for f in found)
    assert found[0].billed_cents == 0.0 and found[0].ledger_cents == 50.0


def test_a_day_counts_only_the_part_of_each_instance_within_it():
    # Mon 22:00 .. Tue 02:00 at 10 c/h: 20 cents on Monday, 20 on Tuesday.
    a = row(1, MON + 22 * 3600, MON + DAY + 2 * 3600, cents=10.0)
    bill = [Charge("2026-11-30", 20.0, instance_id="i-1"), Charge("2026-12-01", 20.0, "", "i-1")]
    outcome = billing.compare("aws", [a], bill, [a], ["2026-11-30", "2026-12-01"], MON + 4 * DAY)
    assert outcome.findings == ()
    assert outcome.billed == {1: 40.0}
