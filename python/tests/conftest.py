"""The client against a real gpupin serve. tests/python_client.rs (cargo test) starts the
daemon as root on a simulated machine, as a throwaway user runs these, and sets:

GPUPIN_SOCKET  the daemon's socket
GPUPIN_BIN     the gpupin command, GPUPIN_CONFIG its config (for `gpupin status --json`)
GPUPIN_TEST_FREE   how many GPUs the users of the test may have (root holds the rest)
GPUPIN_TEST_LIMIT  limits.max_gpus_per_user

Without GPUPIN_SOCKET only the tests that need no daemon run; the others say why they
are skipped."""

import json
import os
import pwd
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PACKAGE_ROOT)

#: Far above what any state change needs: only a hang fails a test.
DEADLINE = 60.0


def until(what, check):
    """Polls ``check`` until it returns something true; fails after DEADLINE."""
    start = time.monotonic()
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() - start > DEADLINE:
            pytest.fail("gave up waiting until " + what)
        time.sleep(0.05)


@pytest.fixture
def daemon():
    if not os.environ.get("GPUPIN_SOCKET"):
        pytest.skip("no gpupin serve: GPUPIN_SOCKET is not set (cargo test --test python_client runs these)")
    return Daemon()


class Daemon:
    free = int(os.environ.get("GPUPIN_TEST_FREE", "0"))
    limit = int(os.environ.get("GPUPIN_TEST_LIMIT", "0"))
    me = pwd.getpwuid(os.getuid()).pw_name

    def cli_status(self):
        """`gpupin status --json`, as the user would run it."""
        out = subprocess.run(
            [os.environ["GPUPIN_BIN"], "--config", os.environ["GPUPIN_CONFIG"], "status", "--json"],
            check=True,
            stdout=subprocess.PIPE,
        )
        return json.loads(out.stdout)

    def holder(self, holder_id, status=None):
        status = status if status is not None else self.cli_status()
        return next((h for h in status["holders"] if h["id"] == holder_id), None)

    def mine(self):
        """Ids of this user's holders."""
        return sorted(
            h["id"] for h in self.cli_status()["holders"] if (h.get("owner") or {}).get("user") == self.me
        )

    def until_gone(self, holder_id):
        until("holder {} is released".format(holder_id), lambda: self.holder(holder_id) is None)

    def python(self, script, **kwargs):
        """A child Python running ``script`` with this package on its path."""
        env = dict(os.environ)
        env["PYTHONPATH"] = PACKAGE_ROOT
        return subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            universal_newlines=True,
            **kwargs
        )

    def holding_child(self, count):
        """A child process that holds ``count`` GPUs until its stdin closes; (child, holder)."""
        child = self.python(
            "import gpupin, sys\n"
            "a = gpupin.acquire(count={})\n"
            "print(a.holder, flush=True)\n"
            "sys.stdin.read()\n".format(count)
        )
        line = child.stdout.readline().strip()
        assert line, child.stderr.read()
        return child, line
