//! The admission pipeline. Every entry point that gives a container GPUs (the prestart
//! hook, podman's precreate, the Docker shim, and what comes after them) goes through it:
//!
//! ```text
//! request (the entry point finds it with request::find)
//!   -> grant: the machine (inventory, live figures when the request needs them)
//!             and the ledger's allocation under its lock, or a wait in its queue
//!   -> ContainerEdits from the record, with the claim for a spec edited before create
//!   -> the entry point's consumer applies them (edits::spec, edits::inject)
//!   -> on failure the GPUs go back at once, and both errors are kept
//! ```

use crate::admission::driver::{self, DriverError};
use crate::admission::edits::{ApplyError, ContainerEdits, EditsError, HookCommand};
use crate::admission::grant::{self, GrantError};
use crate::admission::trusted_user::{self, TrustedUserError};
use crate::input::config::{Config, Driver};
use crate::input::request::GpuRequest;
use crate::model::holder::HolderId;
use crate::state::ledger::{ClaimToken, HolderMeta, Ledger, LedgerError, Record};
use std::collections::HashMap;

/// One container's admission.
pub struct Admission<'a> {
    pub holder: &'a HolderId,
    pub request: &'a GpuRequest,
    pub meta: HolderMeta,
    /// For a spec edited before create: the claim its record is made with, and how the
    /// runtime calls gpupin back to bind and release it.
    pub claim: Option<Claim<'a>>,
    /// The Slurm job the container's env names (`request::slurm_job`): its request takes
    /// from that job's hold where the config trusts containers with it (`in_slurm_job`).
    pub slurm_job: Option<HolderId>,
    /// The container's annotations and, for Docker, its labels: a trusted one names
    /// whose it is (`trusted_user`), and then `[limits]` apply.
    pub labels: HashMap<String, String>,
}

pub struct Claim<'a> {
    pub token: &'a ClaimToken,
    pub hook: &'a HookCommand,
    /// The runtime applies CDI specs itself (NRI's adjustment names CDI devices): under
    /// `driver = "cdi"` the edits name the GPUs' CDI devices (`cdi_devices`) instead of
    /// carrying the spec's edits, so that the runtime applies all of it (groups too).
    pub driver_by_name: bool,
}

/// Why an admission failed. `E` is the error of the caller's `apply` (the library's own
/// consumers return `ApplyError`; another entry point, say an NRI plugin, its own).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError<E = ApplyError>
where
    E: std::error::Error + 'static,
{
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Edits(#[from] EditsError),
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    User(#[from] TrustedUserError),
    #[error("giving container {id} its GPUs")]
    Apply {
        id: String,
        #[source]
        source: E,
    },
    /// The admission failed, and so did releasing what it had allocated: the GPUs stay
    /// held until gc reaps the holder. Both errors are kept.
    #[error("{}", undo_message(.error, .holder, .undo))]
    Undo {
        error: Box<AdmitError<E>>,
        holder: String,
        undo: LedgerError,
    },
}

fn undo_message<E: std::error::Error + 'static>(
    error: &AdmitError<E>,
    holder: &str,
    undo: &LedgerError,
) -> String {
    format!(
        "{}; releasing the GPUs of {holder} again failed too: {}",
        crate::base::message::one_line(error),
        crate::base::message::one_line(undo)
    )
}

/// Allocates for `admission`, builds the container's edits and hands them to `apply`.
/// Returns the record and what `apply` returned. On any failure after the allocation the
/// holder's GPUs are released before the error is returned.
pub fn admit<T, E: std::error::Error + 'static>(
    config: &Config,
    admission: Admission<'_>,
    apply: impl FnOnce(&ContainerEdits) -> Result<T, E>,
) -> Result<(Record, T), AdmitError<E>> {
    let Admission {
        holder,
        request,
        mut meta,
        claim,
        slurm_job,
        labels,
    } = admission;
    let request = &in_slurm_job(config, request, slurm_job.as_ref());
    if let Some(owner) = trusted_user::owner(config, &labels)? {
        // Root's containers, like root's own requests, are not limited.
        meta.limited = owner.uid != 0;
        meta.owner = Some(owner);
    }
    if let Some(claim) = &claim {
        meta.claim_digest = Some(claim.token.digest());
    }
    // Debug-formatted: a model name or device key is the container's text.
    tracing::debug!(
        holder = %holder,
        origin = ?request.origin,
        request = ?request,
        source = meta.source.as_str(),
        "request"
    );
    // The driver's files need the spec edited before create, which only a claim's
    // consumers do: `driver = "cdi"` refuses the prestart path before anything is held.
    if claim.is_none() {
        driver::check_prestart(config.driver)?;
    }
    let (inventory, record) = grant::allocate(config, holder, request, meta)?;
    if claim.is_none() {
        driver::note_prestart(config.driver, holder.as_str());
    }
    let given = ContainerEdits::for_record(&inventory, &record)
        .map_err(AdmitError::from)
        .map(|edits| match &claim {
            Some(claim) => edits.with_claim(&record, claim.token, claim.hook),
            None => edits,
        })
        .and_then(|mut edits| {
            let by_name = claim.as_ref().is_some_and(|c| c.driver_by_name);
            if by_name && config.driver == Driver::Cdi {
                driver::add_by_name(&config.cdi_spec_dirs, &inventory, &record.gpus, &mut edits)?;
            } else if claim.is_some() {
                driver::add_for_spec(
                    config.driver,
                    &config.cdi_spec_dirs,
                    &inventory,
                    &record.gpus,
                    holder.as_str(),
                    &mut edits,
                )?;
            }
            Ok(edits)
        })
        .and_then(|edits| {
            apply(&edits).map_err(|source| AdmitError::Apply {
                id: holder.to_string(),
                source,
            })
        });
    match given {
        Ok(out) => Ok((record, out)),
        Err(error) => Err(undo(config, holder, error)),
    }
}

/// The Slurm rule (`GpuRequest::enter_slurm_job`) for a container, where
/// `slurm_containers` says a container's word for its job may be taken: no engine tells
/// who started a container, so its env could name any job. Whether the hold exists is
/// one lstat; an unreadable state dir fails the allocation right after with its own error.
fn in_slurm_job(config: &Config, request: &GpuRequest, job: Option<&HolderId>) -> GpuRequest {
    let mut request = request.clone();
    if config.slurm_containers
        && request.enter_slurm_job(job, |hold| {
            Ledger::open_read_only(&config.ledger_settings()).is_ok_and(|l| l.holds(hold))
        })
    {
        tracing::info!(within = ?request.within, "inside a Slurm job: taking from its hold");
    }
    request
}

/// Releases `holder` after `error`; an error of the release itself joins the first.
fn undo<E: std::error::Error + 'static>(
    config: &Config,
    holder: &HolderId,
    error: AdmitError<E>,
) -> AdmitError<E> {
    tracing::debug!(holder = %holder, error = %crate::base::message::one_line(&error), "undoing the allocation");
    let released = crate::state::open_ledger(config).and_then(|ledger| ledger.release(holder));
    match released {
        Ok(_) => error,
        Err(undo) => AdmitError::Undo {
            error: Box::new(error),
            holder: holder.to_string(),
            undo,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::request::{Origin, Selection};
    use std::os::unix::fs::PermissionsExt;

    fn config(state_dir: &std::path::Path) -> Config {
        Config {
            state_dir: state_dir.to_path_buf(),
            inventory: "sim:nvswitch8".parse().unwrap(),
            // Not /var/log: audit_failure = "refuse" would refuse a user who cannot write it.
            audit_log: state_dir.join("audit.log"),
            ..Config::default()
        }
    }

    fn admission<'a>(holder: &'a HolderId, request: &'a GpuRequest) -> Admission<'a> {
        Admission {
            holder,
            request,
            meta: HolderMeta::default(),
            claim: None,
            slurm_job: None,
            labels: Default::default(),
        }
    }

    /// Slurm job 42's prolog has held GPUs 5 and 6; `c1`'s env says it runs in job 42.
    fn in_job_42(config: &Config) -> (HolderId, GpuRequest) {
        crate::jobs::hold::testing::roots(config, "slurm-42", "5,6");
        (
            HolderId::new("c1").unwrap(),
            GpuRequest::new(Selection::Count(2), Origin::Env),
        )
    }

    #[test]
    fn a_container_in_a_slurm_job_takes_the_jobs_gpus_with_the_jobs_key() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            slurm_containers: true,
            ..config(&tmp.path().join("state"))
        };
        let (holder, mut request) = in_job_42(&config);
        let ledger = crate::state::open_ledger(&config).unwrap();
        let (_, key) = ledger
            .key(&HolderId::new("slurm-42").unwrap())
            .unwrap()
            .unwrap();
        request.within_key = Some(key);
        let admission = Admission {
            slurm_job: crate::input::request::slurm_job(&["SLURM_JOB_ID=42"]),
            labels: Default::default(),
            ..admission(&holder, &request)
        };
        let (record, ()) = admit(&config, admission, |_| Ok::<_, ApplyError>(())).unwrap();
        assert_eq!(record.indices, [5, 6]);
        assert_eq!(record.request.within.as_deref(), Some("slurm-42"));
    }

    /// An image's `ENV SLURM_JOB_ID=42` (or its author's `-e`) is text anyone can write:
    /// without job 42's key it takes nothing, from the job or from the free pool.
    #[test]
    fn a_containers_slurm_job_id_alone_takes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            slurm_containers: true,
            ..config(&tmp.path().join("state"))
        };
        let (holder, request) = in_job_42(&config);
        let admission = Admission {
            slurm_job: crate::input::request::slurm_job(&["SLURM_JOB_ID=42"]),
            labels: Default::default(),
            ..admission(&holder, &request)
        };
        let err = admit(&config, admission, |_| Ok::<_, ApplyError>(())).unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(
            text.starts_with("cannot allocate for c1: taking GPUs from slurm-42 needs its key"),
            "{text}"
        );
        let ledger = crate::state::open_ledger(&config).unwrap();
        let ids: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["slurm-42"]);
    }

    #[test]
    fn a_containers_slurm_job_is_ignored_unless_the_config_trusts_it() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(&tmp.path().join("state"));
        let (holder, request) = in_job_42(&config);
        let admission = Admission {
            slurm_job: crate::input::request::slurm_job(&["SLURM_JOB_ID=42"]),
            labels: Default::default(),
            ..admission(&holder, &request)
        };
        let (record, ()) = admit(&config, admission, |_| Ok::<_, ApplyError>(())).unwrap();
        assert!(!record.indices.contains(&5) && !record.indices.contains(&6));
        assert_eq!(record.request.within, None);
    }

    #[test]
    fn a_slurm_job_without_a_hold_leaves_the_request_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            slurm_containers: true,
            ..config(&tmp.path().join("state"))
        };
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(1), Origin::Env);
        let admission = Admission {
            slurm_job: crate::input::request::slurm_job(&["SLURM_JOB_ID=43"]),
            labels: Default::default(),
            ..admission(&holder, &request)
        };
        let (record, ()) = admit(&config, admission, |_| Ok::<_, ApplyError>(())).unwrap();
        assert_eq!(record.request.within, None);
    }

    #[test]
    fn the_consumer_gets_the_records_gpus_and_the_holder_keeps_them() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(&tmp.path().join("state"));
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(2), Origin::Annotations);
        let (record, nodes) = admit(&config, admission(&holder, &request), |edits| {
            Ok::<_, ApplyError>(edits.nodes.len())
        })
        .unwrap();
        assert_eq!(record.gpus.len(), 2);
        assert_eq!(nodes, 2 + 3, "two GPU nodes and three control nodes");
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert_eq!(ledger.records().unwrap(), [record]);
    }

    #[test]
    fn a_callers_own_error_comes_back_as_the_apply_error_and_nothing_stays_held() {
        // Another entry point (an NRI plugin, say) returns its own error from `apply`.
        #[derive(Debug, thiserror::Error)]
        #[error("the runtime said no")]
        struct RuntimeSaidNo;
        let tmp = tempfile::tempdir().unwrap();
        let config = config(&tmp.path().join("state"));
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let err = admit(&config, admission(&holder, &request), |_| {
            Err::<(), _>(RuntimeSaidNo)
        })
        .unwrap_err();
        assert!(matches!(&err, AdmitError::Apply { id, source: RuntimeSaidNo } if id == "c1"));
        assert_eq!(
            crate::base::message::one_line(&err),
            "giving container c1 its GPUs: the runtime said no"
        );
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert!(ledger.records().unwrap().is_empty());
    }

    #[test]
    fn a_failed_consumer_leaves_nothing_held() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(&tmp.path().join("state"));
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let err = admit(
            &config,
            admission(&holder, &request),
            |_| -> Result<(), _> { Err(ApplyError::NeedsCreate("a cpuset")) },
        )
        .unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert_eq!(
            text,
            "giving container c1 its GPUs: a cpuset can only be given by editing the spec before create"
        );
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert!(ledger.records().unwrap().is_empty());
    }

    #[test]
    fn a_spec_edit_gets_the_cdi_entries_and_a_missing_one_holds_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = tmp.path().join("cdi");
        std::fs::create_dir(&cdi).unwrap();
        // Entries for GPU 0 only; the pack policy picks GPU 0 first.
        std::fs::write(
            cdi.join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n  - name: \"0\"\n    containerEdits:\n      deviceNodes: [{path: /dev/nvidia0, major: 195}]\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n  mounts: [{hostPath: /r/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1}]\n",
        )
        .unwrap();
        let config = Config {
            cdi_spec_dirs: vec![cdi],
            policy: "pack".parse().unwrap(),
            ..config(&tmp.path().join("state"))
        };
        let token = ClaimToken::new(HolderId::new("c1").unwrap()).unwrap();
        let hook = HookCommand::beside(std::path::Path::new("/usr/bin/gpupin"), None);
        let request_one = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let claimed = |holder| Admission {
            claim: Some(Claim {
                token: &token,
                hook: &hook,
                driver_by_name: false,
            }),
            ..admission(holder, &request_one)
        };
        let c1 = HolderId::new("c1").unwrap();
        let (record, edits) = admit(&config, claimed(&c1), |edits| {
            Ok::<_, ApplyError>(edits.clone())
        })
        .unwrap();
        let env: Vec<(&str, &str)> = edits
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, [("NVIDIA_VISIBLE_DEVICES", "void")]);
        assert_eq!(
            edits.annotations[0],
            ("gpupin.assigned".into(), record.gpus.join(","))
        );
        assert_eq!(edits.mounts[0].destination, "/usr/lib/libcuda.so.1");
        // GPU 0 is held: the next container gets GPU 1, which the spec lacks.
        let c2 = HolderId::new("c2").unwrap();
        let err = admit(&config, claimed(&c2), |_| Ok::<_, ApplyError>(())).unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(text.starts_with("no entry for GPU 1 ("), "{text}");
        let ledger = crate::state::open_ledger(&config).unwrap();
        assert_eq!(ledger.records().unwrap(), [record], "c2 holds nothing");
    }

    #[test]
    fn driver_cdi_refuses_the_prestart_path_before_holding_anything() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            driver: crate::input::config::Driver::Cdi,
            ..config(&tmp.path().join("state"))
        };
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let err = admit(&config, admission(&holder, &request), |_| {
            Ok::<_, ApplyError>(())
        })
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("driver = \"cdi\" needs the spec edited before create"),
            "{err}"
        );
        assert!(!tmp.path().join("state").join("holders").exists());
    }

    #[test]
    fn a_failed_undo_keeps_both_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let config = config(&state);
        let holder = HolderId::new("c1").unwrap();
        let request = GpuRequest::new(Selection::Count(1), Origin::Annotations);
        let err = admit(
            &config,
            admission(&holder, &request),
            |_| -> Result<(), _> {
                // The state dir turns unsafe between allocation and undo: the release is
                // refused, as an operator's mistake would make it.
                std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
                Err(ApplyError::NeedsCreate("a cpuset"))
            },
        )
        .unwrap_err();
        let text = crate::base::message::one_line(&err);
        assert!(
            text.starts_with("giving container c1 its GPUs: a cpuset can only")
                && text.contains("; releasing the GPUs of c1 again failed too: refusing state dir"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }
}
