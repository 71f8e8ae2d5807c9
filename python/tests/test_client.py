"""gpupin.acquire, release and status against a real gpupin serve (see conftest.py)."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading

import pytest

import gpupin
from conftest import until


def test_acquire_sets_the_environment_and_status_shows_the_holder_under_the_user(daemon, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    with gpupin.acquire(count=1) as held:
        assert len(held.gpus) == 1
        assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == str(held.gpus[0].index)
        assert held.visible_devices == os.environ["CUDA_VISIBLE_DEVICES"]
        shown = daemon.holder(held.holder)
        assert shown is not None, "gpupin status shows the holder"
        assert shown["owner"]["user"] == daemon.me
        assert shown["owner"]["uid"] == os.getuid()
        assert shown["pid"] == os.getpid(), "held for this very process"
        assert shown["gpus"] == [held.gpus[0].uuid]
        # The daemon's status op says the same.
        assert gpupin.status()["holders"] == daemon.cli_status()["holders"]
    assert held.released
    assert daemon.holder(held.holder) is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"
    held.release()  # a second release does nothing


def test_the_gpus_go_when_the_process_exits(daemon):
    child = daemon.python("import gpupin\nprint(gpupin.acquire(count=1).holder)\n")
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    holder = out.strip()
    daemon.until_gone(holder)
    assert daemon.mine() == []


def test_the_gpus_go_when_the_process_is_killed_with_sigkill(daemon):
    child, holder = daemon.holding_child(1)
    assert daemon.holder(holder)["pid"] == child.pid
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    daemon.until_gone(holder)
    assert daemon.mine() == []


def test_an_evicted_process_is_told_who_ended_it_and_why(daemon):
    """Issue 32, item 3: the Python client's side of Slurm's "CANCELLED BY": a process
    ended through gpupin evict raises gpupin.Evicted saying who and why."""
    child, holder = daemon.holding_child(1)
    out = subprocess.run(
        [os.environ["GPUPIN_BIN"], "--config", os.environ["GPUPIN_CONFIG"], "evict", holder, "--reason", "wrong input file"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("evicted {} (stopped with SIGTERM)".format(holder)), out.stdout
    child.wait(timeout=60)
    stderr = child.stderr.read()
    assert child.returncode == 1, stderr
    assert stderr.rstrip("\n").splitlines()[-1] == (
        "gpupin.Evicted: {} was ended by {} (gpupin evict): wrong input file".format(holder, daemon.me)
    ), stderr
    daemon.until_gone(holder)


def test_a_sigterm_from_anyone_else_ends_the_process_as_before(daemon):
    child, holder = daemon.holding_child(1)
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGTERM, child.stderr.read()
    daemon.until_gone(holder)


def test_a_limit_refuses_with_the_daemons_one_line_and_nothing_is_held(daemon, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    child, holder = daemon.holding_child(1)
    try:
        with pytest.raises(gpupin.Error) as refused:
            gpupin.acquire(count=daemon.limit)
        line = str(refused.value)
        assert "\n" not in line
        assert line == "{me} holds 1 GPU and {me} asks for {n} more; their limit is {n} (limits.max_gpus_per_user)".format(
            me=daemon.me, n=daemon.limit
        )
        assert daemon.mine() == [holder], "nothing more is held"
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    daemon.until_gone(holder)


def test_wait_gets_the_gpu_once_another_holder_releases(daemon, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # The child holds as many as the limit lets one user have, and more than are left
    # free: a request for as many waits both for GPUs and for the user's limit.
    assert daemon.limit > daemon.free - daemon.limit
    child, holder = daemon.holding_child(daemon.limit)
    try:
        with pytest.raises(gpupin.Error):
            gpupin.acquire(count=daemon.limit)  # no wait: refused at once
        # Once this request waits in the queue, the other holder ends.
        def release_when_queued():
            until("the request waits in the queue", lambda: gpupin.status()["waiting"])
            child.stdin.close()

        releaser = threading.Thread(target=release_when_queued)
        releaser.start()
        with gpupin.acquire(count=daemon.limit, wait=120) as held:
            assert daemon.holder(holder) is None, "it came after the other holder went"
            assert len(held.gpus) == daemon.limit
            assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(str(g.index) for g in held.gpus)
        releaser.join()
    finally:
        if child.poll() is None:
            child.stdin.close()
        child.wait(timeout=60)


def test_acquire_refuses_in_a_process_where_cuda_runs(daemon, tmp_path):
    # A library named libcuda.so.1 mapped into the process, as the CUDA driver is once
    # torch, tensorflow or cupy start CUDA: a copy of libm, which loads anywhere.
    libm = next(
        line.split()[5]
        for line in open("/proc/self/maps")
        if len(line.split()) == 6 and os.path.basename(line.split()[5]).startswith("libm.so")
    )
    fake = tmp_path / "libcuda.so.1"
    shutil.copy(libm, str(fake))
    child = daemon.python(
        "import ctypes, gpupin, sys\n"
        "ctypes.CDLL(sys.argv[1])\n".replace("sys.argv[1]", repr(str(fake)))
        + "try:\n"
        "    gpupin.acquire(count=1)\n"
        "except gpupin.CudaInitialized as e:\n"
        "    assert isinstance(e, gpupin.Error)\n"
        "    print(e)\n"
        "else:\n"
        "    print('acquired')\n"
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.strip() == (
        "CUDA is already initialised in this process ({} is loaded in this process): "
        "CUDA_VISIBLE_DEVICES would no longer count; call gpupin.acquire() before torch, "
        "tensorflow or cupy start CUDA".format(fake)
    )
    assert daemon.mine() == []


def test_an_open_nvidia_device_counts_as_cuda_started(tmp_path):
    fd = tmp_path / "fd"
    fd.mkdir()
    (tmp_path / "maps").write_text("7f00-7f01 r-xp 00000000 00:00 0 /usr/lib/libm.so.6\n")
    os.symlink("/dev/null", str(fd / "0"))
    assert gpupin.cuda_in_use(str(tmp_path)) is None
    os.symlink("/dev/nvidiactl", str(fd / "5"))
    assert gpupin.cuda_in_use(str(tmp_path)) == "this process has /dev/nvidiactl open"
    assert gpupin.cuda_in_use() is None, "this test process has no CUDA"


def test_a_user_cannot_hold_for_another_users_process(daemon):
    ask = {"op": "hold", "id": "py-theirs", "devices": "", "request": [["gpupin.count", "1"]]}
    with pytest.raises(gpupin.Error) as refused:
        gpupin._ask(dict(ask, pid=1))  # init: root's
    assert str(refused.value) == "pid 1 is not a process of uid {}".format(os.getuid())
    with pytest.raises(gpupin.Error) as refused:
        gpupin._ask(dict(ask, pid=os.getpid(), user="root"))
    assert str(refused.value) == "only root may hold GPUs for another user (root)"
    with pytest.raises(gpupin.Error) as refused:
        gpupin._ask(dict(ask, until_release=True))
    assert str(refused.value).startswith("only root may hold GPUs until released")
    assert daemon.holder("py-theirs") is None
    assert daemon.mine() == []


def test_the_protocol_version_is_named_and_another_is_refused(daemon):
    assert gpupin.hello()["v"] == 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(os.environ["GPUPIN_SOCKET"])
    sock.sendall(b'{"v":2,"op":"hello"}\n')
    reply = json.loads(sock.makefile().readline())
    sock.close()
    assert reply["v"] == 1
    assert reply["error"].startswith("protocol version 2 is not one this gpupin serve speaks (it speaks 1)")


def test_bad_arguments_name_the_value():
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(ValueError) as e:
            gpupin.acquire(count=bad)
        assert str(e.value).startswith("invalid count={!r}: expected".format(bad))
    with pytest.raises(ValueError) as e:
        gpupin.acquire(wait=-1)
    assert str(e.value) == "invalid wait=-1: expected seconds as a number >= 0, such as 600"


def test_no_daemon_is_one_line_saying_who_starts_it(tmp_path, monkeypatch):
    path = str(tmp_path / "gpupin.sock")
    monkeypatch.setenv("GPUPIN_SOCKET", path)
    with pytest.raises(gpupin.Error) as e:
        gpupin.status()
    assert str(e.value) == (
        "cannot reach gpupin serve at {}: no such socket: gpupin serve is not running "
        "(an admin starts it: systemctl enable --now gpupin.socket)".format(path)
    )


def test_the_socket_is_found_as_the_gpupin_command_finds_it(tmp_path, monkeypatch):
    """Issue 32, item 11: with only GPUPIN_CONFIG set, gpupin exec reached the daemon and
    acquire() did not: both now take GPUPIN_SOCKET, else the config's socket, else its
    state_dir's gpupin.sock."""
    config = tmp_path / "gpupin.toml"
    config.write_text('state_dir = "{}"\n'.format(tmp_path / "state"))
    monkeypatch.delenv("GPUPIN_SOCKET", raising=False)
    monkeypatch.setenv("GPUPIN_CONFIG", str(config))
    assert gpupin.socket_path() == str(tmp_path / "state" / "gpupin.sock")
    config.write_text('state_dir = "/x"\nsocket = "{}"\n'.format(tmp_path / "s.sock"))
    assert gpupin.socket_path() == str(tmp_path / "s.sock")
    monkeypatch.setenv("GPUPIN_SOCKET", "/elsewhere.sock")
    assert gpupin.socket_path() == "/elsewhere.sock"
    monkeypatch.delenv("GPUPIN_SOCKET")
    monkeypatch.setenv("GPUPIN_CONFIG", str(tmp_path / "missing.toml"))
    assert gpupin.socket_path() == "/run/gpupin/gpupin.sock"


def test_the_same_acquire_again_returns_the_holder_it_has_and_says_so(daemon, monkeypatch):
    # A notebook cell run again: one holder, the same GPU, the same CUDA_VISIBLE_DEVICES.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = gpupin.acquire(count=1)
    try:
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        with pytest.warns(gpupin.AlreadyHeld) as told:
            again = gpupin.acquire(count=1)
        assert again.holder == first.holder
        assert str(told[0].message) == (
            "this process already holds GPU {} as {} (acquire(count=1)): the same request "
            "returns that holder again, not a second one".format(visible, first.holder)
        )
        assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
        assert daemon.mine() == [first.holder]
    finally:
        gpupin.release()
    daemon.until_gone(first.holder)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_another_acquire_is_refused_with_the_way_out_until_release(daemon, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = gpupin.acquire(count=1)
    try:
        visible = os.environ["CUDA_VISIBLE_DEVICES"]
        with pytest.raises(gpupin.Error) as refused:
            gpupin.acquire(count=2)
        assert str(refused.value) == (
            "this process already holds GPU {} as {} (acquire(count=1)) and now asks for "
            "acquire(count=2): call gpupin.release() first, then acquire again".format(visible, first.holder)
        )
        assert daemon.mine() == [first.holder], "nothing more is held"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == visible
        gpupin.release()
        daemon.until_gone(first.holder)
        with gpupin.acquire(count=2) as second:
            assert daemon.mine() == [second.holder]
    finally:
        gpupin.release()


def test_another_acquire_after_cuda_started_says_to_restart(daemon, tmp_path):
    libm = next(
        line.split()[5]
        for line in open("/proc/self/maps")
        if len(line.split()) == 6 and os.path.basename(line.split()[5]).startswith("libm.so")
    )
    fake = tmp_path / "libcuda.so.1"
    shutil.copy(libm, str(fake))
    child = daemon.python(
        "import ctypes, gpupin\n"
        "held = gpupin.acquire(count=1)\n"
        "ctypes.CDLL({!r})\n"
        "try:\n"
        "    gpupin.acquire(count=1, policy='spread')\n"
        "except gpupin.Error as e:\n"
        "    print(held.holder, held.gpus[0].index)\n"
        "    print(e)\n".format(str(fake))
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    holder_line, line = out.strip().split("\n")
    holder, index = holder_line.split()
    assert line == (
        "this process already holds GPU {} as {} (acquire(count=1)) and now asks for "
        "acquire(count=1, policy='spread'): CUDA already runs here ({} is loaded in this "
        "process), so a new set takes effect only in a new process: restart the kernel "
        "(or the process)".format(index, holder, fake)
    )


def test_a_socket_for_a_group_names_the_group_and_the_command_to_join(tmp_path):
    # As the gpupin command says it: the socket's own group, read from the socket file.
    import grp
    import pwd

    sock = tmp_path / "gpupin.sock"
    sock.write_text("")
    group = grp.getgrgid(os.stat(str(sock)).st_gid).gr_name
    me = pwd.getpwuid(os.getuid()).pw_name
    assert gpupin._connect_hint(str(sock), PermissionError()) == (
        "cannot reach gpupin serve at {}: permission denied: only members of group {g} may use it "
        "(ask an admin to add you: usermod -aG {g} {me}; then log in again)".format(sock, g=group, me=me)
    )
