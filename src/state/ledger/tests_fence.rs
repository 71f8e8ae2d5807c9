//! GPUs out of allocation (`fences.json`): a drained GPU is never handed out (by count,
//! by name, as MIG instances, in a preview), its holders keep it, undrain brings it
//! back, a health fence ends at a reboot, and a fences file anyone else could have
//! written stops every allocation instead of being ignored.

use super::tests::{id, ledger};
use super::tests_mig::{ask, me};
use super::*;
use crate::base::message::one_line;
use crate::host::inventory::sim;
use crate::input::config::PolicyName;
use crate::model::fence::{Fence, FenceState, Fences};
use crate::policy::testing::machine;
use std::os::unix::fs::PermissionsExt;

fn take(l: &Ledger, m: &Machine, holder: &str, pairs: &[(&str, &str)]) -> Result<Vec<u32>, String> {
    l.allocate(&id(holder), &ask(pairs), m, me())
        .map(|a| a.record.indices)
        .map_err(|e| one_line(&e))
}

#[test]
fn a_drained_gpu_is_never_handed_out_and_undrain_brings_it_back() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let drained = l.drain(&[&inv.gpus[1]], "fan swap", "alice").unwrap();
    assert_eq!(drained.len(), 1);
    assert_eq!(
        l.fences().unwrap().of("GPU-test-1").map(|f| f.state),
        Some(FenceState::Drained)
    );

    assert_eq!(
        take(&l, &m, "a", &[("gpupin.count", "3")]).unwrap(),
        [0, 2, 3]
    );
    let before = l.records().unwrap();
    let err = take(&l, &m, "b", &[("gpupin.count", "1")]).unwrap_err();
    assert_eq!(
        err,
        "cannot allocate 1 GPU for b: 3 of 4 GPUs held, 1 out of allocation, 0 free; add gpupin.wait=10m to wait until they free up"
    );
    // A wait for more than the GPUs left in allocation cannot succeed, and says so.
    let err = take(
        &l,
        &m,
        "all",
        &[("gpupin.count", "4"), ("gpupin.wait", "1h")],
    )
    .unwrap_err();
    assert_eq!(
        err,
        "cannot allocate 4 GPUs for all: 3 of 4 GPUs held, 1 out of allocation, 0 free; 1 GPU is out of allocation (drained or unhealthy: gpupin status says why), so no wait helps: ask for at most 3"
    );
    let err = take(&l, &m, "c", &[("gpupin.devices", "1")]).unwrap_err();
    assert_eq!(
        err,
        "cannot allocate GPU 1 (GPU-test-1) for c: it is drained by alice: fan swap; it comes back with gpupin undrain 1"
    );
    assert_eq!(l.records().unwrap(), before, "nothing held after a refusal");
    // A preview (`gpupin pick`) says the same.
    let preview = l.preview(&ask(&[("gpupin.devices", "1")]), &m);
    assert!(one_line(&preview.unwrap_err()).contains("it is drained by alice"));

    let cleared = l.undrain(&["GPU-test-1"], "root").unwrap();
    assert_eq!(cleared.iter().map(|f| f.index).collect::<Vec<_>>(), [1]);
    assert!(l.fences().unwrap().is_empty());
    assert!(
        !l.dir().join(store::fences::FENCES_FILE).exists(),
        "no file without fences"
    );
    assert_eq!(take(&l, &m, "c", &[("gpupin.devices", "1")]).unwrap(), [1]);
    // Undraining a GPU that has no fence changes nothing.
    assert_eq!(l.undrain(&["GPU-test-1"], "root").unwrap(), Vec::new());
}

#[test]
fn its_holders_keep_a_drained_gpu_until_they_end() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    assert_eq!(
        take(&l, &m, "busy", &[("gpupin.devices", "0")]).unwrap(),
        [0]
    );
    l.drain(&[&inv.gpus[0]], "row remap pending", "root")
        .unwrap();
    let holders: Vec<String> = l
        .holders_of_gpus(&[&inv.gpus[0]])
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(holders, ["busy"]);
    assert_eq!(l.holders_of_gpus(&[&inv.gpus[1]]).unwrap(), Vec::new());
    l.release(&id("busy")).unwrap();
    assert_eq!(l.holders_of_gpus(&[&inv.gpus[0]]).unwrap(), Vec::new());
    // Still drained after its holder went.
    assert!(take(&l, &m, "next", &[("gpupin.devices", "0")]).is_err());
}

#[test]
fn a_drained_gpus_mig_instances_are_not_handed_out() {
    let (_t, l) = ledger();
    let inv = sim::machine("dgxa100mig").unwrap();
    let m = Machine::new(&inv, PolicyName::Pack);
    let mig_gpus: Vec<&crate::model::gpu::Gpu> =
        inv.gpus.iter().filter(|g| g.in_mig_mode()).collect();
    assert!(!mig_gpus.is_empty());
    // Every GPU in MIG mode drained: no instance is left to give.
    l.drain(&mig_gpus, "maintenance", "root").unwrap();
    let err = take(&l, &m, "a", &[("gpupin.mig", "1g.10gb")]).unwrap_err();
    assert!(err.starts_with("cannot allocate"), "{err}");
    let first = mig_gpus[0].mig_instances()[0].address();
    let err = take(&l, &m, "b", &[("gpupin.devices", &first)]).unwrap_err();
    assert!(err.contains("is out of allocation"), "{err}");
    let uuids: Vec<&str> = mig_gpus.iter().map(|g| g.uuid.as_str()).collect();
    l.undrain(&uuids, "root").unwrap();
    assert!(take(&l, &m, "a", &[("gpupin.mig", "1g.10gb")]).is_ok());
}

#[test]
fn a_reboot_ends_a_health_fence_but_not_a_drain() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let before_boot = |uuid: &str, index, state| Fence {
        uuid: uuid.into(),
        index,
        mig: None,
        state,
        reason: "XID 79".into(),
        by: "gpupin serve".into(),
        since: 1,
        until_clear: false,
    };
    let mut fences = Fences::default();
    fences.set(before_boot("GPU-test-0", 0, FenceState::NeedsReset));
    fences.set(before_boot("GPU-test-1", 1, FenceState::Drained));
    store::fences::store(l.dir(), &fences).unwrap();
    let left = l.fences().unwrap();
    assert_eq!(left.gpus.iter().map(|f| f.index).collect::<Vec<_>>(), [1]);
    let err = take(&l, &m, "a", &[("gpupin.count", "2")]).unwrap_err();
    assert!(err.contains("1 out of allocation"), "{err}");
    assert_eq!(take(&l, &m, "a", &[("gpupin.devices", "0")]).unwrap(), [0]);
}

/// Whoever could write the fences file could keep every GPU from everyone, or hand out
/// one an admin took out by removing its line. One that could be someone else's is
/// refused, and so is every allocation while it stands.
#[test]
fn a_fences_file_anyone_else_could_have_written_stops_allocation() {
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let plant = |how: &dyn Fn(&std::path::Path)| -> String {
        let (_t, l) = ledger();
        l.drain(&[&inv.gpus[0]], "maintenance", "root").unwrap();
        how(&l.dir().join(store::fences::FENCES_FILE));
        let err = take(&l, &m, "a", &[("gpupin.count", "1")]).unwrap_err();
        assert!(l.records().unwrap().is_empty(), "nothing held: {err}");
        err
    };
    let writable =
        plant(&|p| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).unwrap());
    assert!(
        writable.starts_with("refusing the fences file")
            && writable.contains("lets others write it"),
        "{writable}"
    );
    let linked = plant(&|p| {
        let target = p.with_extension("elsewhere");
        std::fs::rename(p, &target).unwrap();
        std::os::unix::fs::symlink(&target, p).unwrap();
    });
    assert!(linked.contains("a symlink"), "{linked}");
    let fifo = plant(&|p| {
        std::fs::remove_file(p).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
    });
    assert!(fifo.contains("FIFO"), "{fifo}");
    let torn = plant(&|p| std::fs::write(p, "{\"gpus\": [").unwrap());
    assert!(torn.starts_with("refusing the fences file"), "{torn}");
    // The positive control: the file as the ledger wrote it keeps GPU 0 out, no more.
    let (_t, l) = ledger();
    l.drain(&[&inv.gpus[0]], "maintenance", "root").unwrap();
    assert_eq!(take(&l, &m, "a", &[("gpupin.count", "1")]).unwrap(), [1]);
    let mode = std::fs::metadata(l.dir().join(store::fences::FENCES_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

/// An XID's fence has no end of its own (the event is told once); when the GPU goes on to
/// report a condition that asks as much until its reset (the driver's recovery action),
/// the fence follows it, and goes with it: the reset shows. An admin's drain and a fence
/// graver than the condition stand.
#[test]
fn an_xid_fence_follows_the_drivers_condition_and_goes_with_its_reset() {
    use crate::model::health::Action;
    let (_t, l) = ledger();
    let inv = machine(3);
    let gpu = |i: usize| &inv.gpus[i];
    // A condition's fence goes by itself once the condition does.
    let remap = l
        .fence_health(
            gpu(0).into(),
            FenceState::NeedsReset,
            "row remap pending",
            true,
        )
        .unwrap()
        .unwrap();
    assert!(remap.until_clear);
    assert_eq!(l.clear_health(gpu(0)).unwrap(), Some(remap));
    l.fence_health(gpu(0).into(), FenceState::NeedsReset, "XID 48", false)
        .unwrap();
    assert_eq!(
        l.clear_health(gpu(0)).unwrap(),
        None,
        "an XID's fence does not go by itself"
    );
    let followed = l
        .follow_condition(gpu(0), Action::Reset, "the driver asks for a GPU reset")
        .unwrap()
        .unwrap();
    assert_eq!(followed.state, FenceState::NeedsReset);
    assert_eq!(followed.reason, "XID 48; the driver asks for a GPU reset");
    assert!(followed.until_clear);
    assert_eq!(l.fences().unwrap().of("GPU-test-0"), Some(&followed));
    assert_eq!(
        l.follow_condition(gpu(0), Action::Reboot, "again").unwrap(),
        None,
        "followed once"
    );
    assert_eq!(l.clear_health(gpu(0)).unwrap(), Some(followed));
    assert!(l.fences().unwrap().is_empty());

    // A reboot's fence is not carried by a reset condition; it is by a reboot one, and
    // a reset fence by a reboot condition takes the graver state.
    l.fence_health(gpu(1).into(), FenceState::NeedsReboot, "XID 79", false)
        .unwrap();
    assert_eq!(
        l.follow_condition(gpu(1), Action::Reset, "r").unwrap(),
        None
    );
    assert_eq!(
        l.follow_condition(gpu(1), Action::RestartApp, "r").unwrap(),
        None
    );
    l.fence_health(gpu(2).into(), FenceState::NeedsReset, "XID 48", false)
        .unwrap();
    let graver = l
        .follow_condition(gpu(2), Action::Reboot, "b")
        .unwrap()
        .unwrap();
    assert_eq!(graver.state, FenceState::NeedsReboot);

    // An admin's drain is the admin's to end.
    l.undrain(&["GPU-test-1"], "root").unwrap();
    l.drain(&[gpu(1)], "fan swap", "root").unwrap();
    assert_eq!(
        l.follow_condition(gpu(1), Action::Reset, "r").unwrap(),
        None
    );
    assert!(!l.fences().unwrap().of("GPU-test-1").unwrap().until_clear);
}

/// An XID the driver blames on one MIG instance fences that instance alone: a request
/// that names it is told why and how it comes back, a request by profile gets the
/// GPU's other instances, and undrain by its UUID brings it back.
#[test]
fn an_instance_its_health_took_out_alone_is_not_handed_out_its_siblings_are() {
    let (_t, l) = ledger();
    let inv = sim::machine("dgxa100mig").unwrap();
    let m = Machine::new(&inv, PolicyName::Pack);
    let ones: Vec<&crate::model::mig::MigInstance> = inv
        .mig_instances()
        .filter(|i| i.profile.as_deref() == Some("1g.10gb"))
        .collect();
    assert_eq!(ones.len(), 2);
    let (sick, fine) = (ones[0], ones[1]);
    let fence = l
        .fence_health(sick.into(), FenceState::NeedsReset, "XID 48", false)
        .unwrap()
        .unwrap();
    assert_eq!(fence.address(), sick.address());
    assert_eq!(fence.named(), format!("MIG instance {}", sick.address()));

    let err = take(&l, &m, "a", &[("gpupin.devices", &sick.address())]).unwrap_err();
    assert_eq!(
        err,
        format!(
            "cannot allocate MIG instance {} ({}) for a: it needs a reset (XID 48); it comes back after the reset, or with gpupin undrain {}",
            sick.address(),
            sick.uuid,
            sick.address()
        )
    );
    let err = take(
        &l,
        &m,
        "b",
        &[("gpupin.mig", "1g.10gb"), ("gpupin.count", "2")],
    )
    .unwrap_err();
    assert!(
        err.contains("; 1 out of allocation (drained or unhealthy: gpupin status says why)"),
        "{err}"
    );
    let got = l
        .allocate(&id("c"), &ask(&[("gpupin.mig", "1g.10gb")]), &m, me())
        .unwrap();
    assert_eq!(got.record.gpus, std::slice::from_ref(&fine.uuid));
    // Its GPU's bigger instances are handed out as before.
    assert!(take(&l, &m, "d", &[("gpupin.mig", "3g.40gb")]).is_ok());

    let cleared = l.undrain(&[sick.uuid.as_str()], "root").unwrap();
    assert_eq!(cleared, [fence]);
    assert!(take(&l, &m, "e", &[("gpupin.devices", &sick.address())]).is_ok());
}

/// `gpupin reset`'s two steps: while a GPU is reset nothing is handed out on it; after a
/// reset its health fences go (an admin's drain stays); after a failed one its fence is
/// what it was.
#[test]
fn a_gpu_being_reset_goes_to_no_one_and_after_it_only_an_admins_drain_stays() {
    let (_t, l) = ledger();
    let inv = machine(3);
    let m = Machine::new(&inv, PolicyName::Pack);
    let gpu = |i: usize| &inv.gpus[i];
    l.fence_health(gpu(0).into(), FenceState::NeedsReset, "XID 48", false)
        .unwrap();
    l.drain(&[gpu(2)], "fan swap", "alice").unwrap();
    let before = l.begin_reset(&[gpu(0), gpu(1), gpu(2)], "root").unwrap();
    assert_eq!(
        before[0].as_ref().map(|f| f.state),
        Some(FenceState::NeedsReset)
    );
    assert_eq!(before[1], None);
    let err = take(&l, &m, "a", &[("gpupin.devices", "1")]).unwrap_err();
    assert!(
        err.contains("it is drained by root: being reset (gpupin reset)"),
        "{err}"
    );

    // GPU 0's reset failed: still needs one. GPU 1's went through: back. GPU 2's too,
    // and it stays drained.
    assert_eq!(
        l.end_reset(
            gpu(0),
            before[0].as_ref(),
            ResetEnd::Failed("In use"),
            "root"
        )
        .unwrap(),
        None
    );
    assert_eq!(l.fences().unwrap().of("GPU-test-0"), before[0].as_ref());
    assert_eq!(
        l.end_reset(gpu(1), None, ResetEnd::Done, "root").unwrap(),
        None
    );
    assert_eq!(take(&l, &m, "b", &[("gpupin.devices", "1")]).unwrap(), [1]);
    assert_eq!(
        l.end_reset(gpu(2), before[2].as_ref(), ResetEnd::Done, "root")
            .unwrap(),
        None
    );
    assert_eq!(l.fences().unwrap().of("GPU-test-2"), before[2].as_ref());

    // Once it goes through, GPU 0's health fence is cleared and said so.
    let again = l.begin_reset(&[gpu(0)], "root").unwrap();
    let cleared = l
        .end_reset(gpu(0), again[0].as_ref(), ResetEnd::Done, "root")
        .unwrap();
    assert_eq!(cleared.map(|f| f.reason), Some("XID 48".to_string()));
    assert!(l.fences().unwrap().of("GPU-test-0").is_none());
}

/// Every fence set or taken away, and every health event that fences nothing, is a line
/// of the trail: what, which GPU (or instance) by the name people use, who, why.
#[test]
fn fences_and_health_events_are_in_the_trail() {
    let (_t, l) = ledger();
    let inv = sim::machine("dgxa100mig").unwrap();
    let whole = inv.gpus.iter().find(|g| !g.in_mig_mode()).unwrap();
    let instance = inv.mig_instances().next().unwrap();
    l.drain(&[whole], "fan swap", "alice").unwrap();
    l.fence_health(instance.into(), FenceState::NeedsReset, "XID 48", false)
        .unwrap();
    l.note_health(whole.into(), "restart-app", "XID 13");
    l.undrain(&[whole.uuid.as_str()], "root").unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(l.dir().join("audit.log"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seen: Vec<[String; 5]> = lines
        .iter()
        .map(|e| {
            ["event", "holder", "user", "code", "reason"]
                .map(|k| e[k].as_str().unwrap_or_default().to_string())
        })
        .collect();
    let gpu = format!("gpu-{}", whole.index);
    let inst = format!("gpu-{}", instance.address());
    let row = |a: &str, b: &str, c: &str, d: &str, e: &str| [a, b, c, d, e].map(str::to_string);
    assert_eq!(
        seen,
        [
            row("drain", &gpu, "alice", "drained", "fan swap"),
            row("drain", &inst, "gpupin serve", "needs-reset", "XID 48"),
            row("health", &gpu, "gpupin serve", "restart-app", "XID 13"),
            row("undrain", &gpu, "root", "drained", "was drained: fan swap"),
        ]
    );
    assert_eq!(lines[1]["gpus"][0]["uuid"], instance.uuid.as_str());
    assert_eq!(lines[1]["gpus"][0]["index"], instance.parent_index);
}
