"""The seccomp filter's rules, read back from libseccomp (its PFC export of the very
rules the BPF program is built from). The sandbox tests see the kernel refuse the
calls; many of those a job's uid is refused anyway, so only this tells that the
filter itself holds a rule for each."""

from __future__ import annotations

import re

import pytest

from hypermedia.sandbox import syscalls

RULE = re.compile(
    r'# filter for syscall "(?P<name>\w+)" \((?P<number>\d+)\)[^\n]*\n'
    r"\s*if \(\$syscall == (?P=number)\)\n"
    r"(?P<body>(?:\s+if [^\n]+\n)*\s+action (?P<action>\w+(?:\(\d+\))?);)"
)


@pytest.fixture(scope="module")
def pfc() -> str:
    return syscalls.describe_filter()


def rules(pfc: str) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for match in RULE.finditer(pfc):
        found.setdefault(match["name"], []).append((match["action"], match["body"]))
    return found


def test_every_denied_syscall_has_its_eperm_rule_whatever_the_arguments(pfc):
    found = rules(pfc)
    for name in syscalls.DENIED:
        assert name in found, f"no rule for {name}"
        ((action, body),) = found[name]
        assert action == "ERRNO(1)", (name, action)
        assert "$a" not in body, f"{name}'s rule depends on its arguments: {body}"


def test_clone_is_refused_with_each_namespace_flag_and_clone3_with_enosys(pfc):
    clone = pfc[pfc.index('# filter for syscall "clone" ') :]
    for flag in syscalls.NAMESPACE_FLAGS.values():
        assert re.search(rf"& 0x{flag:08x} == {flag}\)\n\s+action ERRNO\(1\);", clone), hex(flag)
    assert rules(pfc)["clone3"] == [("ERRNO(38)", rules(pfc)["clone3"][0][1])]


def test_everything_else_is_allowed_and_another_abi_is_killed(pfc):
    assert re.search(r"# default action\n\s+action ALLOW;", pfc)
    assert re.search(r"# invalid architecture action\naction KILL;", pfc)
    assert set(rules(pfc)) == {*syscalls.DENIED, "clone", "clone3"}
