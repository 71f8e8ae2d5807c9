//! The GPUs' health from NVML loaded into this process (`gpupin serve`, the dynamic
//! binary): an event set registered for XIDs and double-bit ECC errors on every GPU that
//! supports them, waited on in short slices, and every `poll` the conditions that hold
//! until a reset (a row remap pending or failed, double-bit errors in the volatile
//! counter, retired pages pending) or a reboot (a GPU fallen off the bus), and the clock
//! slowdowns (thermal, power brake). What they mean is `model::health`'s; what is done,
//! the caller's (`HealthSink`).

use super::InventoryError;
use crate::model::health::{Signal, slowdowns};
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use nvml_wrapper_sys::bindings::nvmlEventData_t;
use std::ffi::OsStr;
use std::time::{Duration, Instant};

/// How long one wait on the event set lasts: how soon a stop is noticed.
const WAIT_SLICE_MS: u32 = 500;

/// What the watch tells as it goes.
pub(crate) trait HealthSink {
    /// `signal` happened on the GPU with this UUID (an event: told once); `gpu_instance`:
    /// the MIG GPU instance id the driver attributes it to, if it does.
    fn event(&mut self, uuid: &str, gpu_instance: Option<u32>, signal: Signal);
    /// The conditions that hold on the GPU now (empty: none), at every poll.
    fn conditions(&mut self, uuid: &str, now: &[Signal]);
    /// The clock slowdowns NVML reports on the GPU now (`model::health::slowdowns`'s
    /// words; empty: none), at every poll.
    fn slowdowns(&mut self, uuid: &str, now: &[&'static str]);
}

/// Watches every GPU until `stop` says so, telling `sink`; NVML is let go on return.
/// Fails only where NVML cannot be loaded or has no GPU; a GPU that supports no event is
/// polled only.
pub(crate) fn watch(
    poll: Duration,
    sink: &mut dyn HealthSink,
    stop: &dyn Fn() -> bool,
) -> Result<(), InventoryError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(super::NVML_LIBRARY))
        .init()
        .map_err(|source| InventoryError::NvmlUnavailable { source })?;
    let count = nvml.device_count().map_err(|source| InventoryError::Nvml {
        what: "device count".into(),
        source,
    })?;
    let mut uuids = Vec::new();
    for index in 0..count {
        if let Ok(uuid) = nvml.device_by_index(index).and_then(|d| d.uuid()) {
            uuids.push(uuid);
        }
    }
    let set = register(&nvml, count);
    let mut next_poll = Instant::now();
    while !stop() {
        if Instant::now() >= next_poll {
            for uuid in &uuids {
                match nvml.device_by_uuid(uuid.as_str()) {
                    Ok(device) => {
                        sink.conditions(uuid, &conditions(&nvml, &device));
                        if let Ok(reasons) = device.current_throttle_reasons() {
                            sink.slowdowns(uuid, &slowdowns(reasons.bits()));
                        }
                    }
                    Err(NvmlError::GpuLost) => sink.conditions(uuid, &[Signal::Lost]),
                    Err(_) => {}
                }
            }
            next_poll = Instant::now() + poll;
        }
        match &set {
            Some(set) => match wait(&nvml, set) {
                Ok(event) => {
                    // SAFETY: a handle NVML gave in the event, valid while `nvml` is.
                    let device = unsafe { nvml_wrapper::Device::new(event.device, &nvml) };
                    let Ok(uuid) = device.uuid() else {
                        continue;
                    };
                    let types = EventTypes::from_bits_truncate(event.eventType);
                    let instance =
                        (event.gpuInstanceId != NO_INSTANCE).then_some(event.gpuInstanceId);
                    if types.contains(EventTypes::CRITICAL_XID_ERROR) {
                        sink.event(&uuid, instance, Signal::Xid(event.eventData));
                    }
                    if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                        sink.event(&uuid, instance, Signal::DoubleBitEcc);
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(error) => {
                    tracing::warn!(error = %error, "waiting for NVML events failed; polling only");
                    std::thread::sleep(Duration::from_millis(u64::from(WAIT_SLICE_MS)));
                }
            },
            None => std::thread::sleep(Duration::from_millis(u64::from(WAIT_SLICE_MS))),
        }
    }
    Ok(())
}

/// nvml.h's gpuInstanceId of an event no MIG instance is blamed for.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// The set's next event, waiting up to `WAIT_SLICE_MS`. nvml-wrapper's `EventSet::wait`
/// leaves out the GPU instance the driver attributes an XID to, so the library's
/// function is called as nvml.h declares it.
fn wait(nvml: &Nvml, set: &nvml_wrapper::EventSet<'_>) -> Result<nvmlEventData_t, NvmlError> {
    let call = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    // SAFETY: all-zero is a valid nvmlEventData_t (a null handle and integers); `set` is
    // a live set of this `nvml`, and the call writes one struct, here a local.
    unsafe {
        let mut data: nvmlEventData_t = std::mem::zeroed();
        nvml_try(call(set.handle(), &mut data, WAIT_SLICE_MS))?;
        Ok(data)
    }
}

/// One event set with every GPU registered for what it supports of XIDs and double-bit
/// ECC errors; `None` where none supports either (a board or driver without events).
fn register(nvml: &Nvml, count: u32) -> Option<nvml_wrapper::EventSet<'_>> {
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut set = nvml.create_event_set().ok()?;
    let mut any = false;
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let types = device
            .supported_event_types()
            .map(|t| t & wanted)
            .unwrap_or(EventTypes::empty());
        if types.is_empty() {
            continue;
        }
        set = match device.register_events(types, set) {
            Ok(set) => {
                any = true;
                set
            }
            Err(e) => {
                // The failed registration took the set with it: polling only.
                tracing::warn!(gpu = index, error = %e.error, "could not register for NVML events; polling only");
                return None;
            }
        };
    }
    any.then_some(set)
}

/// The conditions that hold on `device` until a reset, where NVML can say.
fn conditions(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> Vec<Signal> {
    let mut now = Vec::new();
    match remapped_rows(nvml, device) {
        Ok((_, true)) => now.push(Signal::RemapFailed),
        Ok((true, false)) => now.push(Signal::RemapPending),
        // Nothing else can be asked of a GPU that has fallen off the bus.
        Err(NvmlError::GpuLost) => return vec![Signal::Lost],
        _ => {}
    }
    if device
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .is_ok_and(|n| n > 0)
    {
        now.push(Signal::DoubleBitEcc);
    }
    if device.are_pages_pending_retired().unwrap_or(false) {
        now.push(Signal::RetiredPagesPending);
    }
    if let Some(code) = recovery_action(device).filter(|&code| code != RECOVERY_NONE) {
        now.push(Signal::Recovery(code));
    }
    now
}

/// `NVML_GPU_RECOVERY_ACTION_NONE`.
const RECOVERY_NONE: u32 = 0;

/// The driver's recovery action for `device` (the field holds nvml.h's
/// `nvmlDeviceGpuRecoveryAction_t`); `None` where the driver does not have the
/// field (older than it, or a library without `nvmlDeviceGetFieldValues`).
fn recovery_action(device: &nvml_wrapper::Device<'_>) -> Option<u32> {
    let samples = device
        .field_values_for(&[FieldId(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)])
        .ok()?;
    match samples.into_iter().next()?.ok()?.value.ok()? {
        SampleValue::U32(code) => Some(code),
        SampleValue::U64(code) => u32::try_from(code).ok(),
        SampleValue::I64(code) => u32::try_from(code).ok(),
        _ => None,
    }
}

/// Whether a row remap is pending, and whether remapping has failed. nvml-wrapper 0.13 has
/// no wrapper for it, so the library's function it loaded is called as nvml.h declares it.
fn remapped_rows(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
) -> Result<(bool, bool), NvmlError> {
    let call = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: `device` is a handle NVML gave, valid while `nvml` is initialised (it
    // outlives this call); the function writes four unsigned ints, here locals.
    unsafe {
        nvml_try(call(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        ))?;
    }
    Ok((pending != 0, failure != 0))
}
