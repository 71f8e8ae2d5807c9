//! `driver` and `unrequested` in the config: how a container gets the driver's files, and
//! what becomes of NVIDIA's own request in a container that asks gpupin for nothing.

/// Where CDI specs are looked for unless the config says otherwise; a later dir wins.
pub(crate) const DEFAULT_CDI_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

/// The config's `driver` key: how a container gets the driver's files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Driver {
    /// CDI where an `nvidia.com/gpu` spec is found; otherwise the container starts
    /// without the driver's files, and the log says so.
    #[default]
    Auto,
    /// CDI, or a refusal: a container must not start without its driver.
    Cdi,
    /// gpupin gives devices only (another component supplies the driver).
    None,
}

impl Driver {
    pub const EXPECTED: &str = "expected one of auto, cdi, none";
}

impl std::str::FromStr for Driver {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "auto" => Ok(Driver::Auto),
            "cdi" => Ok(Driver::Cdi),
            "none" => Ok(Driver::None),
            _ => Err(()),
        }
    }
}

/// What to do with NVIDIA's own request (`NVIDIA_VISIBLE_DEVICES=all` or a list, a
/// `cdi.k8s.io` annotation, a volume-mount request) in a container that asks gpupin for
/// nothing: the config key `unrequested`.
///
/// The default is `Strip`. The `nvidia/cuda` images set `NVIDIA_VISIBLE_DEVICES=all` in
/// their env, so every container built on them asks NVIDIA's stack for every GPU whether
/// its user meant it or not. `Pass` lets such a container take every GPU unrecorded under
/// NVIDIA's runtime, beside the containers gpupin pinned; `Request` would hold every GPU
/// of the machine for it, exclusively, and so refuse it (or block everyone else) on a
/// shared machine. `Strip` gives it no GPU and holds nothing: a container gets GPUs by
/// asking gpupin, and a container that did not ask runs as it would on a machine without
/// GPUs. Device nodes already in the spec are not covered by this key: they always become
/// a gpupin request (`request`), since leaving them would hand out GPUs unrecorded and
/// stripping them would silently undo what the user asked their engine for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unrequested {
    /// A gpupin request: a list asks for that many GPUs (gpupin picks which), `all` for
    /// every GPU of the machine.
    Request,
    /// `NVIDIA_VISIBLE_DEVICES=void`, and NVIDIA's annotations and volume-mount requests
    /// removed: no GPU, nothing held.
    #[default]
    Strip,
    /// Left as it came (gpupin before this key existed).
    Pass,
}

impl Unrequested {
    pub const EXPECTED: &'static str = "expected request, strip or pass";
}

impl std::str::FromStr for Unrequested {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "request" => Ok(Unrequested::Request),
            "strip" => Ok(Unrequested::Strip),
            "pass" => Ok(Unrequested::Pass),
            _ => Err(()),
        }
    }
}
