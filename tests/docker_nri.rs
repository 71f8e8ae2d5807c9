//! `gpupin nri` against dockerd's NRI (experimental in Docker 29: moby v2.0.0-beta.24 from
//! the peers' cache, started with `--nri-opts enable=true,socket-path=...`). Run by hand,
//! gpupin nri allocated GPUs there and dockerd then refused the create (`unsupported
//! container adjustments: annotations,hooks,linux`): its NRI applies only env and mounts
//! from a plugin and sends no stop or remove. So gpupin nri refuses dockerd at Configure
//! with one line that says what to use instead, ends, and holds nothing; dockerd logs the
//! line and goes on without the plugin.
//!
//! dockerd's NRI is the modern generation's (`GPUPIN_ENGINES=modern`, as .ci/run runs
//! it); on Debian's dockerd, which has none, the test says so and passes without
//! running. Root and the dockerd peer are needed; elsewhere the test says why it skips
//! (under CI=true it fails instead).

use gpupin_sandbox::harness::Gpupin;
use gpupin_sandbox::harness::{self, engines};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// Not a timed assertion: the bound of each wait, so a daemon that never gets there fails
/// the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

/// A dockerd with NRI on at a socket in `dir`, killed when dropped.
struct Dockerd {
    child: Child,
}

impl Dockerd {
    fn start(dir: &Path) -> Dockerd {
        let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
        let nri = format!(
            "enable=true,socket-path={},plugin-path={},plugin-config-path={}",
            dir.join("nri.sock").display(),
            dir.join("nri-plugins").display(),
            dir.join("nri-conf").display()
        );
        let child = engines::command("dockerd")
            .arg("--data-root")
            .arg(dir.join("root"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .args(["--storage-driver", "vfs", "--bridge=none"])
            .args(["--iptables=false", "--ip6tables=false"])
            .arg("--nri-opts")
            .arg(nri)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting dockerd");
        Dockerd { child }
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        harness::terminate(&mut self.child, PATIENCE);
    }
}

#[test]
fn gpupin_nri_refuses_dockerds_nri_with_one_line_and_holds_nothing() {
    let test = "gpupin_nri_refuses_dockerds_nri_with_one_line_and_holds_nothing";
    if engines::generation() == engines::Generation::Debian {
        harness::say(&format!(
            "{test}: Debian's dockerd has no NRI; this runs on dockerd 29 (GPUPIN_ENGINES=modern)"
        ));
        return;
    }
    if harness::required(test, engines::check(&["dockerd"])).is_none() || !harness::need_root(test)
    {
        return;
    }
    let gpupin = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let dir = gpupin.dir.path().join("docker");
    std::fs::create_dir(&dir).unwrap();
    let dockerd = Dockerd::start(&dir);
    let socket = dir.join("nri.sock");
    let dockerd_log = || std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default();
    let started = Instant::now();
    while !socket.exists() {
        assert!(
            started.elapsed() < PATIENCE,
            "dockerd made no NRI socket at {}:\n{}",
            socket.display(),
            dockerd_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let errors = dir.join("gpupin-nri.err");
    let mut plugin = Command::new(harness::binary(GPUPIN))
        .arg("--config")
        .arg(&gpupin.config)
        .args(["nri", "--socket"])
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = plugin.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = plugin.kill();
            let _ = plugin.wait();
            panic!(
                "gpupin nri still serves dockerd; its stderr:\n{}",
                std::fs::read_to_string(&errors).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stderr = std::fs::read_to_string(&errors).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    let line = "gpupin: runtime \"docker\" is dockerd, whose NRI applies no device nodes, hooks or annotations from a plugin";
    assert!(stderr.starts_with(line), "{stderr}");
    assert!(stderr.contains("(gpupin install docker)"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // dockerd was told why, and goes on.
    let logged = dockerd_log();
    assert!(
        logged.contains("failed to configure plugin") && logged.contains("is dockerd, whose NRI"),
        "{logged}"
    );
    assert!(
        engines::command("docker")
            .arg("-H")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .arg("version")
            .output()
            .unwrap()
            .status
            .success()
    );
    assert_eq!(
        harness::status::holders(&gpupin.status()).len(),
        0,
        "nothing held"
    );
    drop(dockerd);
}
