import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item, so fixtures can tell
    whether the test failed (and print the cluster's logs)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
