//! gpupin's own names in a container's spec: the prefix of its annotations and Docker
//! labels, and the prefix of its env, spelled once where every layer may read them (the
//! request keys, the config's check of a trusted label, the hooks' quick tests).

/// Prefix of every annotation and Docker label gpupin reads or writes.
pub const ANNOTATION_PREFIX: &str = "gpupin.";
/// Prefix of every env name of a request.
pub const ENV_PREFIX: &str = "GPUPIN_";
/// The label a spawner sets to say whose a container is: not a request key, but read by
/// admission where the config trusts it (`trusted_user_label`), refused where it does not.
pub const USER_LABEL: &str = "gpupin.user";
