//! Confinement against the real kernel, as root: fake GPU nodes (`mknod c 195 M` in a
//! temp dir; with no NVIDIA driver an allowed node opens with ENXIO, "No such device or
//! address", and a denied one with EPERM), and a child shell that waits on stdin while it
//! is confined, then tries to open them. Cgroup names carry the test's name and our pid,
//! so that parallel tests and parallel test runs never share one.

use super::*;
use gpupin_sandbox::harness::{need_root, required};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// The rules for a job holding `own` among the machine's GPU minors `machine`.
fn all_but(gpu_major: u32, machine: impl IntoIterator<Item = u32>, own: &[u32]) -> DeviceRules {
    DeviceRules::deny(gpu_major, machine.into_iter().filter(|m| !own.contains(m)))
}

const MAJOR: u32 = 195;
const ALLOWED: &str = "No such device or address";
const DENIED: &str = "Operation not permitted";

/// A temp dir with nvidia1 (the job's own GPU) and nvidia3 (another holder's).
fn fake_nodes() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for minor in [1, 3] {
        let path = tmp.path().join(format!("nvidia{minor}"));
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(MAJOR, minor),
        )
        .unwrap();
    }
    tmp
}

fn deny_3() -> DeviceRules {
    all_but(MAJOR, [1, 3], &[1])
}

fn unique(test: &str) -> String {
    format!("{test}-{}", std::process::id())
}

/// A pidfd of process `pid`.
fn pidfd_of(pid: i32) -> OwnedFd {
    let pid = rustix::process::Pid::from_raw(pid).unwrap();
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap()
}

/// A shell blocked on `read go` that then opens nvidia1 and nvidia3; killed if a test
/// fails before it finishes.
struct Job(Option<Child>, Option<OwnedFd>);

impl Job {
    fn spawn(nodes: &Path) -> Job {
        Self::spawn_with(nodes, |_| {})
    }

    fn spawn_with(nodes: &Path, setup: impl FnOnce(&mut Command)) -> Job {
        let script = r#"read go; cat "$0/nvidia1"; cat "$0/nvidia3""#;
        Self::spawn_script(nodes, script, setup)
    }

    fn spawn_script(nodes: &Path, script: &str, setup: impl FnOnce(&mut Command)) -> Job {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script])
            .arg(nodes)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        setup(&mut cmd);
        let child = cmd.spawn().unwrap();
        let fd = pidfd_of(child.id() as i32);
        Job(Some(child), Some(fd))
    }

    fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.1.as_ref().unwrap().as_fd()
    }

    /// Its `/proc/<pid>/cgroup` line for `hierarchy` ("devices", or "" for cgroup2).
    fn cgroup(&self, hierarchy: &str) -> String {
        let text = std::fs::read_to_string(format!("/proc/{}/cgroup", self.pid())).unwrap();
        let line = text.lines().find(|line| {
            let controllers = line.split(':').nth(1).unwrap_or_default();
            match hierarchy {
                "" => line.starts_with("0::"),
                h => controllers.split(',').any(|c| c == h),
            }
        });
        line.unwrap_or_default().to_owned()
    }

    /// Lets it go; its stderr once it exited.
    fn finish(mut self) -> String {
        let mut child = self.0.take().unwrap();
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The line of a `cat` error about `node` in a job's stderr.
fn opening<'a>(stderr: &'a str, node: &str) -> &'a str {
    let line = stderr.lines().find(|l| l.contains(&format!("/{node}:")));
    line.unwrap_or_else(|| panic!("no line about {node} in {stderr:?}"))
}

fn assert_confined(stderr: &str) {
    assert!(opening(stderr, "nvidia1").ends_with(ALLOWED), "{stderr}");
    assert!(opening(stderr, "nvidia3").ends_with(DENIED), "{stderr}");
}

/// Whether `test` can run here: root, and `mode`'s hierarchies mounted (else skipped, or
/// failed under CI=true).
fn ready(test: &str, mode: Confine) -> bool {
    if !need_root(test) {
        return false;
    }
    let me = std::process::id() as i32;
    let found = hierarchy::parents(Path::new("/proc"), me, mode)
        .map(drop)
        .map_err(|e| e.to_string());
    required(test, found).is_some()
}

/// `confine`, where a bpf(2) that this machine refuses to us (no BPF syscall, a seccomp
/// filter, a container) skips the test, or fails it under CI; any other error fails it,
/// a program the verifier rejects (EINVAL) first of all.
fn confined(test: &str, job: &Job, mode: Confine, rules: &DeviceRules) -> Option<JobCgroup> {
    match confine(job.pid(), job.fd(), &unique(test), mode, rules) {
        Err(err @ (ConfineError::BpfLoad { .. } | ConfineError::BpfAttach { .. }))
            if refused(&err) =>
        {
            required(test, Err(err.to_string()))
        }
        other => Some(other.unwrap().expect("a mode other than Off confines")),
    }
}

fn refused(err: &ConfineError) -> bool {
    let (ConfineError::BpfLoad { error, .. } | ConfineError::BpfAttach { error, .. }) = err else {
        return false;
    };
    matches!(error.raw_os_error(), Some(libc::EPERM | libc::ENOSYS))
}

#[test]
fn an_unconfined_job_opens_both_nodes_with_enxio() {
    if !need_root("an_unconfined_job_opens_both_nodes_with_enxio") {
        return;
    }
    let nodes = fake_nodes();
    let stderr = Job::spawn(nodes.path()).finish();
    assert!(opening(&stderr, "nvidia1").ends_with(ALLOWED), "{stderr}");
    assert!(opening(&stderr, "nvidia3").ends_with(ALLOWED), "{stderr}");
}

fn check_one_mechanism(test: &str, mode: Confine, hierarchy: &str) {
    if !ready(test, mode) {
        return;
    }
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let Some(cgroup) = confined(test, &job, mode, &deny_3()) else {
        return;
    };
    let line = job.cgroup(hierarchy);
    assert!(
        line.ends_with(&format!("/gpupin-{}", unique(test))),
        "{line}"
    );
    assert_eq!(cgroup.dirs().len(), 1);
    assert_confined(&job.finish());
    cgroup.remove().unwrap();
}

#[test]
fn v1_denies_the_other_gpu_and_lets_its_own_open() {
    let test = "v1_denies_the_other_gpu_and_lets_its_own_open";
    check_one_mechanism(test, Confine::V1, "devices");
}

#[test]
fn v2_bpf_denies_the_other_gpu_and_lets_its_own_open() {
    let test = "v2_bpf_denies_the_other_gpu_and_lets_its_own_open";
    check_one_mechanism(test, Confine::V2, "");
}

#[test]
fn auto_uses_every_mechanism_of_the_machine() {
    let test = "auto_uses_every_mechanism_of_the_machine";
    if !ready(test, Confine::Auto) {
        return;
    }
    let me = std::process::id() as i32;
    let here = hierarchy::parents(Path::new("/proc"), me, Confine::Auto).unwrap();
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let Some(cgroup) = confined(test, &job, Confine::Auto, &deny_3()) else {
        return;
    };
    let expected: Vec<_> = here.iter().map(|p| p.mechanism).collect();
    assert_eq!(cgroup.mechanisms(), expected);
    assert_confined(&job.finish());
    cgroup.remove().unwrap();
}

#[test]
fn off_leaves_the_job_where_it_was() {
    if !need_root("off_leaves_the_job_where_it_was") {
        return;
    }
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let before = std::fs::read_to_string(format!("/proc/{}/cgroup", job.pid())).unwrap();
    let name = unique("off_leaves_the_job_where_it_was");
    assert_eq!(
        confine(job.pid(), job.fd(), &name, Confine::Off, &deny_3()).unwrap(),
        None
    );
    let after = std::fs::read_to_string(format!("/proc/{}/cgroup", job.pid())).unwrap();
    assert_eq!(before, after);
    let stderr = job.finish();
    assert!(opening(&stderr, "nvidia3").ends_with(ALLOWED), "{stderr}");
}

#[test]
fn the_cgroups_go_once_the_job_has_exited() {
    let test = "the_cgroups_go_once_the_job_has_exited";
    if !ready(test, Confine::Auto) {
        return;
    }
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let Some(cgroup) = confined(test, &job, Confine::Auto, &deny_3()) else {
        return;
    };
    let err = cgroup.remove().unwrap_err();
    assert!(matches!(err, ConfineError::Remove { .. }), "{err}");
    assert!(
        cgroup.dirs().iter().all(|d| d.is_dir()),
        "kept while in use"
    );
    job.finish();
    cgroup.remove().unwrap();
    assert!(cgroup.dirs().iter().all(|d| !d.exists()), "{cgroup:?}");
    cgroup.remove().unwrap();
}

/// The parent of a job cgroup for `mode`: our own cgroup there, as the job's.
fn our_parent(mode: Confine) -> PathBuf {
    let me = std::process::id() as i32;
    let parents = hierarchy::parents(Path::new("/proc"), me, mode).unwrap();
    parents[0].dir.clone()
}

#[test]
fn an_empty_leftover_is_made_anew_without_its_old_rules() {
    let test = "an_empty_leftover_is_made_anew_without_its_old_rules";
    if !ready(test, Confine::V1) {
        return;
    }
    let leftover = our_parent(Confine::V1).join(format!("gpupin-{}", unique(test)));
    std::fs::create_dir(&leftover).unwrap();
    dir::write(&leftover, "devices.deny", "c 195:1 rwm").unwrap();
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let Some(cgroup) = confined(test, &job, Confine::V1, &deny_3()) else {
        return;
    };
    assert_eq!(cgroup.dirs(), [leftover]);
    assert_confined(&job.finish());
    cgroup.remove().unwrap();
}

#[test]
fn a_leftover_with_a_process_in_it_is_refused() {
    let test = "a_leftover_with_a_process_in_it_is_refused";
    if !ready(test, Confine::V1) {
        return;
    }
    let leftover = our_parent(Confine::V1).join(format!("gpupin-{}", unique(test)));
    std::fs::create_dir(&leftover).unwrap();
    let nodes = fake_nodes();
    let squatter = Job::spawn(nodes.path());
    dir::move_pid(&leftover, squatter.pid()).unwrap();
    let job = Job::spawn(nodes.path());
    let before = job.cgroup("devices");
    let err = confine(job.pid(), job.fd(), &unique(test), Confine::V1, &deny_3()).unwrap_err();
    assert!(
        matches!(err, ConfineError::InUse { ref path } if *path == leftover),
        "{err}"
    );
    assert!(err.to_string().contains(&leftover.display().to_string()));
    assert_eq!(job.cgroup("devices"), before);
    job.finish();
    squatter.finish();
    dir::remove(&leftover).unwrap();
}

/// A default-deny v1 cgroup (as in a container) allowing `allowed`, removed on drop.
struct DenyingParent(PathBuf);

impl DenyingParent {
    fn new(test: &str, allowed: &[&str]) -> DenyingParent {
        let dir = our_parent(Confine::V1).join(format!("parent-{}", unique(test)));
        std::fs::create_dir(&dir).unwrap();
        let parent = DenyingParent(dir);
        dir::write(&parent.0, "devices.deny", "a").unwrap();
        for rule in allowed {
            dir::write(&parent.0, "devices.allow", rule).unwrap();
        }
        parent
    }
}

impl Drop for DenyingParent {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn v1_under_a_default_deny_parent_narrows_its_wildcard() {
    let test = "v1_under_a_default_deny_parent_narrows_its_wildcard";
    if !ready(test, Confine::V1) {
        return;
    }
    let parent = DenyingParent::new(test, &["c 195:* rw", "c 1:3 rwm"]);
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    dir::move_pid(&parent.0, job.pid()).unwrap();
    let cgroup = confine(job.pid(), job.fd(), &unique(test), Confine::V1, &deny_3())
        .unwrap()
        .unwrap();
    let list = std::fs::read_to_string(cgroup.dirs()[0].join("devices.list")).unwrap();
    assert!(list.lines().any(|l| l == "c 195:255 rw"), "{list}");
    assert!(list.lines().any(|l| l == "c 1:3 rwm"), "{list}");
    assert!(!list.lines().any(|l| l.starts_with("c 195:3 ")), "{list}");
    assert!(!list.contains("195:*"), "{list}");
    assert_confined(&job.finish());
    cgroup.remove().unwrap();
}

#[test]
fn v1_rules_that_cannot_take_are_an_error_and_undone() {
    let test = "v1_rules_that_cannot_take_are_an_error_and_undone";
    if !ready(test, Confine::V1) {
        return;
    }
    // A wildcard over every major: gpupin cannot narrow it to "all but c 195:3".
    let parent = DenyingParent::new(test, &["c *:* rwm"]);
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    dir::move_pid(&parent.0, job.pid()).unwrap();
    let before = job.cgroup("devices");
    let err = confine(job.pid(), job.fd(), &unique(test), Confine::V1, &deny_3()).unwrap_err();
    assert!(
        matches!(err, ConfineError::RuleNotTaken { minor: 3, ref entry, .. } if entry == "c *:* rwm"),
        "{err}"
    );
    assert_eq!(job.cgroup("devices"), before);
    assert!(!parent.0.join(format!("gpupin-{}", unique(test))).exists());
    job.finish();
}

#[test]
fn a_job_without_the_dropped_capabilities_cannot_mknod_around_its_rules() {
    let test = "a_job_without_the_dropped_capabilities_cannot_mknod_around_its_rules";
    if !need_root(test) {
        return;
    }
    require_caps().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let script = r#"grep -E '^Cap(Inh|Prm|Eff|Bnd)' /proc/self/status >&2; mknod "$0/x" c 195 3"#;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]).arg(tmp.path());
    // SAFETY: drop_job_caps only makes syscalls and small allocations (glibc's malloc is
    // fork-safe); it touches no lock the harness's other threads could hold.
    unsafe { cmd.pre_exec(drop_job_caps) };
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (sys_admin, mknod) = (1u64 << 21, 1u64 << 27);
    let sets: Vec<u64> = stderr
        .lines()
        .filter_map(|l| l.split_once(":\t"))
        .map(|(_, hex)| u64::from_str_radix(hex.trim(), 16).unwrap())
        .collect();
    assert_eq!(sets.len(), 4, "{stderr}");
    assert!(
        sets.iter().all(|s| s & (sys_admin | mknod) == 0),
        "{stderr}"
    );
    assert!(sets[3] & (1 << 0) != 0, "other capabilities stay: {stderr}");
    assert!(!out.status.success());
    assert!(stderr.contains(DENIED), "{stderr}");
    assert!(!tmp.path().join("x").exists());
}

#[test]
fn modes_parse_from_their_config_words() {
    let parse = |s: &str| s.parse::<Confine>();
    assert_eq!(parse("auto").unwrap(), Confine::Auto);
    assert_eq!(parse("true").unwrap(), Confine::Auto);
    assert_eq!(parse("false").unwrap(), Confine::Off);
    assert_eq!(parse("v1").unwrap(), Confine::V1);
    assert_eq!(parse("v2").unwrap(), Confine::V2);
    assert_eq!(Confine::from(false), Confine::Off);
    let err = parse("V2").unwrap_err().to_string();
    assert_eq!(
        err,
        r#"invalid confine value "V2": expected true, false, "auto", "v1" or "v2""#
    );
}

#[test]
fn the_rules_deny_every_gpu_but_the_jobs_own() {
    let rules = all_but(MAJOR, [3, 0, 2, 1, 3], &[0, 2]);
    assert_eq!(rules.denied_minors, [1, 3]);
}

#[test]
fn a_bad_name_is_refused_before_anything_is_made() {
    let me = pidfd_of(std::process::id() as i32);
    let err = confine(1, me.as_fd(), "../x", Confine::Auto, &deny_3()).unwrap_err();
    assert!(matches!(err, ConfineError::InvalidName { .. }), "{err}");
}

// A job is over when its cgroup is empty (issue 19, finding 7): fake cgroup trees in temp
// dirs first, then the real kernel.

/// A fake job cgroup `gpupin-<name>` under a temp dir with `files` in it.
fn fake_cgroup(tmp: &Path, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = tmp.join(format!("gpupin-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

#[test]
fn cgroup2_emptiness_is_read_from_cgroup_events() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = fake_cgroup(
        tmp.path(),
        "busy",
        &[("cgroup.events", "populated 1\nfrozen 0\n")],
    );
    let idle = fake_cgroup(
        tmp.path(),
        "idle",
        &[("cgroup.events", "populated 0\nfrozen 0\n")],
    );
    // cgroup.events is exact for the subtree: cgroup.procs is not read where it exists.
    let sub = fake_cgroup(
        tmp.path(),
        "sub",
        &[("cgroup.events", "populated 1\n"), ("cgroup.procs", "")],
    );
    assert!(populated(&busy));
    assert!(!populated(&idle));
    assert!(populated(&sub));
    assert!(
        !populated(&tmp.path().join("gpupin-gone")),
        "a removed cgroup is empty"
    );
}

#[test]
fn cgroup_v1_emptiness_is_read_from_cgroup_procs() {
    let tmp = tempfile::tempdir().unwrap();
    let busy = fake_cgroup(tmp.path(), "busy", &[("cgroup.procs", "4242\n4243\n")]);
    let idle = fake_cgroup(tmp.path(), "idle", &[("cgroup.procs", "")]);
    assert!(populated(&busy));
    assert!(!populated(&idle));
    let job = JobCgroup::recorded(&[idle.clone(), busy.clone()]).unwrap();
    assert!(job.populated(), "one busy cgroup of two keeps the job");
    assert_eq!(job.count(), 2);
    assert!(
        !JobCgroup::recorded(std::slice::from_ref(&idle))
            .unwrap()
            .populated()
    );
    // A cgroup below the job's (root's job could make one) is the job's too.
    std::fs::create_dir(idle.join("sub")).unwrap();
    std::fs::write(idle.join("sub/cgroup.procs"), "4244\n").unwrap();
    assert!(populated(&idle));
}

#[test]
fn an_unreadable_cgroup_counts_as_in_use_and_other_paths_are_never_read() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = fake_cgroup(tmp.path(), "odd", &[]);
    std::fs::create_dir(odd.join("cgroup.events")).unwrap();
    assert!(populated(&odd), "an error never frees the GPUs");
    let other = tmp.path().join("user.slice");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("cgroup.procs"), "1\n").unwrap();
    assert!(!populated(&other), "only gpupin-* cgroups are read");
    assert!(!populated(Path::new("gpupin-relative")));
    assert_eq!(JobCgroup::recorded(&[other]), None);
}

#[test]
fn kill_writes_cgroup_kill_where_the_kernel_has_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = fake_cgroup(
        tmp.path(),
        "k",
        &[("cgroup.kill", ""), ("cgroup.procs", "1\n")],
    );
    kill(&dir).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("cgroup.kill")).unwrap(),
        "1"
    );
}

#[test]
fn kill_without_cgroup_kill_signals_each_listed_process_and_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    let mut listed = Command::new("sleep").arg("60").spawn().unwrap();
    let mut other = Command::new("sleep").arg("60").spawn().unwrap();
    let dir = fake_cgroup(
        tmp.path(),
        "k",
        &[("cgroup.procs", &format!("{}\n", listed.id()))],
    );
    // Not a job cgroup: never acted on, whatever it lists.
    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("cgroup.procs"), format!("{}\n", other.id())).unwrap();
    let mut below = Command::new("sleep").arg("60").spawn().unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/cgroup.procs"), format!("{}\n", below.id())).unwrap();
    kill(&dir).unwrap();
    kill(&foreign).unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(listed.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(below.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_eq!(other.try_wait().unwrap(), None, "the other process runs on");
    other.kill().unwrap();
    other.wait().unwrap();
}

#[test]
fn gc_removes_empty_job_cgroups_of_holders_that_are_gone_only() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path();
    let gone = fake_cgroup(&top.join("user.slice/session-1.scope"), "gone", &[]);
    let live = fake_cgroup(top, "live", &[]);
    let busy = fake_cgroup(top, "busy", &[("cgroup.events", "populated 1\n")]);
    let not_ours = top.join("system.slice");
    std::fs::create_dir_all(&not_ours).unwrap();
    let is_live = |id: &str| id == "live";
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(120);

    let mut removed = Vec::new();
    orphans::remove_under(top, &is_live, std::time::SystemTime::now(), &mut removed);
    assert!(
        removed.is_empty(),
        "a cgroup just made is left: {removed:?}"
    );
    orphans::remove_under(top, &is_live, later, &mut removed);
    assert_eq!(removed, std::slice::from_ref(&gone));
    assert!(!gone.exists());
    assert!(live.exists() && busy.exists() && not_ours.exists());
}

#[test]
fn a_job_is_over_when_its_cgroup_is_empty_not_when_its_first_process_exits() {
    let test = "a_job_is_over_when_its_cgroup_is_empty";
    if !ready(test, Confine::Auto) {
        return;
    }
    let nodes = fake_nodes();
    // The job starts a child in a session of its own, which outlives it, and exits.
    let script = "read go; setsid sleep 300 </dev/null >/dev/null 2>&1 & exit 0";
    let job = Job::spawn_script(nodes.path(), script, |_| {});
    let Some(cgroup) = confined(test, &job, Confine::Auto, &deny_3()) else {
        return;
    };
    job.finish();
    assert!(
        cgroup.populated(),
        "the setsid child is still in {cgroup:?}"
    );
    assert_eq!(cgroup.count(), 1);
    let recorded = JobCgroup::recorded(cgroup.dirs()).unwrap();
    assert_eq!(recorded.dirs(), cgroup.dirs());
    assert!(recorded.populated());
    assert!(cgroup.remove().is_err(), "kept while the child runs");
    let start = std::time::Instant::now();
    while cgroup.populated() {
        cgroup.kill().unwrap();
        assert!(
            start.elapsed().as_secs() < 60,
            "the leftover was not killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    cgroup.remove().unwrap();
}

#[test]
fn a_pid_whose_pinned_process_ended_is_not_confined() {
    let test = "a_pid_whose_pinned_process_ended_is_not_confined";
    if !ready(test, Confine::Auto) {
        return;
    }
    let nodes = fake_nodes();
    let job = Job::spawn(nodes.path());
    let mut ended = Command::new("true").spawn().unwrap();
    let ended_fd = pidfd_of(ended.id() as i32);
    ended.wait().unwrap();
    let before = std::fs::read_to_string(format!("/proc/{}/cgroup", job.pid())).unwrap();
    // The pidfd is of a process that ended: the pid may be anyone's by now.
    let err = confine(
        job.pid(),
        ended_fd.as_fd(),
        &unique(test),
        Confine::Auto,
        &deny_3(),
    )
    .unwrap_err();
    assert!(matches!(err, ConfineError::Gone { .. }), "{err}");
    let after = std::fs::read_to_string(format!("/proc/{}/cgroup", job.pid())).unwrap();
    assert_eq!(before, after, "nothing was moved");
    for parent in hierarchy::parents(Path::new("/proc"), job.pid(), Confine::Auto).unwrap() {
        assert!(!parent.dir.join(format!("gpupin-{}", unique(test))).exists());
    }
    job.finish();
}
