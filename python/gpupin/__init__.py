"""GPUs for this Python process from ``gpupin serve``.

``acquire()`` asks the daemon to hold GPUs for the calling process: the daemon checks
with the kernel (SO_PEERCRED, a pidfd) that the process is the caller's own, and
releases the GPUs the moment it ends, however it ends (``kill -9`` included). The
environment that tells CUDA which GPUs are this process's (``CUDA_VISIBLE_DEVICES``,
``CUDA_DEVICE_ORDER=PCI_BUS_ID``) is set in ``os.environ``, which CUDA reads once, when
it starts: so ``acquire()`` refuses, with ``CudaInitialized``, in a process where CUDA
already runs.

The wire protocol is docs/protocol.md in the gpupin repository (version 1).
"""

import json
import math
import os
import secrets
import signal
import socket
import threading
import time
import warnings

__all__ = [
    "AlreadyHeld",
    "Allocation",
    "CudaInitialized",
    "Error",
    "Evicted",
    "Gpu",
    "acquire",
    "cuda_in_use",
    "hello",
    "release",
    "socket_path",
    "status",
]

__version__ = "0.1.0"

#: The protocol version this client speaks (docs/protocol.md).
PROTOCOL = 1
#: Where the daemon listens unless ``GPUPIN_SOCKET`` says otherwise.
DEFAULT_SOCKET = "/run/gpupin/gpupin.sock"
#: The longest message either side sends, newline included.
MAX_MESSAGE = 64 << 10
#: Seconds connecting may take (the daemon's listen backlog may be full).
CONNECT_TIMEOUT = 10.0
#: Seconds an answer may take, besides a wait in the queue the request asks for.
REPLY_TIMEOUT = 60.0


class Error(Exception):
    """A request gpupin serve refused or that failed: ``str(e)`` is its one line."""


class CudaInitialized(Error):
    """CUDA already runs in this process: a CUDA_VISIBLE_DEVICES set now would not count."""


class Evicted(Error):
    """This process was ended through ``gpupin evict`` (its GPUs go to others): ``str(e)``
    says who ended it and why, as ``gpupin exec`` tells an evicted job on stderr."""


class AlreadyHeld(UserWarning):
    """acquire() with the request this process already holds: it returns that holder again."""


class Gpu(tuple):
    """One GPU held: its ``index`` (as nvidia-smi numbers it; None where unknown) and ``uuid``."""

    __slots__ = ()

    def __new__(cls, index, uuid):
        return tuple.__new__(cls, (index, uuid))

    @property
    def index(self):
        return self[0]

    @property
    def uuid(self):
        return self[1]

    def __repr__(self):
        return "Gpu(index={!r}, uuid={!r})".format(self[0], self[1])


#: The config the gpupin command reads unless ``GPUPIN_CONFIG`` names another.
DEFAULT_CONFIG = "/etc/gpupin/config.toml"
#: Where gpupin keeps its state unless the config's ``state_dir`` says otherwise.
DEFAULT_STATE_DIR = "/run/gpupin"


def socket_path():
    """The daemon's socket, found as the gpupin command finds it: ``$GPUPIN_SOCKET``;
    else the config (``$GPUPIN_CONFIG``, else /etc/gpupin/config.toml where it exists):
    its ``socket``, else ``gpupin.sock`` in its ``state_dir``; else
    /run/gpupin/gpupin.sock."""
    explicit = os.environ.get("GPUPIN_SOCKET")
    if explicit:
        return explicit
    settings = _settings()
    if settings.get("socket"):
        return str(settings["socket"])
    if settings.get("state_dir"):
        return os.path.join(str(settings["state_dir"]), "gpupin.sock")
    return DEFAULT_SOCKET


def _settings():
    """The config the gpupin command reads: ``$GPUPIN_CONFIG``, else /etc/gpupin/config.toml."""
    return _read_config(os.environ.get("GPUPIN_CONFIG") or DEFAULT_CONFIG)


def _read_config(path):
    """The config's top-level keys; nothing for a config that is missing or unreadable
    (the gpupin command says what is wrong with one)."""
    try:
        import tomllib
    except ImportError:  # Python before 3.11: the default socket, or GPUPIN_SOCKET
        return {}
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, ValueError):
        return {}


def _connect_hint(path, error):
    """Why connecting failed, in the words of whoever must act (as the gpupin command says it)."""
    if isinstance(error, FileNotFoundError):
        why = "no such socket: gpupin serve is not running (an admin starts it: systemctl enable --now gpupin.socket)"
    elif isinstance(error, ConnectionRefusedError):
        why = "nothing listens there: gpupin serve stopped (an admin starts it again: systemctl restart gpupin.socket)"
    elif isinstance(error, PermissionError):
        group = _socket_group(path)
        if group:
            why = "permission denied: only members of group {0} may use it (ask an admin to add you: usermod -aG {0} {1}; then log in again)".format(
                group, _own_name()
            )
        else:
            why = "permission denied: the socket is for the group the config's socket_group names (ask an admin to add you to it)"
    else:
        why = str(error)
    return "cannot reach gpupin serve at {}: {}".format(path, why)


def _socket_group(path):
    """The name of the group that owns the socket (as gpupin serve made it), or None."""
    import grp

    try:
        return grp.getgrgid(os.lstat(path).st_gid).gr_name
    except (OSError, KeyError):
        return None


def _own_name():
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _read_line(sock):
    """One reply line, at most MAX_MESSAGE bytes; b"" when the daemon closed without one."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(MAX_MESSAGE + 1 - len(data))
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_MESSAGE:
            raise Error("gpupin serve sent a reply longer than {} bytes".format(MAX_MESSAGE))
    return data


def _ask(request, timeout=REPLY_TIMEOUT):
    """Sends one request (a dict with ``op``) and returns the daemon's reply; a refusal raises Error."""
    path = socket_path()
    message = dict(request)
    message["v"] = PROTOCOL
    line = json.dumps(message, separators=(",", ":")).encode() + b"\n"
    # Python's sockets are close-on-exec: a child started later never holds this one.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except socket.timeout:
            raise Error(
                "gpupin serve at {} took no connection within {:g}s: it is overloaded or stuck; try again, or ask an admin to look at its log".format(
                    path, CONNECT_TIMEOUT
                )
            ) from None
        except OSError as e:
            raise Error(_connect_hint(path, e)) from None
        sock.settimeout(timeout)
        try:
            sock.sendall(line)
            data = _read_line(sock)
        except socket.timeout:
            raise Error(
                "gpupin serve did not answer within {:g}s: it is overloaded or stuck; try again, or ask an admin to look at its log".format(
                    timeout
                )
            ) from None
        except OSError as e:
            raise Error("talking to gpupin serve: {}".format(e)) from None
    finally:
        sock.close()
    if not data:
        raise Error("gpupin serve closed the connection without an answer")
    try:
        reply = json.loads(data)
    except ValueError as e:
        raise Error("gpupin serve sent a reply that is no JSON: {}".format(e)) from None
    if not isinstance(reply, dict):
        raise Error("gpupin serve sent a reply that is no JSON object")
    if reply.get("error"):
        raise Error(reply["error"])
    return reply


def hello():
    """The daemon's versions: ``{"v": protocol, "version": gpupin release}``."""
    reply = _ask({"op": "hello"})
    return {"v": reply.get("v", 1), "version": reply.get("version")}


def status():
    """What ``gpupin status --json`` shows (GPUs, holders and their owners, the queue),
    read by the daemon; without the processes on each GPU."""
    return _ask({"op": "status"})["status"]


def cuda_in_use(proc="/proc/self"):
    """Why CUDA counts as started in this process, or None: an open /dev/nvidia* device
    (a CUDA context holds /dev/nvidiactl and its GPUs' nodes open) or libcuda mapped in
    (the driver API loaded: torch, tensorflow and cupy load it when they start CUDA).
    Read from the process itself, not from which modules were imported."""
    fd_dir = os.path.join(proc, "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            return "this process has {} open".format(target)
    try:
        with open(os.path.join(proc, "maps")) as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                mapped = fields[5].strip()
                if os.path.basename(mapped).startswith("libcuda.so"):
                    return "{} is loaded in this process".format(mapped)
    except OSError:
        pass
    return None


def _duration(name, seconds):
    """Seconds as the daemon's durations (``1500ms``), or a ValueError naming the value."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            "invalid {}={!r}: expected seconds as a number >= 0, such as 600".format(name, seconds)
        )
    return "{}ms".format(int(math.ceil(seconds * 1000)))


class Allocation:
    """GPUs held for this process: ``.holder`` (as ``gpupin status`` names it),
    ``.gpus`` (``Gpu(index, uuid)`` in bus order), ``.env`` (the whole environment the
    daemon gave), ``.release()``; a context manager that releases on exit. The GPUs go
    by themselves when the process ends."""

    def __init__(self, holder, gpus, env, previous, asked=None):
        self.holder = holder
        self.gpus = gpus
        self.env = env
        self._previous = previous
        self._asked = asked or {}
        self._pid = os.getpid()
        self._since = time.time()
        self.released = False

    @property
    def visible_devices(self):
        """What CUDA_VISIBLE_DEVICES was set to."""
        return self.env.get("CUDA_VISIBLE_DEVICES", "")

    def release(self):
        """Gives the GPUs back now and restores CUDA_VISIBLE_DEVICES and
        CUDA_DEVICE_ORDER as they were; a second call does nothing."""
        if self.released:
            return
        _ask({"op": "release", "id": self.holder, "exact": True, "ignore_missing": True})
        self.released = True
        global _held
        if _held is self:
            _held = None
        for key, value in self._previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def __repr__(self):
        return "Allocation(holder={!r}, gpus={!r})".format(self.holder, self.gpus)


#: What acquire() sets in os.environ.
_SET = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES")

#: This process's Allocation while it holds one: a notebook cell run again must not hold
#: a second set of GPUs while the first stays held until the kernel ends.
_held = None


def release():
    """Gives back the GPUs this process acquired, if it holds any (``Allocation.release``)."""
    held = _current()
    if held is not None:
        held.release()


def _current():
    """This process's unreleased Allocation, or None (a forked child holds nothing)."""
    if _held is None or _held.released or _held._pid != os.getpid():
        return None
    return _held


def _asked_text(asked):
    return ", ".join("{}={!r}".format(k, v) for k, v in asked.items())


def _held_text(held):
    gpus = [str(g.index) if g.index is not None else g.uuid for g in held.gpus]
    return "GPU{} {} as {} (acquire({}))".format(
        "s" if len(gpus) != 1 else "", ",".join(gpus), held.holder, _asked_text(held._asked)
    )


def _again(held, asked):
    """acquire() in a process that holds GPUs already: the same request gets the same
    holder (and a warning saying so), another is refused with the way out."""
    if held._asked != asked:
        evidence = cuda_in_use()
        if evidence:
            way_out = "CUDA already runs here ({}), so a new set takes effect only in a new process: restart the kernel (or the process)".format(
                evidence
            )
        else:
            way_out = "call gpupin.release() first, then acquire again"
        raise Error(
            "this process already holds {} and now asks for acquire({}): {}".format(
                _held_text(held), _asked_text(asked), way_out
            )
        )
    warnings.warn(
        "this process already holds {}: the same request returns that holder again, not a second one".format(
            _held_text(held)
        ),
        AlreadyHeld,
        stacklevel=3,
    )
    for key in _SET:
        os.environ[key] = held.env[key]
    return held


def _ended_note(holder, since):
    """Who ended ``holder`` and why, as the note ``gpupin evict`` leaves before it stops
    a holder (``<state_dir>/ended/<holder>.json``), when it was written after ``since``;
    None otherwise. Read without following a link."""
    if "/" in holder or holder.startswith("."):
        return None
    state_dir = str(_settings().get("state_dir") or DEFAULT_STATE_DIR)
    path = os.path.join(state_dir, "ended", holder + ".json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            note = json.loads(f.read(MAX_MESSAGE))
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict) or not isinstance(note.get("at"), int):
        return None
    # Whole seconds: a note of this second counts.
    if note["at"] < int(since) - 1:
        return None
    why = ": {}".format(note["reason"]) if note.get("reason") else ""
    return "{} was ended by {} ({}){}".format(holder, note.get("by"), note.get("how"), why)


def _on_sigterm(signum, frame):
    """SIGTERM while this process holds GPUs: from ``gpupin evict`` (its note says so),
    ``Evicted`` is raised where the process is, saying who and why (a notebook shows it
    in the cell; evict kills the process after its grace if it lives on); from anyone
    else, the signal does what it did before acquire()."""
    held = _current()
    note = _ended_note(held.holder, held._since) if held is not None else None
    if note is not None:
        raise Evicted(note)
    signal.signal(signal.SIGTERM, _previous_sigterm)
    os.kill(os.getpid(), signal.SIGTERM)


#: SIGTERM's handler before acquire() set ``_on_sigterm``.
_previous_sigterm = signal.SIG_DFL


def _tell_on_eviction():
    """Sets ``_on_sigterm`` where nobody else handles SIGTERM: in the main thread, over
    the default action only (a framework's own handler is left alone)."""
    global _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is signal.SIG_DFL:
        _previous_sigterm = current
        signal.signal(signal.SIGTERM, _on_sigterm)


def acquire(count=1, policy=None, memory=None, wait=None):
    """Holds ``count`` GPUs for this process until it ends (or ``release()``), and sets
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in ``os.environ``.

    ``policy``: a placement policy (``pack``, ``spread`` ...; the daemon's default when
    None). ``memory``: only GPUs with at least this much (``"40GiB"``, or bytes as an
    int). ``wait``: seconds to wait in the daemon's queue for GPUs to free up, with
    everyone else's requests (served round-robin by user unless the daemon's config says
    ``queue = "fifo"``); without it a busy machine refuses at once.

    A process holds one set at a time: asked again for the same (a notebook cell run
    again), acquire returns the holder it has, with an ``AlreadyHeld`` warning; asked for
    another, it raises Error saying how (``gpupin.release()`` first, or a new process
    once CUDA runs).

    Raises CudaInitialized if CUDA already runs in this process, Error with the daemon's
    one line if it refuses (a limit, too few GPUs, a wait that ran out), ValueError for
    a bad argument. Once it holds GPUs, a ``gpupin evict`` of this process raises
    ``Evicted`` wherever the process is, saying who ended it and why (where SIGTERM had
    no handler of its own; it is killed after the evict's grace if it goes on).
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("invalid count={!r}: expected a positive integer, such as 2".format(count))
    # What was asked, as acquire's arguments (``wait`` says how long, not what).
    asked = {"count": count}
    if policy is not None:
        asked["policy"] = policy
    if memory is not None:
        asked["memory"] = memory
    pairs = [["gpupin.count", str(count)]]
    if policy is not None:
        if not isinstance(policy, str) or not policy:
            raise ValueError("invalid policy={!r}: expected a policy name, such as \"pack\"".format(policy))
        pairs.append(["gpupin.policy", policy])
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, (int, str)) or memory == "":
            raise ValueError("invalid memory={!r}: expected a size, such as \"40GiB\", or bytes".format(memory))
        pairs.append(["gpupin.memory", str(memory)])
    waited = _duration("wait", wait) if wait is not None else None
    held = _current()
    if held is not None:
        return _again(held, asked)
    evidence = cuda_in_use()
    if evidence:
        raise CudaInitialized(
            "CUDA is already initialised in this process ({}): CUDA_VISIBLE_DEVICES would no longer count; call gpupin.acquire() before torch, tensorflow or cupy start CUDA".format(
                evidence
            )
        )
    timeout = REPLY_TIMEOUT
    if wait is not None:
        pairs.append(["gpupin.wait", waited])
        timeout += wait
    holder = "py-{}-{}".format(os.getpid(), secrets.token_hex(4))
    reply = _ask(
        {
            "op": "hold",
            "id": holder,
            "devices": "",
            "pid": os.getpid(),
            "request": pairs,
        },
        timeout=timeout,
    )
    gpus = [Gpu(g.get("index"), g.get("uuid")) for g in reply.get("gpus", [])]
    gpus.sort(key=lambda g: (g.index is None, g.index or 0))
    env = dict(reply.get("env") or [])
    if "CUDA_VISIBLE_DEVICES" not in env:
        # A daemon that gives no environment: indices in bus order, as gpupin exec's default.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(
            str(i) for i in sorted(g.index for g in gpus if g.index is not None)
        )
    previous = {key: os.environ.get(key) for key in _SET}
    for key in _SET:
        os.environ[key] = env[key]
    global _held
    _held = Allocation(reply.get("holder", holder), gpus, env, previous, asked)
    _tell_on_eviction()
    return _held
