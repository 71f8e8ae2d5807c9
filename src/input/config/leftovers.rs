//! The `leftovers` setting: what a confined job's leftover processes get. `jobs/exec`
//! acts on it with `host::confine`'s plain `populated` and `kill`.

/// Config key `leftovers`: what happens to the processes a confined job leaves in its
/// cgroup when its main process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Leftovers {
    /// The job keeps its GPUs (and counts toward its user's limit) until its cgroup is
    /// empty: nothing a user started is killed behind their back.
    #[default]
    Wait,
    /// The leftovers get SIGKILL, then the GPUs are released.
    Kill,
}

impl Leftovers {
    pub const EXPECTED: &'static str = "expected \"wait\" or \"kill\"";

    /// The config's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Leftovers::Wait => "wait",
            Leftovers::Kill => "kill",
        }
    }
}

impl std::str::FromStr for Leftovers {
    type Err = ();

    fn from_str(value: &str) -> Result<Self, ()> {
        match value {
            "wait" => Ok(Leftovers::Wait),
            "kill" => Ok(Leftovers::Kill),
            _ => Err(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_reads_back_as_the_config_writes_it() {
        for value in [Leftovers::Wait, Leftovers::Kill] {
            assert_eq!(value.as_str().parse::<Leftovers>(), Ok(value));
        }
        assert_eq!(Leftovers::default().as_str(), "wait");
    }
}
