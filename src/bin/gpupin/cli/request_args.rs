//! The request options `gpupin pick` and `gpupin exec` share, as annotation-named pairs
//! for `request::from_pairs` (which does all the validation).

use gpupin::command::Key;

#[derive(clap::Args)]
pub struct RequestArgs {
    /// How many GPUs: a positive integer or "all" (--gpus, as Docker names it, is the same)
    #[arg(long, visible_alias = "gpus")]
    pub count: Option<String>,
    /// GPUs by index, UUID or PCI bus id, comma-separated (instead of --count)
    #[arg(long)]
    pub devices: Option<String>,
    /// Selection policy (default: the configured one)
    #[arg(long, value_parser = ["topology", "pack", "spread", "least-loaded", "most-free"])]
    pub policy: Option<String>,
    /// Only GPUs with at least this much (free) memory, e.g. 40GiB
    #[arg(long)]
    pub memory: Option<String>,
    /// Only GPUs whose name contains this, ignoring case, e.g. H100
    #[arg(long)]
    pub model: Option<String>,
    /// exclusive (default) or shared
    #[arg(long)]
    pub share: Option<String>,
    /// Memory a shared holder reserves per GPU, e.g. 20GiB
    #[arg(long)]
    pub reserve: Option<String>,
    /// MIG instances of this profile (e.g. 1g.10gb), or "any" (the smallest that fits --memory); --count says how many
    #[arg(long)]
    pub mig: Option<String>,
}

impl RequestArgs {
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            (Key::Count, &self.count),
            (Key::Devices, &self.devices),
            (Key::Policy, &self.policy),
            (Key::Memory, &self.memory),
            (Key::Model, &self.model),
            (Key::Share, &self.share),
            (Key::Reserve, &self.reserve),
            (Key::Mig, &self.mig),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k.as_str(), v)))
        .collect()
    }
}
