//! Podman's precreate stage: the proposed spec arrives on stdin and leaves, edited, on
//! stdout, so the runtime itself creates the nodes and grants the cgroup rules. There is
//! no container id yet: the GPUs are held under a fresh claim id written into the spec,
//! and the prestart hook binds the claim to the container (or gc reaps it after
//! `claim_grace` when the container never got that far).

use super::{HookError, Outcome, contains};
use crate::assign::{self, HookCommand};
use crate::config::{Config, ConfigError};
use crate::grant;
use crate::inventory;
use crate::ledger::{HolderId, HolderMeta, Ledger, Record};
use crate::request::{self, CLAIM_ANNOTATION, WRITTEN_BY_GPUPIN};
use crate::spec;
use serde_json::Value;
use std::path::Path;

pub(super) fn run(
    input: &[u8],
    exe: &Path,
    load_config: impl FnOnce() -> Result<Config, ConfigError>,
) -> Result<Outcome, HookError> {
    let unchanged = || Outcome::Spec {
        bytes: input.to_vec(),
        claim: None,
    };
    // Every container passes through here when the hook matches always: a spec that
    // mentions neither prefix goes back as it came, unparsed.
    if !contains(input, request::ANNOTATION_PREFIX.as_bytes())
        && !contains(input, request::ENV_PREFIX.as_bytes())
    {
        return Ok(unchanged());
    }
    let mut spec_value = spec::parse(input, Path::new("<stdin>")).map_err(HookError::Spec)?;
    let annotations = spec::annotations(&spec_value);
    if let Some(key) = WRITTEN_BY_GPUPIN
        .iter()
        .find(|k| annotations.contains_key(**k))
    {
        return Err(HookError::ReservedAnnotation(key));
    }
    let request = match request::from_annotations(&annotations)? {
        Some(r) => r,
        None => match request::from_env(&spec::process_env(&spec_value))? {
            Some(r) => r,
            None => return Ok(unchanged()),
        },
    };
    let config = load_config()?;
    let claim = HolderId::new(&new_claim_id())?;
    let meta = HolderMeta {
        source: "precreate".into(),
        pid: None,
        bundle: None,
    };
    let (inventory, record) = grant::allocate(&config, &claim, &request, meta)?;
    let hook = HookCommand {
        exe: exe.to_path_buf(),
        config: config.path.clone(),
    };
    match edit(&mut spec_value, &inventory, &record, &hook) {
        Ok(bytes) => Ok(Outcome::Spec {
            bytes,
            claim: Some(record),
        }),
        Err(err) => {
            Ledger::for_config(&config)?.release(&claim)?;
            Err(err)
        }
    }
}

fn edit(
    spec_value: &mut Value,
    inventory: &inventory::Inventory,
    record: &Record,
    hook: &HookCommand,
) -> Result<Vec<u8>, HookError> {
    assign::edit_spec(spec_value, inventory, record, hook)?;
    spec::set_annotation(spec_value, CLAIM_ANNOTATION, &record.id).map_err(HookError::Spec)?;
    serde_json::to_vec(spec_value).map_err(|e| {
        HookError::Spec(spec::SpecError::Serialize {
            path: "<stdout>".into(),
            source: e,
        })
    })
}

/// `claim-` and 16 random hex digits: unguessable, so one container cannot bind another's
/// claim by writing its id into its own annotations.
fn new_claim_id() -> String {
    let mut bytes = [0u8; 8];
    // getrandom(2) fails only on pre-3.17 kernels or a bad buffer; the fallback keeps the
    // id unique (pid and time), if not unguessable.
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        bytes = (nanos ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("claim-{hex}")
}
