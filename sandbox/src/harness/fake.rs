//! Stand-ins for containers where the test needs no runc: a live process, or what runc's
//! init is at prestart (own mount namespace and device cgroup).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the cgroup v1 devices controller is mounted.
pub const DEVICES_CGROUP: &str = "/sys/fs/cgroup/devices";

/// What runc's init is at prestart: a process in its own mount namespace, with a tmpfs on
/// `<rootfs>/dev` the host does not see, in its own cgroup v1 device cgroup that denies
/// every device until the hook allows some. Killed, and its cgroup removed, when dropped.
pub struct FakeContainer {
    child: Child,
    pub pid: i32,
    pub cgroup: PathBuf,
    rootfs: PathBuf,
    dead: bool,
}

impl FakeContainer {
    /// Starts one on `rootfs`; `cgroup`: the device cgroup it will get (`settle`), under
    /// `DEVICES_CGROUP`, named uniquely since cgroups are global to the machine.
    pub fn spawn(rootfs: &Path, cgroup: PathBuf) -> FakeContainer {
        use std::os::unix::process::CommandExt;
        let script = "mount -t tmpfs -o mode=755 tmpfs \"$0/dev\" && exec sleep 600";
        let mut cmd = Command::new("unshare");
        cmd.args(["-m", "--propagation", "private", "sh", "-c", script])
            .arg(rootfs)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe. A test runner killed outright (a CI timeout)
        // takes its containers with it instead of leaving them asleep for ten minutes;
        // the signal follows the spawning thread, which is the test's own, alive as long
        // as the container is.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        FakeContainer {
            pid: child.id() as i32,
            child,
            cgroup,
            rootfs: rootfs.to_path_buf(),
            dead: false,
        }
    }

    /// Waits until its /dev is mounted, then moves it into its own device cgroup.
    pub fn settle(&mut self) -> Result<(), String> {
        let mountinfo = format!("/proc/{}/mountinfo", self.pid);
        let dev = format!(" {}/dev ", self.rootfs.display());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !fs::read_to_string(&mountinfo).is_ok_and(|m| m.contains(&dev)) {
            if Instant::now() > deadline {
                return Err(format!(
                    "fake container {} never mounted its /dev",
                    self.pid
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        fs::create_dir(&self.cgroup).map_err(|e| format!("{}: {e}", self.cgroup.display()))?;
        // As runc does: deny everything, so that what the hook allows is what the list shows.
        fs::write(self.cgroup.join("devices.deny"), "a").map_err(|e| e.to_string())?;
        fs::write(self.cgroup.join("cgroup.procs"), self.pid.to_string()).map_err(|e| e.to_string())
    }

    /// SIGKILL, and reaped, so its pid is gone from /proc.
    pub fn kill(&mut self) {
        if !self.dead {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.dead = true;
        }
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Names under its /dev, read through its own mount namespace (/proc/PID/root).
    pub fn dev_entries(&self) -> BTreeSet<String> {
        let dev = Path::new(&format!("/proc/{}/root", self.pid))
            .join(self.rootfs.strip_prefix("/").unwrap())
            .join("dev");
        fs::read_dir(&dev)
            .unwrap_or_else(|e| panic!("{}: {e}", dev.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Its device cgroup's allow list, as the kernel reports it.
    pub fn devices_list(&self) -> BTreeSet<String> {
        fs::read_to_string(self.cgroup.join("devices.list"))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        self.kill();
        // The cgroup empties once its task is reaped; the kernel may lag a moment.
        for _ in 0..50 {
            match fs::remove_dir(&self.cgroup) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
}

/// A live process to stand in for a holder or a container's init. Killed when dropped.
pub struct Sleeper(Child);

impl Sleeper {
    pub fn start() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("1000")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
