//! Whether a process's cgroups are a container's, by the container id in their paths.
//! Runtimes name a container's cgroup after its id: runc `/<id>` (or the spec's
//! `cgroupsPath`), Docker `/docker/<id>` (cgroupfs driver) or `docker-<id>.scope`
//! (systemd driver), podman `libpod-<id>.scope`, containerd's CRI
//! `cri-containerd-<id>.scope`, CRI-O `crio-<id>.scope`.

/// The systemd scope prefixes engines give a container's cgroup.
const SCOPE_PREFIXES: [&str; 4] = ["docker-", "libpod-", "cri-containerd-", "crio-"];

/// Whether some line of `cgroup` (/proc/PID/cgroup: `hierarchy:controllers:path`) has a
/// path component that names container `id`.
pub(crate) fn names_container(cgroup: &str, id: &str) -> bool {
    if id.is_empty() {
        return false;
    }
    cgroup
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .flat_map(|path| path.split('/'))
        .any(|component| component_names(component, id))
}

fn component_names(component: &str, id: &str) -> bool {
    if component == id {
        return true;
    }
    let Some(scope) = component.strip_suffix(".scope") else {
        return false;
    };
    SCOPE_PREFIXES
        .iter()
        .any(|prefix| scope.strip_prefix(prefix) == Some(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a9c0d1e2b";

    #[test]
    fn finds_the_id_in_every_engines_layout() {
        for cgroup in [
            "12:devices:/3f2a9c0d1e2b\n",
            "0::/system.slice/docker-3f2a9c0d1e2b.scope\n",
            "5:memory:/docker/3f2a9c0d1e2b\n0::/\n",
            "0::/machine.slice/libpod-3f2a9c0d1e2b.scope/container\n",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-3f2a9c0d1e2b.scope\n",
            "0::/kubepods.slice/crio-3f2a9c0d1e2b.scope\n",
        ] {
            assert!(names_container(cgroup, ID), "{cgroup}");
        }
    }

    #[test]
    fn a_part_of_a_name_or_another_prefix_is_not_the_container() {
        for cgroup in [
            "0::/system.slice/docker-3f2a9c0d1e2b0.scope\n",
            "0::/user.slice/3f2a9c0d1e2\n",
            "0::/system.slice/mine-3f2a9c0d1e2b.scope\n",
            "0::/system.slice/docker-3f2a9c0d1e2b.service\n",
            // The id as a controller name, not as a path.
            "3:3f2a9c0d1e2b:/\n",
            "",
        ] {
            assert!(!names_container(cgroup, ID), "{cgroup}");
        }
        assert!(!names_container("0::/\n", ""));
    }
}
