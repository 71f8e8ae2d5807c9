//! gpupin's own names in a container's spec: the prefix of its annotations and Docker
//! labels, and the prefix of its env, spelled once where every layer may read them (the
//! request keys, the config's check of a trusted label, the hooks' quick tests).

/// A name gpupin reads or writes in annotations and Docker labels: `gpupin.` and `$name`.
/// `concat!` takes only literals, hence a macro, the one place the prefix is spelled.
macro_rules! annotation {
    ($name:literal) => {
        concat!("gpupin.", $name)
    };
}
pub(crate) use annotation;

/// A request's env name: `GPUPIN_` and `$name`, the one place the prefix is spelled.
macro_rules! env_name {
    ($name:literal) => {
        concat!("GPUPIN_", $name)
    };
}
pub(crate) use env_name;

/// Prefix of every annotation and Docker label gpupin reads or writes.
pub(crate) const ANNOTATION_PREFIX: &str = annotation!("");
/// Prefix of every env name of a request.
pub(crate) const ENV_PREFIX: &str = env_name!("");
/// The label a spawner sets to say whose a container is: not a request key, but read by
/// admission where the config trusts it (`trusted_user_label`), refused where it does not.
pub(crate) const USER_LABEL: &str = annotation!("user");
