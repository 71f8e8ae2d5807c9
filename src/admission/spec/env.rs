//! `process.env` reads and edits.

use super::SpecError;
use serde_json::Value;

/// `process.env` as a list of `KEY=VALUE` strings (empty when absent; non-string
/// entries, which the runtime would reject anyway, are skipped).
pub fn process_env(spec: &Value) -> Vec<String> {
    let Some(Value::Array(env)) = spec.get("process").and_then(|p| p.get("env")) else {
        return Vec::new();
    };
    env.iter()
        .filter_map(|entry| entry.as_str().map(str::to_owned))
        .collect()
}

/// Sets `key=value` in `process.env`, replacing every earlier occurrence in place (the
/// last occurrence wins for the NVIDIA hook, so a duplicate must never be appended).
///
/// The first `KEY=` entry takes the new value and keeps its position; later `KEY=`
/// entries are removed; the entry is appended only when absent. `process` and
/// `process.env` are created when missing.
pub(crate) fn set_env(spec: &mut Value, key: &str, value: &str) -> Result<(), SpecError> {
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return Err(SpecError::InvalidEnvKey {
            key: key.to_owned(),
        });
    }
    let env = env_array_mut(spec)?;
    let prefix = format!("{key}=");
    let entry = Value::String(format!("{prefix}{value}"));
    let is_key = |v: &Value| v.as_str().is_some_and(|s| s.starts_with(&prefix));
    let Some(first) = env.iter().position(is_key) else {
        env.push(entry);
        return Ok(());
    };
    // Keep only the first occurrence; nothing before it moves, so `first` stays valid.
    let mut seen = false;
    env.retain(|v| !is_key(v) || !std::mem::replace(&mut seen, true));
    env[first] = entry;
    Ok(())
}

/// `process.env` as a mutable array, creating `process` and `env` when absent.
fn env_array_mut(spec: &mut Value) -> Result<&mut Vec<Value>, SpecError> {
    super::edit::array_at(spec, &["process", "env"], "process.env")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        serde_json::from_str(
            r#"{"ociVersion":"1.0.2","zeta":1,"process":{"terminal":false,
            "env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=0,1","HOME=/root",
            "NVIDIA_VISIBLE_DEVICES=all","NVIDIA_VISIBLE_DEVICES_X=keep"],"cwd":"/"},
            "alpha":{"b":2,"a":1},"root":{"path":"rootfs"}}"#,
        )
        .unwrap()
    }

    /// Everything but `process.env`, serialized: key order included.
    fn without_env(spec: &Value) -> String {
        let mut spec = spec.clone();
        spec["process"]["env"] = Value::Null;
        serde_json::to_string(&spec).unwrap()
    }

    #[test]
    fn duplicates_are_replaced_in_place() {
        let mut spec = sample();
        set_env(&mut spec, "NVIDIA_VISIBLE_DEVICES", "GPU-a").unwrap();
        assert_eq!(
            process_env(&spec),
            [
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=GPU-a",
                "HOME=/root",
                "NVIDIA_VISIBLE_DEVICES_X=keep"
            ]
        );
    }

    #[test]
    fn other_keys_and_order_are_untouched() {
        let before = sample();
        let mut after = before.clone();
        set_env(&mut after, "NVIDIA_VISIBLE_DEVICES", "3").unwrap();
        set_env(&mut after, "NEW", "x").unwrap();
        assert_eq!(without_env(&before), without_env(&after));
        assert!(without_env(&after).starts_with(r#"{"ociVersion":"1.0.2","zeta":1,"#));
    }

    #[test]
    fn absent_key_is_appended_once() {
        let mut spec = sample();
        set_env(&mut spec, "NEW", "1").unwrap();
        set_env(&mut spec, "NEW", "2").unwrap();
        let env = process_env(&spec);
        assert_eq!(env.last().unwrap(), "NEW=2");
        assert_eq!(env.iter().filter(|e| e.starts_with("NEW=")).count(), 1);
    }

    #[test]
    fn missing_process_and_env_are_created() {
        let mut spec = json!({"ociVersion": "1.0.2"});
        set_env(&mut spec, "A", "b").unwrap();
        assert_eq!(
            spec,
            json!({"ociVersion": "1.0.2", "process": {"env": ["A=b"]}})
        );
        let mut spec = json!({"process": {"cwd": "/"}});
        set_env(&mut spec, "A", "b").unwrap();
        assert_eq!(spec, json!({"process": {"cwd": "/", "env": ["A=b"]}}));
    }

    #[test]
    fn wrong_types_are_rejected_and_spec_is_unchanged() {
        for bad in [
            json!({"process": {"env": "A=b"}}),
            json!({"process": []}),
            json!([1]),
        ] {
            let mut spec = bad.clone();
            let err = set_env(&mut spec, "A", "c").unwrap_err();
            assert!(matches!(err, SpecError::WrongType { .. }), "{err}");
            assert_eq!(spec, bad);
        }
    }

    #[test]
    fn invalid_keys_are_rejected() {
        for key in ["", "A=B", "A\0"] {
            let err = set_env(&mut sample(), key, "v").unwrap_err();
            assert!(matches!(err, SpecError::InvalidEnvKey { .. }));
        }
    }

    #[test]
    fn env_read_skips_non_strings() {
        let spec = json!({"process": {"env": ["A=1", 2, null, "B=2"]}});
        assert_eq!(process_env(&spec), ["A=1", "B=2"]);
        assert!(process_env(&json!({})).is_empty());
    }
}
