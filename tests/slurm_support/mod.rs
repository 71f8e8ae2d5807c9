//! A private single-node Slurm for the tests: munged, slurmctld and slurmd as Debian
//! ships them (slurm-wlm 22.05, munge), run in the foreground from a temp dir with their
//! own munge key and socket, ports, state and spool, and gpupin's shipped prolog and
//! epilog (slurm/). The node's GPUs are fake device nodes (mknod c 195 N) named like the
//! real ones, listed in gres.conf in an order that is not their numbers' order.
//!
//! Every daemon is stopped when the `Cluster` drops; every client command runs under
//! `timeout`, and every wait has a deadline.

use gpupin_sandbox::harness::{self, Gpupin};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The longest a Slurm command may run, and a state change may take: far above what a
/// single node needs, so that only a hang fails a test.
const DEADLINE: Duration = Duration::from_secs(60);

/// The node's name, which slurmd is told (`-N`): not the host's, so that gpupin's prolog
/// must take it from `SLURMD_NODENAME` to find the node's lines in gres.conf.
pub const NODE: &str = "gpupin-node";

/// The device minors Slurm's GPUs 0, 1, 2, 3 have: gres.conf lists /dev/nvidia6 first,
/// then nvidia2, nvidia3 and nvidia7. GPUs 0, 1, 4 and 5 are not Slurm's at all.
pub const GRES_MINORS: [u32; 4] = [6, 2, 3, 7];

const PROGRAMS: [&str; 7] = [
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "sinfo",
];

/// What the tests need: root (the daemons and mknod) and Slurm's and munge's programs.
pub fn requirements(test: &str) -> bool {
    if !harness::need_root(test) {
        return false;
    }
    let missing: Vec<&str> = PROGRAMS
        .into_iter()
        .filter(|p| gpupin_sandbox::find_on_path(p).is_none())
        .collect();
    let found = match missing.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{} not found (apt-get install slurm-wlm munge)",
            missing.join(", ")
        )),
    };
    harness::required(test, found).is_some()
}

/// One running munged, slurmctld and slurmd.
pub struct Cluster {
    pub dir: PathBuf,
    pub conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
}

impl Cluster {
    /// Starts the cluster in a new directory inside `g`'s temp dir, its prolog and epilog
    /// calling `g`'s gpupin with `g`'s config and `prolog_env` besides; returns once the
    /// node is idle.
    pub fn start(g: &Gpupin, prolog_env: &[(&str, &str)]) -> Cluster {
        let dir = g.dir.path().join("slurm");
        for sub in ["etc", "key", "munge", "state", "spool", "log", "dev"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // Users submit jobs too: they need the config and munge's socket, not the key.
        for open in [g.dir.path(), &dir, &dir.join("etc"), &dir.join("munge")] {
            chmod(open, 0o755);
        }
        chmod(&dir.join("key"), 0o700);
        for minor in 0..8 {
            let node = dir.join("dev").join(format!("nvidia{minor}"));
            let dev = rustix::fs::makedev(harness::GPU_MAJOR, minor);
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &node,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                dev,
            )
            .unwrap_or_else(|e| panic!("mknod {}: {e}", node.display()));
        }
        let mut cluster = Cluster {
            conf: dir.join("etc/slurm.conf"),
            dir,
            daemons: Vec::new(),
        };
        cluster.write_config(g, prolog_env);
        cluster.start_daemons();
        cluster
    }

    fn write_config(&self, g: &Gpupin, prolog_env: &[(&str, &str)]) {
        let d = &self.dir;
        let host = gpupin::parts::short_hostname().unwrap();
        let [ctld_port, slurmd_port] = free_ports();
        let slurm_conf = format!(
            "ClusterName=gpupin
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={d}/munge/socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
GresTypes=gpu
PrologFlags=Alloc
Prolog={d}/etc/prolog
Epilog={d}/etc/epilog
TaskProlog={d}/etc/task-prolog
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=1 Gres=gpu:4 State=UNKNOWN
PartitionName=test Nodes={NODE} Default=YES MaxTime=5 State=UP
",
            d = d.display()
        );
        write(&self.conf, &slurm_conf, 0o644);
        let dev = d.join("dev");
        let dev = dev.display();
        // Another node's line first: only this node's lines count, in their order.
        let gres = format!(
            "AutoDetect=off
NodeName=other[1-3] Name=gpu File={dev}/nvidia[0-3]
NodeName={NODE} Name=gpu File={dev}/nvidia6
NodeName={NODE} Name=gpu File={dev}/nvidia[2-3],{dev}/nvidia7
"
        );
        write(&d.join("etc/gres.conf"), &gres, 0o644);
        // slurmd runs prologs with almost no environment; a site sets gpupin's in a
        // wrapper like this one (or in the script itself).
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm");
        let mut exports = format!(
            "export GPUPIN={:?}\nexport GPUPIN_CONFIG={:?}\n",
            g.bin.display().to_string(),
            g.config.display().to_string()
        );
        for (k, v) in prolog_env {
            exports.push_str(&format!("export {k}={v:?}\n"));
        }
        for script in ["prolog", "epilog", "task-prolog"] {
            let wrapper = format!(
                "#!/bin/sh\n{exports}exec {:?}\n",
                shipped.join(script).display().to_string()
            );
            write(&d.join("etc").join(script), &wrapper, 0o755);
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        std::fs::write(d.join("key/munge.key"), key).unwrap();
        chmod(&d.join("key/munge.key"), 0o600);
    }

    fn start_daemons(&mut self) {
        let d = self.dir.clone();
        let socket = d.join("munge/socket");
        let mut munged = Command::new(program("munged"));
        munged
            .arg("--foreground")
            .arg("--force")
            .arg(format!("--key-file={}", d.join("key/munge.key").display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!(
                "--pid-file={}",
                d.join("munge/munged.pid").display()
            ))
            .arg(format!("--seed-file={}", d.join("munge/seed").display()))
            .arg(format!("--log-file={}", d.join("log/munged.log").display()));
        self.spawn("munged", &mut munged);
        self.until("munged listens", || socket.exists().then_some(()));
        let mut ctld = self.command("slurmctld");
        ctld.args(["-D", "-i"]);
        self.spawn("slurmctld", &mut ctld);
        let mut slurmd = self.command("slurmd");
        slurmd.args(["-D", "-N", NODE]);
        self.spawn("slurmd", &mut slurmd);
        self.until("the node is idle", || {
            let out = self.run(None, "sinfo", &["-h", "-n", NODE, "-o", "%T"]);
            (harness::stdout(&out).trim() == "idle").then_some(())
        });
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.join("log").join(format!("{name}.out"))).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        self.daemons.push((name, child));
    }

    /// `name` (a Slurm program, or `timeout`) with this cluster's config.
    pub fn command(&self, name: &str) -> Command {
        let mut cmd = Command::new(program(name));
        cmd.env("SLURM_CONF", &self.conf)
            .env_remove("SLURM_JOB_ID")
            .env_remove("GPUPIN_CONFIG");
        cmd
    }

    /// Runs a Slurm client command to its end (or `DEADLINE`), as root or as `uid`.
    pub fn run(&self, uid: Option<(u32, u32)>, name: &str, args: &[&str]) -> Output {
        let mut cmd = self.command("timeout");
        cmd.arg(DEADLINE.as_secs().to_string())
            .arg(program(name))
            .args(args)
            .stdin(Stdio::null());
        if let Some((uid, gid)) = uid {
            cmd.uid(uid).gid(gid);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("running {name}: {e}"))
    }

    /// `sbatch --gres=GRES SCRIPT` as root or `uid`; the job's id.
    pub fn sbatch(&self, uid: Option<(u32, u32)>, gres: &str, script: &Path) -> u32 {
        let out_file = script.with_extension("out");
        let args = [
            "--parsable",
            &format!("--gres={gres}"),
            "-o",
            out_file.to_str().unwrap(),
            script.to_str().unwrap(),
        ];
        let out = self.run(uid, "sbatch", &args);
        assert!(out.status.success(), "sbatch: {}", harness::stderr(&out));
        harness::stdout(&out)
            .trim()
            .parse()
            .expect("sbatch --parsable prints the job id")
    }

    /// `scontrol show job ID` (or `node`) as one line of `Key=Value` words.
    pub fn show(&self, what: &str, id: &str) -> String {
        let out = self.run(None, "scontrol", &["-o", "show", what, id]);
        harness::stdout(&out)
    }

    /// What slurmd logged so far (prolog failures among it).
    pub fn slurmd_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log/slurmd.log")).unwrap_or_default()
    }

    #[track_caller]
    pub fn until<T>(&self, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let start = Instant::now();
        loop {
            if let Some(found) = check() {
                return found;
            }
            if start.elapsed() > DEADLINE {
                panic!(
                    "gave up waiting until {what}; slurmd's log:\n{}",
                    self.slurmd_log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // slurmd first, so that it does not wait for a controller that is gone.
        for (name, child) in self.daemons.iter_mut().rev() {
            let pid = rustix::process::Pid::from_child(child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            if matches!(child.try_wait(), Ok(None)) {
                harness::say(&format!("{name} did not end on TERM: killed"));
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        if std::thread::panicking() {
            harness::say(&format!("slurmd's log:\n{}", self.slurmd_log()));
        }
    }
}

/// Where `name` is: on PATH, or in an sbin directory a non-login root shell may lack
/// from PATH (munged, slurmctld and slurmd are in /usr/sbin).
fn program(name: &str) -> PathBuf {
    gpupin_sandbox::find_on_path(name).unwrap_or_else(|| PathBuf::from(name))
}

/// Two TCP ports nothing listens on now (both held while asking, so they differ).
fn free_ports() -> [u16; 2] {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, b) = (bind(), bind());
    [a, b].map(|l| l.local_addr().unwrap().port())
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    chmod(path, mode);
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
