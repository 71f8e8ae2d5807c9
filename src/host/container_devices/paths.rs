//! Validation of container device paths, done before anything is created: a path must
//! lie under /dev and name each component plainly (no `..`, `.` or empty parts), so that
//! resolving it one component at a time can never leave the container's /dev (the same
//! rule as youki's rootfs/device.rs and runc's devices validation).

use super::InjectError;
use crate::model::gpu::DeviceNode;

/// A validated node: the components below /dev, the last one being the node itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodePath<'a> {
    pub container_path: &'a str,
    pub dirs: Vec<&'a str>,
    pub name: &'a str,
    pub major: u32,
    pub minor: u32,
}

/// Validates every node, failing on the first bad path.
pub(super) fn validate_all(nodes: &[DeviceNode]) -> Result<Vec<NodePath<'_>>, InjectError> {
    nodes.iter().map(validate).collect()
}

fn validate(node: &DeviceNode) -> Result<NodePath<'_>, InjectError> {
    let invalid = |reason| InjectError::InvalidNodePath {
        path: node.path.clone(),
        reason,
    };
    let rest = node
        .path
        .strip_prefix("/dev/")
        .ok_or_else(|| invalid("not under /dev/"))?;
    let mut parts: Vec<&str> = rest.split('/').collect();
    for part in &parts {
        match *part {
            "" => return Err(invalid("empty path component")),
            "." | ".." => return Err(invalid("contains . or ..")),
            p if p.contains('\0') => return Err(invalid("contains a NUL byte")),
            _ => {}
        }
    }
    let name = parts.pop().ok_or_else(|| invalid("no node name"))?;
    Ok(NodePath {
        container_path: &node.path,
        dirs: parts,
        name,
        major: node.major,
        minor: node.minor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str) -> DeviceNode {
        DeviceNode {
            path: path.to_owned(),
            major: 195,
            minor: 0,
        }
    }

    #[test]
    fn plain_and_nested_paths_are_split() {
        let n = node("/dev/nvidia0");
        let p = validate(&n).unwrap();
        assert!(p.dirs.is_empty());
        assert_eq!(p.name, "nvidia0");
        let n = node("/dev/nvidia-caps/nvidia-cap1");
        let p = validate(&n).unwrap();
        assert_eq!(p.dirs, ["nvidia-caps"]);
        assert_eq!(p.name, "nvidia-cap1");
    }

    #[test]
    fn paths_outside_dev_or_with_dots_are_rejected() {
        for bad in [
            "/dev",
            "/dev/",
            "/devx/nvidia0",
            "dev/nvidia0",
            "/etc/passwd",
            "/dev/../etc/passwd",
            "/dev/nvidia-caps/../../x",
            "/dev/./nvidia0",
            "/dev//nvidia0",
            "/dev/nvidia0/",
            "/dev/a\0b",
        ] {
            let err = validate(&node(bad)).unwrap_err();
            assert!(matches!(err, InjectError::InvalidNodePath { .. }), "{bad}");
        }
    }

    #[test]
    fn one_bad_node_rejects_the_whole_list() {
        let nodes = [node("/dev/nvidia0"), node("/dev/../x")];
        assert!(validate_all(&nodes).is_err());
    }
}
