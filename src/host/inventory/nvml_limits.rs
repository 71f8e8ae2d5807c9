//! GPU memory limits the driver enforces per cgroup (`nvmlDeviceSetMemoryLimits_v1`, in
//! NVML's header since API 13; the driver answers NOT_SUPPORTED where it lacks them): a
//! shared holder's reservation becomes the most its cgroup may allocate on each of its
//! GPUs, and the limit is cleared before the cgroup goes. nvml-wrapper 0.13 has no binding
//! for them, so the function is looked up in the NVML library loaded into this process
//! and called as nvml.h declares it: a device handle and a struct of the cgroup's path and
//! the soft and hard limits in bytes.

use super::InventoryError;
use nvml_wrapper::Nvml;
use std::ffi::{CString, OsStr, c_char, c_int, c_ulonglong, c_void};
use std::path::Path;

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: no hard limit.
const NO_LIMIT: u64 = u64::MAX;
/// nvml.h's return codes that say the driver lacks the feature.
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_FUNCTION_NOT_FOUND: c_int = 13;

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
}

type SetFn = unsafe extern "C" fn(*mut c_void, *mut SetLimits) -> c_int;

/// What the driver did with a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enforced {
    /// The driver enforces it.
    Yes,
    /// The driver has no per-cgroup memory limits: the reservation is accounting only.
    Unsupported,
}

impl Enforced {
    /// The word `gpupin nvml memory-limit` prints for it, and its asker reads back.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Enforced::Yes => "enforced",
            Enforced::Unsupported => "unsupported",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("setting the memory limit of GPU {uuid} for cgroup {cgroup}: NVML error {code}")]
pub struct LimitError {
    uuid: String,
    cgroup: String,
    code: i32,
}

/// Limits what cgroup `cgroup` (its directory) may allocate on each GPU of `uuids` to
/// `bytes` (soft and hard); `bytes` `None` clears the limits. One answer for all: the
/// driver either has the feature or not.
pub(crate) fn set(
    uuids: &[&str],
    cgroup: &Path,
    bytes: Option<u64>,
) -> Result<Enforced, InventoryError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(super::NVML_LIBRARY))
        .init()
        .map_err(|source| InventoryError::NvmlUnavailable { source })?;
    // SAFETY: the library NVML loaded is opened again by name (the loader hands back the
    // same one); the symbol, where there, is nvml.h's `nvmlDeviceSetMemoryLimits_v1`, whose
    // signature `SetFn` spells.
    let library = unsafe { libloading::Library::new(super::NVML_LIBRARY) };
    let Ok(library) = library else {
        return Ok(Enforced::Unsupported);
    };
    let set: libloading::Symbol<SetFn> =
        match unsafe { library.get(b"nvmlDeviceSetMemoryLimits_v1\0") } {
            Ok(set) => set,
            Err(_) => return Ok(Enforced::Unsupported),
        };
    let path =
        CString::new(cgroup.as_os_str().as_encoded_bytes()).map_err(|_| InventoryError::Nvml {
            what: format!("cgroup path {}", cgroup.display()),
            source: nvml_wrapper::error::NvmlError::InvalidArg,
        })?;
    let (soft, hard) = match bytes {
        Some(bytes) => (bytes, bytes),
        None => (0, NO_LIMIT),
    };
    for uuid in uuids {
        let device = nvml
            .device_by_uuid(*uuid)
            .map_err(|source| InventoryError::Nvml {
                what: format!("GPU {uuid}"),
                source,
            })?;
        let mut limits = SetLimits {
            name_space: path.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: the handle is NVML's, valid while `nvml` is initialised (through this
        // call); `limits` and the path it points to outlive the call.
        let code = unsafe { set(device.handle().cast(), &mut limits) };
        match code {
            0 => {}
            NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_FUNCTION_NOT_FOUND => {
                return Ok(Enforced::Unsupported);
            }
            code => {
                return Err(InventoryError::MemoryLimit(Box::new(LimitError {
                    uuid: uuid.to_string(),
                    cgroup: cgroup.display().to_string(),
                    code,
                })));
            }
        }
    }
    Ok(Enforced::Yes)
}
