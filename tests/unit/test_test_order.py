"""The order xdist workers get the tests in (tests/scheduling.py)."""

from tests.scheduling import known_durations, longest_first


def test_long_tests_go_first_longest_first_each_with_a_short_one():
    ids = ["a", "b", "long1", "c", "long2", "d", "e"]
    durations = {"long1": 60.0, "long2": 200.0, "c": 0.5}
    assert longest_first(ids, durations) == ["long2", "a", "long1", "b", "c", "d", "e"]


def test_more_long_tests_than_short_ones_keeps_every_test_once():
    ids = ["x", "l1", "l2", "l3"]
    ordered = longest_first(ids, {"l1": 5.0, "l2": 9.0, "l3": 7.0})
    assert ordered == ["l2", "x", "l3", "l1"]


def test_no_durations_keeps_the_file_order():
    assert longest_first(["b", "a", "c"], {}) == ["b", "a", "c"]


def test_the_shipped_durations_name_tests_of_this_tree():
    durations = known_durations()
    assert durations and all(v >= 1.0 for v in durations.values())
    assert any(k.startswith("tests/e2e/test_ray_up.py::") for k in durations)
