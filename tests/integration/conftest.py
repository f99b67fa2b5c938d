import pytest

from cluster import Cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item, so fixtures can tell
    whether the test failed (and print the cluster's logs)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture
def make_cluster(tmp_path, request):
    """make_cluster(**options) gives the test its Cluster under tmp_path/cluster,
    with Cluster's options (lease_ms, stop_grace_ms); once per test. Whatever
    it started is stopped after the test on every path, and its logs are
    printed when the test failed."""
    made = []

    def make(**options):
        assert not made, "one cluster per test: its folder is tmp_path/cluster"
        made.append(Cluster(str(tmp_path / "cluster"), **options))
        return made[0]

    yield make
    failed = getattr(request.node, "rep_call", None)
    for c in made:
        c.stop()
        if failed is not None and failed.failed:
            print(c.logs())


@pytest.fixture
def cluster(make_cluster):
    """A Cluster with the default options (a 3 s lease), nothing started yet."""
    return make_cluster()
