//! JupyterHub with DockerSpawner, for real (issue 25 item 2): a real Hub (JupyterHub
//! 6.1.1, DockerSpawner 14.0.0, configurable-http-proxy 5.3.0, installed by
//! tests/jupyterhub/install into the peers' cache) spawns each user's server as a
//! container on the tests' private dockerd (docker_support), under a gpupin runtime slot,
//! with the request the shipped examples/jupyterhub/jupyterhub_config.py sets: labels
//! `gpupin.count=1` and `gpupin.user={raw_username}`, trusted by the slot's config
//! (`trusted_user_label = "gpupin.user"`, `[limits] max_gpus_per_user = 1`). The users
//! are real local users the test creates; the Hub authenticates them with its
//! DummyAuthenticator and is driven through its REST API with an admin service token.
//!
//! The single-user image: no registry is reachable, so the test imports one whose rootfs
//! is a handful of directories and the host's /usr symlinks (merged /usr), and mounts the
//! host's /usr and the JupyterHub venv read-only into each container through
//! DockerSpawner's `volumes`: a real `jupyterhub-singleuser` (jupyter-server) runs in it,
//! in seconds, where a debootstrap would take minutes. The tests' dockerd has no bridge,
//! so the servers share the host's network, each on a port of its own.
//!
//! Needs root, dockerd, docker, runc, useradd and the JupyterHub install; without them
//! the test prints why it is skipped, and fails under CI=true.

mod docker_support;
#[allow(dead_code)]
mod exec_support;

use docker_support::{Harness, Need, harness, ok, text, visible, write};
use exec_support::User;
use gpupin_sandbox::harness::{self as sandbox, toolkit::peers_cache};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a Hub, a server's spawn or a release may take before the test gives up: far
/// above what any needs (a spawn takes seconds), so that only a hang fails the test.
const DEADLINE: Duration = Duration::from_secs(240);
const IMAGE: &str = "gpupin-singleuser:jupyterhub-e2e";
const PINS: &str = include_str!("jupyterhub/requirements.txt");

/// Three users' servers get three distinct GPUs, each its user's in `gpupin status` and
/// in the container's NVIDIA_VISIBLE_DEVICES; a user's second (named) server is refused
/// by gpupin's limit, and the Hub shows gpupin's line, as it does for a Hub user who is
/// no user of the host; stopping a server through the Hub releases its GPU.
#[test]
fn jupyterhub_gives_each_users_server_its_own_gpu_within_the_users_limit() {
    let test = "jupyterhub_gives_each_users_server_its_own_gpu_within_the_users_limit";
    let Some(install) = sandbox::required(
        test,
        jupyterhub_install().and_then(|i| {
            merged_usr()?;
            for tool in ["useradd", "userdel", "node"] {
                if !exec_support::on_path(tool) {
                    return Err(format!("{tool} is not on PATH"));
                }
            }
            Ok(i)
        }),
    ) else {
        return;
    };
    let Some(h) = harness(test, Need::Docker) else {
        return;
    };
    let users: Vec<User> = ["jha", "jhb", "jhc"]
        .into_iter()
        .map(User::create)
        .collect();
    let slot = h.slot();
    slot.reset_config(None);
    let mut config = std::fs::read_to_string(&slot.config).unwrap();
    config.push_str("trusted_user_label = \"gpupin.user\"\n[limits]\nmax_gpus_per_user = 1\n");
    write(&slot.config, &config);
    import_singleuser_image(h);
    let names: Vec<&str> = users.iter().map(|u| u.name.as_str()).collect();
    // A Hub user with no account on the host (never created).
    let ghost = format!("gpt-jhg-{}", std::process::id());
    let hub_users: Vec<&str> = names.iter().copied().chain([ghost.as_str()]).collect();
    let hub = Hub::start(h, &install, &slot.runtime, &hub_users);

    // Three users' servers, started through the Hub's REST API as an admin would.
    for user in &names {
        let (code, body) = hub.api("POST", &format!("/users/{user}/server"));
        assert!(
            [201, 202].contains(&code),
            "starting {user}'s server: {code} {body}\n{}",
            hub.log_tail()
        );
    }
    let mut gpus = BTreeSet::new();
    for user in &names {
        let server = hub.until_ready(user);
        let id = server["state"]["object_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{user}'s server names no container: {server:#}"))
            .to_string();
        let status = slot.status();
        let holder = sandbox::status::holder(&status, &id)
            .unwrap_or_else(|| panic!("{user}'s container {id} holds nothing: {status:#}"));
        assert_eq!(holder["owner"]["user"], *user, "{holder:#}");
        let held: Vec<String> = holder["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap().to_string())
            .collect();
        assert_eq!(held.len(), 1, "{holder:#}");
        // What the notebook's process sees (its main process's environment: `docker
        // exec env` would show Docker's config, without gpupin's edit).
        let environ = ok(h.docker().args(["exec", &id, "cat", "/proc/1/environ"]));
        let env: Vec<String> = environ.split('\0').map(String::from).collect();
        assert_eq!(visible(&env), held, "{user}'s server");
        gpus.insert(held[0].clone());
    }
    assert_eq!(gpus.len(), 3, "three users, three distinct GPUs: {gpus:?}");

    // The first user's second server asks for a second GPU: gpupin refuses it at create
    // (limits.max_gpus_per_user = 1), and the Hub shows gpupin's line as the spawn's
    // failure, the message its spawn page shows the user.
    let first = names[0];
    let message = hub.spawn_failure(first, "second");
    let line = format!(
        "gpupin: {first} holds 1 GPU and {first} asks for 1 more; their limit is 1 (limits.max_gpus_per_user)"
    );
    assert!(
        message.contains(&line),
        "the Hub shows {message:?}, not gpupin's line {line:?}"
    );
    // A Hub user who is no user of this host: the trusted label names nobody gpupin
    // knows, and the server is refused rather than started as nobody's.
    let message = hub.spawn_failure(&ghost, "");
    let line = format!(
        "gpupin: label gpupin.user=\"{ghost}\" names no user of this host: expected a user name in /etc/passwd; fix the label, or add the user"
    );
    assert!(
        message.contains(&line),
        "the Hub shows {message:?}, not gpupin's line {line:?}"
    );
    let status = slot.status();
    assert_eq!(
        sandbox::status::holders(&status).len(),
        3,
        "a refused server holds nothing: {status:#}"
    );

    // Stopping a server through the Hub removes its container, which releases its GPU.
    let second = names[1];
    let gone = hub.server(second)["state"]["object_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, body) = hub.api("DELETE", &format!("/users/{second}/server"));
    assert!([202, 204].contains(&code), "{code} {body}");
    let freed = until("the stopped server's GPU is free", || {
        let status = slot.status();
        if sandbox::status::holder(&status, &gone).is_some() {
            return None;
        }
        Some(status)
    });
    assert_eq!(freed["free"], 6, "{freed:#}");
    let owners: BTreeSet<String> = sandbox::status::holders(&freed)
        .iter()
        .map(|r| r["owner"]["user"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        owners,
        BTreeSet::from([first.to_string(), names[2].to_string()]),
        "{freed:#}"
    );
    // Locals drop in reverse order: the Hub (stopping the other servers), then the users.
    drop(hub);
}

/// Polls `check` until it gives `Some`, panicking with `what` after `DEADLINE`.
#[track_caller]
fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(start.elapsed() < DEADLINE, "gave up waiting until {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// tests/jupyterhub/install's directory for the pinned JupyterHub, or why it is missing.
fn jupyterhub_install() -> Result<PathBuf, String> {
    let version = PINS
        .lines()
        .find_map(|l| l.strip_prefix("jupyterhub=="))
        .ok_or("tests/jupyterhub/requirements.txt pins no jupyterhub")?;
    let dir = peers_cache()?.join(format!("jupyterhub-{version}"));
    if !dir.join(".complete").is_file() {
        return Err(format!(
            "JupyterHub {version} is not installed in {}: run tests/jupyterhub/install",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The host's top-level links into /usr (/bin -> usr/bin ...), which the image repeats so
/// that the host's /usr, mounted into the container, is all it needs.
fn merged_usr() -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let mut links = Vec::new();
    for entry in std::fs::read_dir("/").map_err(|e| format!("reading /: {e}"))? {
        let path = entry.map_err(|e| format!("reading /: {e}"))?.path();
        if let Ok(target) = std::fs::read_link(&path)
            && target.starts_with("usr")
        {
            links.push((path, target));
        }
    }
    if !links.iter().any(|(p, _)| p == Path::new("/bin")) {
        return Err("/bin is not a link to usr/bin (no merged /usr): the test's single-user image borrows the host's /usr".into());
    }
    Ok(links)
}

/// Imports `IMAGE`: a rootfs of empty directories, /etc/passwd and the host's links into
/// /usr; each container gets the host's /usr (and the venv) mounted read-only.
fn import_singleuser_image(h: &Harness) {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    for sub in ["usr", "etc", "tmp", "root"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(rootfs.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    mode("tmp", 0o1777);
    mode("root", 0o700);
    for (link, target) in merged_usr().expect("checked before") {
        std::os::unix::fs::symlink(target, rootfs.join(link.strip_prefix("/").unwrap())).unwrap();
    }
    write(
        &rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    );
    write(&rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n");
    let tar = dir.path().join("rootfs.tar");
    ok(Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    ok(h.docker()
        .args(["import", "-c", "ENV PATH=/usr/local/bin:/usr/bin:/bin"])
        .arg(&tar)
        .arg(IMAGE));
}

/// A free TCP port on 127.0.0.1 (bound, read, let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The JupyterHub process (and its proxy, in its process group), stopped on drop.
struct Hub {
    child: Child,
    dir: tempfile::TempDir,
    api_port: u16,
    token: String,
}

impl Hub {
    /// Writes the test's jupyterhub_config.py, which loads the shipped snippet as it is
    /// and then adapts the Hub to this machine, and starts the Hub.
    fn start(h: &Harness, install: &Path, runtime: &str, users: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/jupyterhub/jupyterhub_config.py");
        let token = format!("{:032x}", rand_u128());
        let api_port = free_port();
        let quote = |p: &Path| format!("{:?}", p.display().to_string());
        let names: Vec<String> = users.iter().map(|u| format!("{u:?}")).collect();
        let config = HUB_CONFIG
            .replace("@EXAMPLE@", &quote(&example))
            .replace("@RUNTIME@", &format!("{runtime:?}"))
            .replace("@IMAGE@", &format!("{IMAGE:?}"))
            .replace("@INSTALL@", &quote(install))
            .replace("@DIR@", &quote(dir.path()))
            .replace("@PROXY_PORT@", &free_port().to_string())
            .replace("@PROXY_API_PORT@", &free_port().to_string())
            .replace("@HUB_PORT@", &api_port.to_string())
            .replace("@TOKEN@", &format!("{token:?}"))
            .replace("@USERS@", &names.join(", "));
        let file = dir.path().join("jupyterhub_config.py");
        write(&file, &config);
        let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
        let child = Command::new(install.join("venv/bin/jupyterhub"))
            .arg("-f")
            .arg(&file)
            .current_dir(dir.path())
            .env("DOCKER_HOST", &h.host)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("starting jupyterhub");
        let mut hub = Hub {
            child,
            dir,
            api_port,
            token,
        };
        let start = Instant::now();
        loop {
            if TcpStream::connect(("127.0.0.1", api_port)).is_ok() && hub.api("GET", "/").0 == 200 {
                return hub;
            }
            let exited = hub.child.try_wait().unwrap();
            assert!(
                exited.is_none() && start.elapsed() < DEADLINE,
                "the Hub did not come up ({exited:?}):\n{}",
                hub.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `METHOD /hub/api<path>` with the admin token: the status code and the body.
    /// HTTP/1.0, so that the Hub answers without chunks and closes the connection when
    /// done (the progress stream too).
    fn api(&self, method: &str, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.api_port))
            .unwrap_or_else(|e| panic!("connecting to the Hub: {e}"));
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        write!(
            stream,
            "{method} /hub/api{path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAuthorization: token {}\r\nContent-Length: 0\r\n\r\n",
            self.api_port, self.token
        )
        .unwrap();
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", self.log_tail()));
        let response = text(&response);
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{method} {path}: no status in {head:?}"));
        (code, body.to_string())
    }

    /// Starts `user`'s server `name` ("" for the default one), which must fail; the
    /// message the Hub gives for it. A spawn that fails within the Hub's
    /// slow_spawn_timeout fails the POST with the spawner's own exception, which JupyterHub
    /// 6.1.1 lets through as a bare 500, so the message is read where the Hub's spawn page
    /// reads it: the server's progress events.
    fn spawn_failure(&self, user: &str, name: &str) -> String {
        let server = match name {
            "" => format!("/users/{user}/server"),
            name => format!("/users/{user}/servers/{name}"),
        };
        let (code, body) = self.api("POST", &server);
        assert!(!(200..300).contains(&code), "{server}: {code} {body}");
        let (code, events) = self.api("GET", &format!("{server}/progress"));
        assert_eq!(code, 200, "{events}");
        let failed = events
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .find(|e| e["failed"] == true)
            .unwrap_or_else(|| panic!("no failed event in {server}'s progress: {events}"));
        let message = failed["message"].as_str().unwrap().to_string();
        assert!(message.starts_with("Spawn failed: "), "{message}");
        message
    }

    /// The user's default server, as the Hub's API shows it.
    fn server(&self, user: &str) -> Value {
        let (code, body) = self.api("GET", &format!("/users/{user}"));
        assert_eq!(code, 200, "{body}");
        let model: Value = serde_json::from_str(&body).unwrap();
        model["servers"][""].clone()
    }

    /// Waits until the user's default server is ready; the server's model.
    fn until_ready(&self, user: &str) -> Value {
        let start = Instant::now();
        loop {
            let server = self.server(user);
            if server["ready"] == true {
                return server;
            }
            assert!(
                start.elapsed() < DEADLINE && !server.is_null(),
                "{user}'s server did not become ready: {server:#}\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The Hub's log, its last lines (for failure messages).
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("hub.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "the Hub's log, last lines:\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        )
    }
}

impl Drop for Hub {
    /// SIGTERM: the Hub stops its users' servers (cleanup_servers) and its proxy; what is
    /// left of the group after that is killed.
    fn drop(&mut self) {
        let group = -(self.child.id() as i32);
        // SAFETY: plain kill(2) on the process group of our own child.
        unsafe { libc::kill(group, libc::SIGTERM) };
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && start.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn rand_u128() -> u128 {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    u128::from_ne_bytes(bytes)
}

/// The test's jupyterhub_config.py: the shipped snippet, then what this machine needs.
const HUB_CONFIG: &str = r#"c = get_config()  # noqa: F821

# The shipped snippet as it is: DockerSpawner, runtime gpupin, labels gpupin.count=1 and
# gpupin.user={raw_username}, remove=True, named servers.
load_subconfig(@EXAMPLE@)  # noqa: F821

from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port


class HostNetworkSpawner(DockerSpawner):
    """The tests' dockerd has no bridge: each server shares the host's network, on a port
    of its own, and the Hub reaches it on 127.0.0.1."""

    async def start(self):
        self.port = random_port()
        return await super().start()

    async def get_ip_and_port(self):
        return "127.0.0.1", self.port


c.JupyterHub.spawner_class = HostNetworkSpawner
c.DockerSpawner.network_name = "host"
c.DockerSpawner.use_internal_ip = True
# The tests' gpupin runtime slot, instead of `gpupin` (the snippet's labels stay).
c.DockerSpawner.extra_host_config = {"runtime": @RUNTIME@}
c.DockerSpawner.image = @IMAGE@
c.DockerSpawner.pull_policy = "never"
# The image is the host's /usr and the venv, read-only.
c.DockerSpawner.volumes = {
    "/usr": {"bind": "/usr", "mode": "ro"},
    @INSTALL@: {"bind": @INSTALL@, "mode": "ro"},
}
c.DockerSpawner.cmd = [@INSTALL@ + "/venv/bin/jupyterhub-singleuser"]
# The image has only root; a real one runs the server as its own user.
c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 240
c.Spawner.http_timeout = 240

c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = @PROXY_PORT@
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = @HUB_PORT@
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:@PROXY_API_PORT@"
c.ConfigurableHTTPProxy.command = [@INSTALL@ + "/node_modules/.bin/configurable-http-proxy"]
c.ConfigurableHTTPProxy.pid_file = @DIR@ + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + @DIR@ + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = @DIR@ + "/jupyterhub_cookie_secret"

# The test's local users, with a password only the test knows; the test itself drives
# the Hub as an admin service.
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = @TOKEN@
c.Authenticator.allowed_users = {@USERS@}
c.JupyterHub.services = [{"name": "gpupin-test", "api_token": @TOKEN@}]
c.JupyterHub.load_roles = [
    {
        "name": "gpupin-test",
        "scopes": ["admin:users", "admin:servers"],
        "services": ["gpupin-test"],
    }
]
"#;
