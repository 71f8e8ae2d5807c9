//! Which holder a name given to `gpupin release` or `gpupin evict` means: what `gpupin
//! status` shows (a container's name, or the holder's id), the full id, or a prefix of a
//! container's id as `docker ps` shortens it. A name that fits several holders means
//! none of them: releasing the wrong holder hands a running job's GPUs to someone else.
//! Scripts name holders by their exact id (`Match::Exact`): a container a user named
//! `slurm-43` must not be what the epilog of job 43 releases.

use crate::model::holder::HolderKind;
use crate::state::ledger::LedgerError;
use crate::state::ledger::record::Record;

/// The shortest id prefix taken: shorter ones fit too many holders to be meant.
pub(crate) const MIN_PREFIX: usize = 4;

#[derive(Debug, PartialEq)]
pub(crate) enum Lookup<'r> {
    Found(&'r Record),
    /// Each of these fits equally well.
    Ambiguous(Vec<&'r Record>),
    NotFound,
}

/// How a name may fit a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The id, the shown name, or a prefix of a container's id.
    Shown,
    /// The whole id only.
    Exact,
}

/// The holder among `records` that `given` names: the exact id first, then (`Shown`)
/// the shown name, then a prefix of at least MIN_PREFIX hex digits of a container's id
/// (container ids are hex; a prefix of another holder's id, `slurm-42` of `slurm-421`,
/// would be another job).
pub(crate) fn find<'r>(records: &'r [Record], given: &str, how: Match) -> Lookup<'r> {
    if let Some(exact) = records.iter().find(|r| r.id == given) {
        return Lookup::Found(exact);
    }
    if how == Match::Exact {
        return Lookup::NotFound;
    }
    let named: Vec<&Record> = records
        .iter()
        .filter(|r| r.display_name() == given)
        .collect();
    if !named.is_empty() {
        return one(named);
    }
    let hex = given
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if given.len() < MIN_PREFIX || !hex {
        return Lookup::NotFound;
    }
    one(records
        .iter()
        .filter(|r| r.kind == HolderKind::Container && r.id.starts_with(given))
        .collect())
}

/// The one holder `given` names, else the error a person reads: no such holder, or the
/// candidates of an ambiguous name.
pub(crate) fn the_one<'r>(
    records: &'r [Record],
    given: &str,
    how: Match,
) -> Result<&'r Record, LedgerError> {
    match find(records, given, how) {
        Lookup::Found(record) => Ok(record),
        Lookup::Ambiguous(fits) => Err(LedgerError::AmbiguousHolder {
            given: given.to_string(),
            candidates: candidates(&fits),
        }),
        Lookup::NotFound => Err(LedgerError::NoSuchHolder {
            given: given.to_string(),
        }),
    }
}

fn one(mut fits: Vec<&Record>) -> Lookup<'_> {
    match fits.len() {
        0 => Lookup::NotFound,
        1 => Lookup::Found(fits.remove(0)),
        _ => Lookup::Ambiguous(fits),
    }
}

/// `web (3f2a1b2c3d4e), web (9c8d7e6f5a4b)`: the candidates of an ambiguous name, each
/// with its id shortened as docker shortens it, so that the next try can be exact.
pub(crate) fn candidates(fits: &[&Record]) -> String {
    fits.iter()
        .map(|r| format!("{} ({})", r.display_name(), shown_id(&r.id)))
        .collect::<Vec<_>>()
        .join(", ")
}

use crate::model::holder::shown_id;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::ContainerInfo;

    fn container(id: &str, name: Option<&str>) -> Record {
        let mut r = crate::state::ledger::testing::record(id, &["GPU-0"]);
        r.kind = HolderKind::Container;
        r.container = Some(ContainerInfo {
            engine: Some("docker".into()),
            name: name.map(String::from),
            image: None,
        });
        r
    }

    fn ids(found: Lookup<'_>) -> Vec<String> {
        match found {
            Lookup::Found(r) => vec![r.id.clone()],
            Lookup::Ambiguous(rs) => rs.iter().map(|r| r.id.clone()).collect(),
            Lookup::NotFound => vec![],
        }
    }

    #[test]
    fn the_exact_id_then_the_name_then_a_prefix() {
        let records = vec![
            container("3f2a1b2c3d4e5f60718293a4b5c6d7e8", Some("web")),
            container("9c8d7e6f5a4b3c2d1e0f", Some("3f2a")),
            container("3f2a", None),
        ];
        assert_eq!(ids(find(&records, "3f2a", Match::Shown)), ["3f2a"]);
        assert_eq!(
            ids(find(&records, "web", Match::Shown)),
            ["3f2a1b2c3d4e5f60718293a4b5c6d7e8"]
        );
        assert_eq!(
            ids(find(&records, "9c8d7e", Match::Shown)),
            ["9c8d7e6f5a4b3c2d1e0f"]
        );
        assert_eq!(
            ids(find(&records, "3f2a1b2c3d4e", Match::Shown)),
            ["3f2a1b2c3d4e5f60718293a4b5c6d7e8"]
        );
    }

    #[test]
    fn a_name_or_prefix_that_fits_several_is_ambiguous() {
        let records = vec![
            container("aaaa1111", Some("web")),
            container("aaaa2222", Some("web")),
            container("bbbb1111", Some("db")),
        ];
        assert!(
            matches!(find(&records, "web", Match::Shown), Lookup::Ambiguous(ref r) if r.len() == 2)
        );
        assert!(
            matches!(find(&records, "aaaa", Match::Shown), Lookup::Ambiguous(ref r) if r.len() == 2)
        );
        let Lookup::Ambiguous(fits) = find(&records, "web", Match::Shown) else {
            unreachable!()
        };
        assert_eq!(candidates(&fits), "web (aaaa1111), web (aaaa2222)");
    }

    #[test]
    fn short_prefixes_and_strangers_are_not_found() {
        let records = vec![container("abcdef0123", Some("web"))];
        assert_eq!(find(&records, "abc", Match::Shown), Lookup::NotFound);
        assert_eq!(
            find(&records, "abcd", Match::Shown),
            Lookup::Found(&records[0])
        );
        assert_eq!(find(&records, "we", Match::Shown), Lookup::NotFound);
        assert_eq!(find(&records, "xyz0", Match::Shown), Lookup::NotFound);
        assert_eq!(find(&records, "", Match::Shown), Lookup::NotFound);
    }

    #[test]
    fn exact_takes_only_the_whole_id_and_prefixes_only_a_containers_hex() {
        let mut hold = container("slurm-421", None);
        hold.kind = HolderKind::Hold;
        let records = vec![hold, container("abcdef0123", Some("slurm-42"))];
        assert_eq!(find(&records, "slurm-42", Match::Exact), Lookup::NotFound);
        assert_eq!(find(&records, "slurm-4", Match::Shown), Lookup::NotFound);
        assert_eq!(
            find(&records, "abcdef0123", Match::Exact),
            Lookup::Found(&records[1])
        );
        assert_eq!(find(&records, "abcdef", Match::Exact), Lookup::NotFound);
        assert_eq!(find(&records, "ABCDEF", Match::Shown), Lookup::NotFound);
    }

    #[test]
    fn a_name_is_a_containers_only() {
        let mut hold = container("h1", Some("web"));
        hold.kind = HolderKind::Hold;
        let records = vec![hold];
        assert_eq!(find(&records, "web", Match::Shown), Lookup::NotFound);
        assert_eq!(shown_id(&"0123456789abcdef".repeat(4)), "0123456789ab");
        assert_eq!(shown_id("maintenance-gpu7"), "maintenance-gpu7");
        assert_eq!(shown_id("h1"), "h1");
    }
}
