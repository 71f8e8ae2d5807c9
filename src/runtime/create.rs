//! `create` under gpupin-runtime: find the request, allocate, edit the spec.

use super::ShimError;
use crate::assign::{self, HookCommand};
use crate::config::Config;
use crate::docker;
use crate::grant;
use crate::ledger::{ClaimToken, HolderId, HolderMeta, Ledger, Record};
use crate::request::{self, GpuRequest};
use crate::spec;
use serde_json::Value;
use std::path::Path;

/// The request of a container, in the order of precedence: OCI annotations (Docker >= 24
/// `--annotation`, compose `annotations:`), Docker labels, process env, Docker's own
/// `--gpus` request.
pub fn find_request(spec_value: &Value, id: &str) -> Result<Option<GpuRequest>, ShimError> {
    if let Some(r) = request::from_annotations(&spec::annotations(spec_value))? {
        return Ok(Some(r));
    }
    let docker_dir = docker::container_dir(spec_value, id);
    if let Some(dir) = &docker_dir
        && let Some(r) = docker::label_request(dir)?
    {
        return Ok(Some(r));
    }
    if let Some(r) = request::from_env(&spec::process_env(spec_value))? {
        return Ok(Some(r));
    }
    match &docker_dir {
        Some(dir) => Ok(docker::gpus_request(dir)?),
        None => Ok(None),
    }
}

/// Allocates for a container that asks for GPUs and rewrites its spec. `None`: the
/// container asked for nothing and its bundle was not touched.
pub fn prepare(
    config: &Config,
    bundle: &Path,
    id: &str,
    hook: &HookCommand,
) -> Result<Option<Record>, ShimError> {
    let config_path = bundle.join("config.json");
    let mut spec_value = spec::read(&config_path)?;
    let holder = HolderId::new(id)?;
    let Some(request) = find_request(&spec_value, id)? else {
        return Ok(None);
    };
    assign::refuse_reserved(&spec::annotations(&spec_value))?;
    let token = ClaimToken::new(holder.clone())?;
    let meta = HolderMeta {
        source: "runtime".into(),
        bundle: Some(bundle.to_path_buf()),
        claim_digest: Some(token.digest()),
        ..HolderMeta::default()
    };
    let (inventory, record) = grant::allocate(config, &holder, &request, meta)?;
    let edited = assign::edit_spec(&mut spec_value, &inventory, &record, &token, hook)
        .map_err(ShimError::from)
        .and_then(|()| Ok(spec::write_atomic(&config_path, &spec_value)?));
    if let Err(err) = edited {
        Ledger::for_config(config)?.release(&holder)?;
        return Err(err);
    }
    Ok(Some(record))
}
