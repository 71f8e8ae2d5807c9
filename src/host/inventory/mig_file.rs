//! The `mig` list of a GPU in the JSON inventory format (see `file`): a GPU in MIG mode
//! lists its instances under it; a GPU without the key is not in MIG mode, so files
//! written before MIG parse unchanged.
//!
//! ```json
//! {"index": 0, "uuid": "GPU-...", ..., "mig": [
//!   {"index": 0, "uuid": "MIG-...", "profile": "3g.40gb", "memory": "40192MiB",
//!    "gi": 2, "ci": 0, "gi_minor": 21, "ci_minor": 22}
//! ]}
//! ```
//!
//! - `mig` (optional): present (maybe `[]`) when the GPU is in MIG mode;
//! - `index` (required): the MIG device index under the GPU (`nvidia-smi -L`'s
//!   `Device N`), unique within it;
//! - `uuid` (required): `MIG-...`, without spaces or commas, unique in the file;
//! - `profile` (optional): e.g. `1g.10gb`; unknown when left out;
//! - `memory` (optional): as a GPU's;
//! - `gi`, `ci` (optional, both or neither): the GPU and compute instance ids; without
//!   them the instance can be modelled (`gpupin pick`) but not given to anyone;
//! - `gi_minor`, `ci_minor` (optional, need `gi` and `ci`): the capability minors of
//!   `/dev/nvidia-caps/nvidia-cap<N>`; default: the driver's fixed table
//!   (`/proc/driver/nvidia-caps/mig-minors`).

use crate::model::gpu::Gpu;
use crate::model::mig::{MigAccess, MigInstance};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DocMig {
    index: u32,
    uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<String>,
    #[serde(default)]
    memory: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gi: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ci: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gi_minor: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ci_minor: Option<u32>,
}

/// The instances of `gpus[i]` (its index, UUID and minor given), checked one by one.
pub(super) fn convert(
    i: usize,
    parent: &Gpu,
    docs: Vec<DocMig>,
    memory_bytes: impl Fn(&Value) -> Result<u64, String>,
) -> Result<Vec<MigInstance>, String> {
    let mut out = Vec::with_capacity(docs.len());
    for (m, d) in docs.into_iter().enumerate() {
        let at = format!("gpus[{i}].mig[{m}]");
        if !d.uuid.starts_with("MIG-") || d.uuid.len() == 4 {
            return Err(format!(
                "{at}.uuid {:?}: expected MIG- followed by the UUID",
                d.uuid
            ));
        }
        if d.uuid.contains(|c: char| c.is_whitespace() || c == ',') {
            return Err(format!(
                "{at}.uuid {:?}: must not contain spaces or commas",
                d.uuid
            ));
        }
        if let Some(p) = &d.profile
            && !crate::model::mig::is_profile_name(p)
        {
            return Err(format!(
                "{at}.profile {p:?}: expected a MIG profile such as 1g.10gb (omit the key when unknown)"
            ));
        }
        let memory =
            memory_bytes(&d.memory).map_err(|why| format!("{at}.memory {}: {why}", d.memory))?;
        let access = match (d.gi, d.ci, d.gi_minor, d.ci_minor) {
            (None, None, None, None) => None,
            (Some(gi), Some(ci), gi_minor, ci_minor) => {
                let standard = MigAccess::standard(parent.minor, gi, ci);
                Some(MigAccess {
                    gi,
                    ci,
                    gi_minor: gi_minor.unwrap_or(standard.gi_minor),
                    ci_minor: ci_minor.unwrap_or(standard.ci_minor),
                })
            }
            _ => {
                return Err(format!(
                    "{at}: gi and ci go together, and gi_minor and ci_minor need them: give both ids or none"
                ));
            }
        };
        out.push(MigInstance {
            index: d.index,
            uuid: d.uuid,
            profile: d.profile,
            memory_bytes: memory,
            access,
            parent_index: parent.index,
            parent_uuid: parent.uuid.clone(),
            parent_minor: parent.minor,
        });
    }
    out.sort_by_key(|m| m.index);
    Ok(out)
}

pub(super) fn to_doc(m: &MigInstance) -> DocMig {
    DocMig {
        index: m.index,
        uuid: m.uuid.clone(),
        profile: m.profile.clone(),
        memory: Value::from(m.memory_bytes),
        gi: m.access.map(|a| a.gi),
        ci: m.access.map(|a| a.ci),
        gi_minor: m.access.map(|a| a.gi_minor),
        ci_minor: m.access.map(|a| a.ci_minor),
    }
}

/// What must not repeat: an instance index or GI/CI pair within its GPU, a UUID (GPUs'
/// too, case-insensitive) or a capability minor in the whole file.
pub(super) fn check_unique(gpus: &[Gpu]) -> Result<(), String> {
    let mut uuids: HashMap<String, String> = gpus
        .iter()
        .map(|g| {
            (
                g.uuid.to_ascii_lowercase(),
                format!("GPU index {}", g.index),
            )
        })
        .collect();
    let mut minors: HashMap<u32, String> = HashMap::new();
    for g in gpus {
        let mut indexes = HashMap::new();
        let mut ids = HashMap::new();
        for m in g.mig_instances() {
            let at = format!("MIG instance {}", m.address());
            if indexes.insert(m.index, ()).is_some() {
                return Err(format!(
                    "{at}: index {} is listed twice under GPU index {}",
                    m.index, g.index
                ));
            }
            if let Some(first) = uuids.insert(m.uuid.to_ascii_lowercase(), at.clone()) {
                return Err(format!("{at}: uuid {:?} is also used by {first}", m.uuid));
            }
            let Some(a) = m.access else { continue };
            if let Some(first) = ids.insert((a.gi, a.ci), at.clone()) {
                return Err(format!(
                    "{at}: gi {} ci {} is also used by {first}",
                    a.gi, a.ci
                ));
            }
            for minor in [a.gi_minor, a.ci_minor] {
                match minors.get(&minor) {
                    // Instances of one GPU instance share its access node.
                    Some(first) if minor == a.gi_minor && first.ends_with(&gi_key(g, a.gi)) => {}
                    Some(first) => {
                        return Err(format!(
                            "{at}: capability minor {minor} is also used by {first}"
                        ));
                    }
                    None => {
                        let owner = match minor == a.gi_minor {
                            true => format!("{at} {}", gi_key(g, a.gi)),
                            false => at.clone(),
                        };
                        minors.insert(minor, owner);
                    }
                }
            }
        }
    }
    Ok(())
}

fn gi_key(g: &Gpu, gi: u32) -> String {
    format!("(gpu{}/gi{gi})", g.minor)
}
