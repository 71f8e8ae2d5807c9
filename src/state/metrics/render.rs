//! The exposition text (Prometheus text format 0.0.4): names with the `gpupin_` prefix,
//! base units (`_bytes`, `_seconds`, `_ratio`), `_total` for counters, a HELP and TYPE line
//! for every family.

use super::Counters;
use crate::model::fence::{FenceState, Fences};
use crate::model::gpu::Inventory;
use crate::model::live::Live;
use crate::state::ledger::Record;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One GPU held by one holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    pub uuid: String,
    pub holder: String,
    pub kind: String,
    pub user: Option<String>,
    pub engine: Option<String>,
    pub shared: bool,
    /// Its process is gone and it waits to be reaped.
    pub gone: bool,
}

/// What the text is made from.
pub(crate) struct Snapshot<'a> {
    pub inventory: &'a Inventory,
    pub holdings: Vec<Holding>,
    pub holders: &'a [Record],
    pub queue_length: usize,
    pub oldest_wait_seconds: Option<u64>,
    pub counters: &'a Counters,
    pub live: Option<&'a [Live]>,
    /// Holders found idle: how people know each, and for how many seconds
    /// (`IdleHolder`).
    pub idle: Vec<IdleHolder>,
    /// The GPUs out of allocation; `None`: the fences file could not be read (then
    /// nothing is handed out).
    pub fences: Option<&'a Fences>,
}

/// A holder `gpupin serve` found idle, as the metrics label it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdleHolder {
    /// As `Holding::holder`: the name people know.
    pub holder: String,
    pub kind: String,
    pub user: Option<String>,
    /// How long its GPUs have all been under `idle_utilization`.
    pub seconds: u64,
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn start<'a>(out: &'a mut String, name: &str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out }
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value as the text format wants it: backslash, double quote and line feed
/// escaped (a container's name is the container's text).
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    let gpus = &s.inventory.gpus;
    // A GPU by its index, a MIG instance by its address (`0:2`).
    let index = |uuid: &str| match gpus.iter().find(|g| g.uuid == uuid) {
        Some(g) => g.index.to_string(),
        None => s
            .inventory
            .find_mig(uuid)
            .map_or_else(|| "?".to_string(), |m| m.address()),
    };

    let mut f = Family::start(&mut out, "gpupin_gpus", "gauge", "GPUs of the machine.");
    f.sample("gpupin_gpus", &[], gpus.len());

    let mut f = Family::start(
        &mut out,
        "gpupin_gpu_held",
        "gauge",
        "Whether a GPU is held (1) or free (0).",
    );
    for g in gpus {
        let held = s.holdings.iter().any(|h| h.uuid == g.uuid);
        let i = g.index.to_string();
        let labels = [("gpu", i.as_str()), ("uuid", &g.uuid), ("model", &g.name)];
        f.sample("gpupin_gpu_held", &labels, u8::from(held));
    }

    if s.inventory.has_mig() {
        let mut f = Family::start(
            &mut out,
            "gpupin_mig_instance_held",
            "gauge",
            "Whether a MIG instance is held (1) or free (0), under its GPU.",
        );
        for m in s.inventory.mig_instances() {
            let held = s.holdings.iter().any(|h| h.uuid == m.uuid);
            let (gpu, address) = (m.parent_index.to_string(), m.address());
            let labels = [
                ("gpu", gpu.as_str()),
                ("instance", address.as_str()),
                ("uuid", &m.uuid),
                ("profile", m.profile_name()),
            ];
            f.sample("gpupin_mig_instance_held", &labels, u8::from(held));
        }
    }

    let mut f = Family::start(
        &mut out,
        "gpupin_gpu_fenced",
        "gauge",
        "Whether a GPU is out of allocation (1) in this state: drained by an admin, or its health says it needs a reset or a reboot. A MIG instance its health took out alone has its own series (gpu=\"0:1\") while it is out.",
    );
    let mut fenced = |address: &str, uuid: &str, fence: Option<&crate::model::fence::Fence>| {
        for state in [
            FenceState::Drained,
            FenceState::NeedsReset,
            FenceState::NeedsReboot,
        ] {
            let on = fence.is_some_and(|f| f.state == state);
            let labels = [("gpu", address), ("uuid", uuid), ("state", state.as_str())];
            f.sample("gpupin_gpu_fenced", &labels, u8::from(on));
        }
    };
    for g in gpus {
        fenced(
            &g.index.to_string(),
            &g.uuid,
            s.fences.and_then(|f| f.of(&g.uuid)),
        );
    }
    for m in gpus.iter().flat_map(|g| g.mig_instances()) {
        if let Some(fence) = s.fences.and_then(|f| f.of(&m.uuid)) {
            fenced(&m.address(), &m.uuid, Some(fence));
        }
    }
    let mut f = Family::start(
        &mut out,
        "gpupin_fences_unreadable",
        "gauge",
        "1 while the fences file cannot be trusted or read: no GPU is handed out meanwhile.",
    );
    f.sample(
        "gpupin_fences_unreadable",
        &[],
        u8::from(s.fences.is_none()),
    );

    let mut f = Family::start(
        &mut out,
        "gpupin_gpu_holders",
        "gauge",
        "Holders of a GPU: more than one when it is shared.",
    );
    for g in gpus {
        let n = s.holdings.iter().filter(|h| h.uuid == g.uuid).count();
        f.sample("gpupin_gpu_holders", &[("gpu", &g.index.to_string())], n);
    }

    let mut f = Family::start(
        &mut out,
        "gpupin_gpu_holder",
        "gauge",
        "Who holds a GPU: 1 for each GPU and holder, with the holder's kind, user, engine and mode.",
    );
    for h in &s.holdings {
        let gpu = index(&h.uuid);
        let mode = if h.shared { "shared" } else { "exclusive" };
        let state = if h.gone { "gone" } else { "running" };
        let labels = [
            ("gpu", gpu.as_str()),
            ("holder", &h.holder),
            ("kind", &h.kind),
            ("user", h.user.as_deref().unwrap_or("")),
            ("engine", h.engine.as_deref().unwrap_or("")),
            ("mode", mode),
            ("state", state),
        ];
        f.sample("gpupin_gpu_holder", &labels, 1);
    }

    let mut by_kind: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in s.holders {
        let engine = r.container.as_ref().and_then(|c| c.engine.clone());
        *by_kind
            .entry((r.kind.as_str().to_string(), engine.unwrap_or_default()))
            .or_insert(0) += 1;
    }
    let mut f = Family::start(
        &mut out,
        "gpupin_holders",
        "gauge",
        "Holders in the ledger, by kind and engine.",
    );
    for ((kind, engine), n) in &by_kind {
        f.sample("gpupin_holders", &[("kind", kind), ("engine", engine)], n);
    }

    let mut f = Family::start(
        &mut out,
        "gpupin_holder_idle_seconds",
        "gauge",
        "How long a holder found idle (its GPUs all under idle_utilization for idle_after) has been; only idle holders have a sample.",
    );
    for i in &s.idle {
        let labels = [
            ("holder", i.holder.as_str()),
            ("kind", &i.kind),
            ("user", i.user.as_deref().unwrap_or("")),
        ];
        f.sample("gpupin_holder_idle_seconds", &labels, i.seconds);
    }

    let mut f = Family::start(
        &mut out,
        "gpupin_queue_length",
        "gauge",
        "Requests waiting for GPUs (gpupin.wait), containers and jobs alike.",
    );
    f.sample("gpupin_queue_length", &[], s.queue_length);
    let mut f = Family::start(
        &mut out,
        "gpupin_queue_oldest_wait_seconds",
        "gauge",
        "How long the request at the head of the queue has waited; 0 when none waits.",
    );
    f.sample(
        "gpupin_queue_oldest_wait_seconds",
        &[],
        s.oldest_wait_seconds.unwrap_or(0),
    );

    let c = s.counters;
    let mut f = Family::start(
        &mut out,
        "gpupin_allocations_total",
        "counter",
        "Allocations and holds since the audit log began, by holder kind.",
    );
    for kind in ["container", "exec", "hold"] {
        let n = c.allocations.get(kind).copied().unwrap_or(0);
        f.sample("gpupin_allocations_total", &[("kind", kind)], n);
    }
    let mut f = Family::start(
        &mut out,
        "gpupin_refusals_total",
        "counter",
        "Requests refused since the audit log began, by reason.",
    );
    for (reason, n) in &c.refusals {
        f.sample("gpupin_refusals_total", &[("reason", reason)], n);
    }
    let mut f = Family::start(
        &mut out,
        "gpupin_releases_total",
        "counter",
        "Holders that gave their GPUs back (release) or were reaped once their process was gone (reap).",
    );
    for event in ["release", "reap"] {
        let n = c.releases.get(event).copied().unwrap_or(0);
        f.sample("gpupin_releases_total", &[("event", event)], n);
    }

    let mut f = Family::start(
        &mut out,
        "gpupin_audit_write_failures_total",
        "counter",
        "Audit lines that could not be written (a full or read-only disk); see audit_failure.",
    );
    f.sample(
        "gpupin_audit_write_failures_total",
        &[],
        c.audit_write_failures,
    );

    let mut f = Family::start(
        &mut out,
        "gpupin_gpu_memory_total_bytes",
        "gauge",
        "Memory of a GPU (0 where unknown).",
    );
    for g in gpus {
        f.sample(
            "gpupin_gpu_memory_total_bytes",
            &[("gpu", &g.index.to_string())],
            g.memory_bytes,
        );
    }
    if let Some(live) = s.live {
        let mut f = Family::start(
            &mut out,
            "gpupin_gpu_utilization_ratio",
            "gauge",
            "GPU utilization, 0 to 1, as NVML or the live file reports it.",
        );
        // No sample for a GPU whose utilization the source does not tell.
        for (g, u) in gpus
            .iter()
            .zip(live)
            .filter_map(|(g, l)| Some((g, l.utilization?)))
        {
            let ratio = f64::from(u) / 100.0;
            f.sample(
                "gpupin_gpu_utilization_ratio",
                &[("gpu", &g.index.to_string())],
                ratio,
            );
        }
        let mut f = Family::start(
            &mut out,
            "gpupin_gpu_memory_free_bytes",
            "gauge",
            "Free memory of a GPU, as NVML or the live file reports it.",
        );
        for (g, l) in gpus.iter().zip(live) {
            f.sample(
                "gpupin_gpu_memory_free_bytes",
                &[("gpu", &g.index.to_string())],
                l.memory_free,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    #[test]
    fn every_family_has_help_and_type_and_label_values_are_escaped() {
        let inv = machine(2);
        let counters = Counters::default();
        let mut fences = Fences::default();
        fences.set(crate::model::fence::Fence {
            uuid: "GPU-test-0".into(),
            index: 0,
            mig: None,
            state: FenceState::NeedsReset,
            reason: "XID 79".into(),
            by: "gpupin serve".into(),
            since: 1,
            until_clear: false,
        });
        let snapshot = Snapshot {
            inventory: &inv,
            holdings: vec![Holding {
                uuid: "GPU-test-1".into(),
                holder: "we\"ird\\name\n".into(),
                kind: "container".into(),
                user: None,
                engine: Some("docker".into()),
                shared: false,
                gone: false,
            }],
            holders: &[],
            queue_length: 0,
            oldest_wait_seconds: None,
            counters: &counters,
            live: None,
            idle: vec![IdleHolder {
                holder: "notebook-7".into(),
                kind: "container".into(),
                user: Some("alice".into()),
                seconds: 4000,
            }],
            fences: Some(&fences),
        };
        let text = render(&snapshot);
        assert!(
            text.contains("gpupin_gpu_held{gpu=\"1\",uuid=\"GPU-test-1\""),
            "{text}"
        );
        assert!(text.contains("holder=\"we\\\"ird\\\\name\\n\""), "{text}");
        assert!(
            text.contains(
                "gpupin_holder_idle_seconds{holder=\"notebook-7\",kind=\"container\",user=\"alice\"} 4000"
            ),
            "{text}"
        );
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}: {text}");
        }
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("gpupin_gpu_held"))
                .count(),
            2
        );
        // A series for every GPU and state, 1 where it is in that state.
        let fenced: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("gpupin_gpu_fenced{"))
            .collect();
        assert_eq!(fenced.len(), 6, "{text}");
        let on: Vec<&&str> = fenced.iter().filter(|l| l.ends_with(" 1")).collect();
        assert_eq!(
            on,
            [&"gpupin_gpu_fenced{gpu=\"0\",uuid=\"GPU-test-0\",state=\"needs-reset\"} 1"]
        );
        assert!(text.contains("gpupin_fences_unreadable 0\n"), "{text}");
        let unreadable = render(&Snapshot {
            fences: None,
            ..snapshot
        });
        assert!(unreadable.contains("gpupin_fences_unreadable 1\n"));
    }

    #[test]
    fn mig_instances_are_under_their_gpu_and_a_holder_names_its_instance() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let instance = inv.find_mig("0:2").unwrap();
        let counters = Counters::default();
        let snapshot = Snapshot {
            inventory: &inv,
            holdings: vec![Holding {
                uuid: instance.uuid.clone(),
                holder: "c1".into(),
                kind: "container".into(),
                user: None,
                engine: None,
                shared: false,
                gone: false,
            }],
            holders: &[],
            queue_length: 0,
            oldest_wait_seconds: None,
            counters: &counters,
            live: None,
            idle: vec![],
            fences: None,
        };
        let text = render(&snapshot);
        let held = format!(
            "gpupin_mig_instance_held{{gpu=\"0\",instance=\"0:2\",uuid=\"{}\",profile=\"1g.10gb\"}} 1",
            instance.uuid
        );
        assert!(text.contains(&held), "{text}");
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("gpupin_mig_instance_held{"))
                .count(),
            4
        );
        assert!(
            text.contains("gpupin_gpu_holder{gpu=\"0:2\",holder=\"c1\""),
            "{text}"
        );
    }
}
