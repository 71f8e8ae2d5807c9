//! The driver's user-space side: a container holding `/dev/nvidia3` also needs the host
//! driver's libraries (`libcuda.so`, `libnvidia-ml.so`), `nvidia-smi` and firmware,
//! which must match the loaded kernel module and so cannot come from the image. NVIDIA's
//! toolkit describes them in a CDI spec (`nvidia-ctk cdi generate`); gpupin applies the
//! spec's common edits and the entries of exactly the GPUs it chose, on the paths that
//! edit the spec before create (gpupin-runtime, podman's precreate). The prestart hook
//! comes after create, too late for mounts and createContainer hooks: there NVIDIA's own
//! legacy hook reads NVIDIA_VISIBLE_DEVICES, which gpupin leaves for it. What NVIDIA's
//! stack put into a spec besides gpupin (GPU nodes, requests) is `admission::foreign`'s.

pub(crate) mod cdi;
mod select;

pub(crate) use select::SelectError;

use crate::admission::edits::ContainerEdits;
use crate::input::config::Driver;
use crate::model::gpu::Inventory;
use crate::model::nvidia::VISIBLE_DEVICES;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
    #[error(transparent)]
    Select(#[from] SelectError),
    #[error(
        "driver = \"cdi\", but no nvidia.com/gpu CDI spec is in {dirs}; generate one (nvidia-ctk cdi generate) or set cdi_spec_dirs"
    )]
    NoSpec { dirs: String },
    #[error(
        "driver = \"cdi\" needs the spec edited before create (gpupin-runtime or podman's precreate hook); the prestart hook cannot add the driver's mounts"
    )]
    NeedsCreate,
}

/// Adds the driver's edits for the GPUs `uuids` to `edits`, for a spec edited before
/// create. `container` names the container in the log.
pub fn add_for_spec(
    driver: Driver,
    dirs: &[PathBuf],
    inventory: &Inventory,
    uuids: &[String],
    container: &str,
    edits: &mut ContainerEdits,
) -> Result<(), DriverError> {
    if driver == Driver::None {
        return Ok(());
    }
    let found = cdi::load(dirs)?;
    if found.is_empty() {
        if driver == Driver::Cdi {
            return Err(DriverError::NoSpec { dirs: join(dirs) });
        }
        tracing::warn!(
            container,
            cdi_spec_dirs = %join(dirs),
            "no nvidia.com/gpu CDI spec found: the container gets no driver libraries from gpupin"
        );
        return Ok(());
    }
    let cdi = select::edits_for(&found, inventory, uuids)?;
    tracing::debug!(container, files = ?cdi.files, mounts = cdi.mounts.len(), "CDI edits");
    cdi.merge_into(edits);
    Ok(())
}

/// `add_for_spec` for a runtime that applies CDI itself (NRI's adjustment names CDI
/// devices): the GPUs' CDI device names into `edits`, which it applies whole (the groups
/// a spec adds too), and `NVIDIA_VISIBLE_DEVICES=void` as `merge_into` leaves it where the
/// spec's edits bring the driver.
pub(crate) fn add_by_name(
    dirs: &[PathBuf],
    inventory: &Inventory,
    uuids: &[String],
    edits: &mut ContainerEdits,
) -> Result<(), DriverError> {
    edits.cdi_devices = cdi_names(dirs, inventory, uuids)?;
    edits.env.retain(|(k, _)| k != VISIBLE_DEVICES);
    edits
        .env
        .push((VISIBLE_DEVICES.to_string(), "void".to_string()));
    edits.driver_from_cdi = true;
    Ok(())
}

/// The CDI device names of the GPUs `uuids` (`nvidia.com/gpu=<entry>`), for a runtime
/// that applies CDI itself (the kubelet's device plugin API); an error where no
/// `nvidia.com/gpu` spec is found or a GPU has no entry.
pub(crate) fn cdi_names(
    dirs: &[PathBuf],
    inventory: &Inventory,
    uuids: &[String],
) -> Result<Vec<String>, DriverError> {
    let found = cdi::load(dirs)?;
    if found.is_empty() {
        return Err(DriverError::NoSpec { dirs: join(dirs) });
    }
    Ok(select::qualified_names(&found, inventory, uuids)?)
}

/// The prestart path (after create) cannot give the driver's files: under `cdi` it is
/// refused, before anything is allocated.
pub(crate) fn check_prestart(driver: Driver) -> Result<(), DriverError> {
    match driver {
        Driver::Cdi => Err(DriverError::NeedsCreate),
        Driver::Auto | Driver::None => Ok(()),
    }
}

/// Says, under `auto`, that a container admitted on the prestart path gets no driver
/// files from gpupin: once per container, after its GPUs are allocated.
pub(crate) fn note_prestart(driver: Driver, container: &str) {
    if driver == Driver::Auto {
        tracing::warn!(
            container,
            "prestart path: the container gets no driver libraries from gpupin (NVIDIA_VISIBLE_DEVICES is left for NVIDIA's hook)"
        );
    }
}

fn join(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        return "no dir (cdi_spec_dirs is empty)".into();
    }
    let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::nvidia::VISIBLE_DEVICES;
    use crate::policy::testing::machine;

    const SPEC: &str = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia0, major: 195, minor: 0}]\ncontainerEdits:\n  mounts: [{hostPath: /r/usr/bin/nvidia-smi, containerPath: /usr/bin/nvidia-smi}]\n";

    fn run(driver: Driver, dirs: &[PathBuf]) -> Result<ContainerEdits, DriverError> {
        let mut edits = ContainerEdits {
            env: vec![(VISIBLE_DEVICES.into(), "GPU-test-0".into())],
            ..ContainerEdits::default()
        };
        let gpus = ["GPU-test-0".to_string()];
        add_for_spec(driver, dirs, &machine(2), &gpus, "c1", &mut edits)?;
        Ok(edits)
    }

    #[test]
    fn auto_applies_a_spec_where_there_is_one_and_leaves_the_uuids_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().to_path_buf()];
        let without = run(Driver::Auto, &dirs).unwrap();
        assert_eq!(without.env, [(VISIBLE_DEVICES.into(), "GPU-test-0".into())]);
        assert!(without.mounts.is_empty());
        std::fs::write(dir.path().join("nvidia.yaml"), SPEC).unwrap();
        let with = run(Driver::Auto, &dirs).unwrap();
        assert_eq!(with.env, [(VISIBLE_DEVICES.into(), "void".into())]);
        assert_eq!(with.mounts[0].destination, "/usr/bin/nvidia-smi");
        assert_eq!(with.nodes[0].path, "/dev/nvidia0");
    }

    #[test]
    fn cdi_without_a_spec_is_refused_and_none_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().to_path_buf(), PathBuf::from("/nonexistent/cdi")];
        let err = run(Driver::Cdi, &dirs).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "driver = \"cdi\", but no nvidia.com/gpu CDI spec is in {}, /nonexistent/cdi; generate one (nvidia-ctk cdi generate) or set cdi_spec_dirs",
                dir.path().display()
            )
        );
        let err = run(Driver::Cdi, &[]).unwrap_err().to_string();
        assert!(
            err.contains("is in no dir (cdi_spec_dirs is empty);"),
            "{err}"
        );
        std::fs::write(dir.path().join("broken.yaml"), "{").unwrap();
        let none = run(Driver::None, &dirs).unwrap();
        assert_eq!(none.env, [(VISIBLE_DEVICES.into(), "GPU-test-0".into())]);
        assert!(run(Driver::Auto, &dirs).is_err(), "auto reads the dirs");
    }

    #[test]
    fn prestart_refuses_cdi_and_lets_the_others_pass() {
        assert!(check_prestart(Driver::Auto).is_ok());
        assert!(check_prestart(Driver::None).is_ok());
        let err = check_prestart(Driver::Cdi).unwrap_err().to_string();
        assert!(
            err.starts_with("driver = \"cdi\" needs the spec edited before create"),
            "{err}"
        );
    }
}
