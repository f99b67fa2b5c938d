"""The deploy tests build and run real images with podman. Where podman
cannot run at all, the run stops with exit code 77, which CTest shows as
Skipped, and the reason is printed."""
import subprocess

import pytest


@pytest.fixture(scope="session")
def podman():
    try:
        r = subprocess.run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
                           capture_output=True, text=True, timeout=60)
        problem = None if r.returncode == 0 else r.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        problem = str(e)
    if problem:
        pytest.exit(f"SKIPPED: podman cannot run here ({problem}); make setup installs it",
                    returncode=77)
