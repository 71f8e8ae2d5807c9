//! Which cgroup hierarchies this host mounts, and what that means for each way gpupin
//! keeps a container or a job to its GPUs:
//! - the prestart hook (runc hooks, CRI-O) writes rules into the v1 devices controller
//!   and refuses containers on a host without one (`inject::cgroup`);
//! - gpupin-runtime and podman's precreate hook edit the spec, and the runtime applies
//!   the device rules itself, on v1 or v2;
//! - `gpupin exec` confines jobs with whatever `confine` asks for (`confine`).

use super::{Finding, Setup};
use crate::host::confine::Confine;
use crate::host::confine::hierarchy::cgroup2_mounts;
use crate::host::container_devices::cgroup::devices_mounts;

const CHECK: &str = "cgroups";

pub(super) fn check(setup: &Setup) -> Vec<Finding> {
    let path = setup.proc.join("self/mountinfo");
    let mountinfo = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => {
            return vec![Finding::problem(
                CHECK,
                format!("cgroups: reading {}: {err}", path.display()),
            )];
        }
    };
    let v1: Vec<String> = devices_mounts(&mountinfo).map(|(_, mount)| mount).collect();
    let v2: Vec<String> = cgroup2_mounts(&mountinfo).map(|(_, mount)| mount).collect();
    judge(&v1, &v2, setup.config.confine)
}

fn judge(v1: &[String], v2: &[String], confine: Confine) -> Vec<Finding> {
    let (has_v1, has_v2) = (!v1.is_empty(), !v2.is_empty());
    let layout = match (has_v1, has_v2) {
        (true, true) => format!(
            "cgroups: hybrid: v1 devices controller at {}, cgroup2 at {}",
            v1.join(", "),
            v2.join(", ")
        ),
        (true, false) => format!("cgroups: v1 only: devices controller at {}", v1.join(", ")),
        (false, true) => format!("cgroups: v2 only: cgroup2 at {}", v2.join(", ")),
        (false, false) => {
            return vec![
                Finding::problem(
                    CHECK,
                    "cgroups: neither a v1 devices controller nor cgroup2 is mounted: nothing can keep a container or a job from the other GPUs",
                )
                .fix("mount cgroup2 at /sys/fs/cgroup (systemd does at boot)"),
            ];
        }
    };
    let mut findings = vec![Finding::ok(CHECK, layout)];
    findings.push(match has_v1 {
        true => Finding::ok(
            CHECK,
            "prestart hook (runc hooks, CRI-O): device rules go into the v1 devices controller",
        ),
        false => Finding::warn(
            CHECK,
            "prestart hook (runc hooks, CRI-O): no v1 devices controller, so containers admitted at prestart are refused (a hook cannot amend the runtime's BPF device program)",
        )
        .fix("start GPU containers through gpupin-runtime (Docker, containerd) or podman's precreate hook"),
    });
    findings.push(Finding::ok(
        CHECK,
        "gpupin-runtime, podman precreate: the runtime applies the device rules gpupin writes into the spec (v1 or v2)",
    ));
    findings.push(confinement(has_v1, has_v2, confine));
    findings
}

/// What `gpupin exec` can do with `confine` here.
fn confinement(has_v1: bool, has_v2: bool, confine: Confine) -> Finding {
    let mechanisms = [
        has_v1.then_some("the v1 devices controller"),
        has_v2.then_some("a cgroup2 BPF device program"),
    ];
    let available: Vec<&str> = mechanisms.into_iter().flatten().collect();
    let unavailable = |what: &str, other: &str| {
        Finding::problem(
            CHECK,
            format!(
                "gpupin exec: confine = \"{confine}\" but there is no {what}: every job is refused"
            ),
        )
        .fix(format!(
            "set confine = \"auto\" (or \"{other}\") in the config"
        ))
    };
    match confine {
        Confine::Off => Finding::warn(
            CHECK,
            "gpupin exec: confine = false: a job can open every GPU's node, whatever CUDA_VISIBLE_DEVICES says",
        )
        .fix("set confine = \"auto\" in the config"),
        Confine::V1 if !has_v1 => unavailable("v1 devices controller", "v2"),
        Confine::V2 if !has_v2 => unavailable("cgroup2 hierarchy", "v1"),
        Confine::V1 => Finding::ok(CHECK, "gpupin exec: confine = \"v1\": jobs get deny rules in the v1 devices controller"),
        Confine::V2 => Finding::ok(CHECK, "gpupin exec: confine = \"v2\": jobs get a cgroup2 BPF device program"),
        Confine::Auto => Finding::ok(
            CHECK,
            format!("gpupin exec: confine = \"auto\": jobs are kept from other GPUs by {}", available.join(" and ")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn lines(found: &[Finding]) -> Vec<(Status, &str)> {
        found.iter().map(|f| (f.status, f.what.as_str())).collect()
    }

    #[test]
    fn a_hybrid_host_serves_every_integration() {
        let found = judge(
            &["/sys/fs/cgroup/devices".into()],
            &["/sys/fs/cgroup/unified".into()],
            Confine::Auto,
        );
        assert!(
            found.iter().all(|f| f.status == Status::Ok),
            "{:?}",
            lines(&found)
        );
        assert_eq!(
            found[0].what,
            "cgroups: hybrid: v1 devices controller at /sys/fs/cgroup/devices, cgroup2 at /sys/fs/cgroup/unified"
        );
        assert!(
            found[3]
                .what
                .ends_with("by the v1 devices controller and a cgroup2 BPF device program")
        );
    }

    #[test]
    fn a_v2_only_host_warns_about_the_prestart_path_and_refuses_confine_v1() {
        let found = judge(&[], &["/sys/fs/cgroup".into()], Confine::V1);
        assert_eq!(found[0].what, "cgroups: v2 only: cgroup2 at /sys/fs/cgroup");
        assert_eq!(found[1].status, Status::Warn);
        assert!(
            found[1]
                .what
                .starts_with("prestart hook (runc hooks, CRI-O): no v1 devices controller")
        );
        assert_eq!(found[3].status, Status::Problem);
        assert_eq!(
            found[3].what,
            "gpupin exec: confine = \"v1\" but there is no v1 devices controller: every job is refused"
        );
        assert_eq!(
            found[3].fix.as_deref(),
            Some("set confine = \"auto\" (or \"v2\") in the config")
        );
    }

    #[test]
    fn no_hierarchy_at_all_is_one_problem() {
        let found = judge(&[], &[], Confine::Auto);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, Status::Problem);
    }
}
