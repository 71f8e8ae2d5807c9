//! What a check finds, as data: a status, one line saying what was found, and one line
//! saying how to fix it. The CLI prints them; scripts read the JSON.

use serde::Serialize;

/// How bad a finding is. Only `Problem` makes `gpupin doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Ok,
    /// Works, but less well than it could, or only for a simulated machine.
    Warn,
    /// Something gpupin needs is broken or missing: containers or jobs will fail.
    Problem,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Problem => "problem",
        }
    }
}

/// One thing a check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The check that found it, a stable name for scripts (`driver`, `state_dir`, ...).
    pub check: &'static str,
    pub status: Status,
    /// What was found, on one line, starting with what it is about.
    pub what: String,
    /// How to fix it, on one line; `None` when there is nothing to do.
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: &'static str, status: Status, what: impl Into<String>) -> Finding {
        Finding {
            check,
            status,
            // Paths and error texts come from the host (a file name may hold a newline):
            // a finding stays one line whatever they hold.
            what: crate::base::message::escape_controls(&what.into()),
            fix: None,
        }
    }

    pub fn ok(check: &'static str, what: impl Into<String>) -> Finding {
        Finding::new(check, Status::Ok, what)
    }

    pub fn warn(check: &'static str, what: impl Into<String>) -> Finding {
        Finding::new(check, Status::Warn, what)
    }

    pub fn problem(check: &'static str, what: impl Into<String>) -> Finding {
        Finding::new(check, Status::Problem, what)
    }

    /// The finding with how to fix it.
    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(crate::base::message::escape_controls(&fix.into()));
        self
    }
}

/// Everything `doctor::examine` found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// NVML's readings beside `nvidia-smi -q -x`'s, one entry per GPU; empty where
    /// either could not be read.
    pub nvml_vs_nvidia_smi: Vec<super::smi::Comparison>,
}

impl Report {
    pub fn count(&self, status: Status) -> usize {
        self.findings.iter().filter(|f| f.status == status).count()
    }

    pub fn has_problems(&self) -> bool {
        self.count(Status::Problem) > 0
    }

    /// `{"ok", "problems", "warnings", "findings": [...], "nvml_vs_nvidia_smi": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ok": !self.has_problems(),
            "problems": self.count(Status::Problem),
            "warnings": self.count(Status::Warn),
            "findings": self.findings,
            "nvml_vs_nvidia_smi": self.nvml_vs_nvidia_smi,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finding_stays_on_one_line_whatever_a_path_holds() {
        let f = Finding::problem("state_dir", "state dir /tmp/a\nb: it is a symlink")
            .fix("rm /tmp/a\nb");
        assert_eq!(f.what, "state dir /tmp/a\\nb: it is a symlink");
        assert_eq!(f.fix.as_deref(), Some("rm /tmp/a\\nb"));
    }

    #[test]
    fn only_problems_count_against_the_host() {
        let mut report = Report::default();
        report.findings.push(Finding::ok("a", "fine"));
        report
            .findings
            .push(Finding::warn("b", "so so").fix("do x"));
        assert!(!report.has_problems());
        report
            .findings
            .push(Finding::problem("c", "broken").fix("do y"));
        let json = report.to_json();
        assert_eq!(json["ok"], false);
        assert_eq!(
            (json["problems"].as_u64(), json["warnings"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(
            json["findings"][2],
            serde_json::json!({"check": "c", "status": "problem", "what": "broken", "fix": "do y"})
        );
        assert_eq!(json["findings"][0]["fix"], serde_json::Value::Null);
    }
}
