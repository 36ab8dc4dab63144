"""``hypermedia status``'s screen (:func:`hypermedia.cli.status.render`) shows the record's
strings as they are: a reason, a summary, a host name or a provider's error holds what
others wrote (an exception's text, a bill's message), and none of it is Rich markup to
read nor a control sequence for the operator's terminal to obey."""

from __future__ import annotations

import io
import time

from rich.console import Console

from autoscaler.status import (
    AlertStatus,
    BillingStatus,
    BurstStatus,
    DecisionStatus,
    QueueStatus,
    SpendStatus,
    Status,
    StorageStatus,
    WorkerStatus,
)
from hypermedia.cli.status import render

# What a terminal obeys: a colour, a window title (OSC 0), a clear screen, a hyperlink
# (OSC 8), a bell; and what Rich reads as markup: a closing tag with no opening one
# (a MarkupError), a link, a style.
ESCAPES = "\x1b[31mred\x1b[0m \x1b]0;retitled\x07 \x1b[2J \x1b]8;;http://elsewhere\x1b\\here"
MARKUP = "[/bold] [link=http://elsewhere]click[/link] [blink]x[/blink]"
HOSTILE = f"{ESCAPES} {MARKUP} \x9b31m"


def hostile_status() -> Status:
    now = time.time()
    return Status(
        at=now,
        mode="hybrid",
        leader=f"vm:1 7 {HOSTILE}",
        last_turn_at=now,
        rate_window_seconds=900.0,
        queues=[QueueStatus("images", 0, 0.0, {}, 0, 0, 0, 0, 0.0, 0.0)],
        workers=[
            WorkerStatus(
                worker_id=f"w-1{HOSTILE}",
                queue="images",
                location="vps",
                hostname=f"host{HOSTILE}",
                node_id=None,
                state="active",
                heartbeat_age_seconds=3.0,
                current_jobs=0,
                concurrency=1,
                cpu_percent=None,
                claims_paused=f"low disk {HOSTILE}",
                claims_paused_seconds=60.0,
                outage_paused=f"redis down {HOSTILE}",
                outage_paused_since=now - 30,
                outage_paused_seconds=30.0,
            )
        ],
        instances=[],
        spend=SpendStatus(0.0, 0.0, 500, 5000, 4000, True, now, f"cap {HOSTILE}"),
        alerts=[AlertStatus(f"k{HOSTILE}", "r", "warning", f"summary {HOSTILE}", now, None)],
        decisions=[DecisionStatus(now, "hybrid", "launch", "images", True, f"why {HOSTILE}")],
        billing=[BillingStatus("aws", None, None, f"bill {HOSTILE}")],
        bursts=[BurstStatus("images", 1, now + 60, f"ops {HOSTILE}")],
        billing_findings=[f"finding {HOSTILE}"],
        storage=StorageStatus(False, f"storage {HOSTILE}", now),
    )


def screen(terminal: bool) -> str:
    out = io.StringIO()
    Console(file=out, force_terminal=terminal, width=3000, color_system="standard").print(
        render(hostile_status())
    )
    return out.getvalue()


def test_the_screen_shows_hostile_strings_as_text_not_as_markup_nor_escapes():
    for terminal in (True, False):
        shown = screen(terminal)  # a MarkupError here before: '[/bold]' closes nothing
        # Not one of the strings' sequences reaches the terminal: no retitle, no clear
        # screen, no hyperlink, no bell, no colour of theirs (Rich's own styles remain on
        # a terminal: SGR sequences it writes itself around the labels).
        for sequence in ("\x1b]", "\x1b[2J", "\x1b[31mred", "\x07", "\x9b"):
            assert sequence not in shown, (terminal, sequence)
        # ... each control character is shown as its escape, the markup as written.
        assert shown.count("\\x1b[31mred\\x1b[0m") == 13, terminal
        assert shown.count("\\x1b]0;retitled\\x07") == 13, terminal
        assert shown.count("\\x9b31m") == 13, terminal
        assert shown.count(MARKUP) == 13, terminal
