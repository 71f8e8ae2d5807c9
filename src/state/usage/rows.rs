//! `usage`'s rows: a key, its GPU-seconds and its distinct holders, kept compact. A year
//! `--by holder` is hundreds of thousands of rows: each row is 32 bytes and its key's
//! characters in one string, not a `String`, a set of holders and a hash map entry each.

use hashbrown::HashTable;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};

/// A set of holders' hashes (`tally::Ids`), which are random already: hashing them again
/// took a tenth of a year's `usage`.
pub(super) type HolderSet<T> = HashSet<T, BuildHasherDefault<Prehashed>>;

/// The `Hasher` of `HolderSet`: a value's own bits.
#[derive(Default)]
pub(super) struct Prehashed(u64);

impl Hasher for Prehashed {
    fn write(&mut self, bytes: &[u8]) {
        // Only the integers below are hashed here; anything else still spreads.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// One row of `Usage`, as people read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageRow<'a> {
    pub key: &'a str,
    /// GPU-seconds: exact, where hours would be rounded.
    pub gpu_seconds: u64,
    /// Distinct holders that had a part in the row.
    pub holders: usize,
}

impl UsageRow<'_> {
    pub fn gpu_hours(&self) -> f64 {
        self.gpu_seconds as f64 / 3600.0
    }
}

/// The rows, largest first (equal sums in key order, so that the output is stable).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    keys: String,
    sums: Vec<Sum>,
}

/// 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sum {
    key_at: u32,
    key_len: u32,
    seconds: u64,
    /// The first holder (`Summing`; the others in `Summing::more`); the number of
    /// holders once summed.
    holders: u64,
}

impl Rows {
    /// Rows of the given (key, GPU-seconds, holders), sorted.
    pub fn of<'a>(rows: impl IntoIterator<Item = (&'a str, u64, usize)>) -> Rows {
        let mut all = Rows::default();
        for (key, seconds, holders) in rows {
            let key_at = all.keys.len() as u32;
            all.keys.push_str(key);
            all.sums.push(Sum {
                key_at,
                key_len: key.len() as u32,
                seconds,
                holders: holders as u64,
            });
        }
        all.sort();
        all
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = UsageRow<'_>> {
        self.sums.iter().map(|sum| UsageRow {
            key: self.key(sum),
            gpu_seconds: sum.seconds,
            holders: sum.holders as usize,
        })
    }

    pub fn len(&self) -> usize {
        self.sums.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sums.is_empty()
    }

    fn key(&self, sum: &Sum) -> &str {
        &self.keys[sum.key_at as usize..(sum.key_at + sum.key_len) as usize]
    }

    fn sort(&mut self) {
        let mut sums = std::mem::take(&mut self.sums);
        sums.sort_unstable_by(|a, b| {
            b.seconds
                .cmp(&a.seconds)
                .then_with(|| self.key(a).cmp(self.key(b)))
        });
        self.sums = sums;
    }
}

/// Rows are equal when they read the same, however their keys were laid out.
impl PartialEq for Rows {
    fn eq(&self, other: &Rows) -> bool {
        self.iter().eq(other.iter())
    }
}

/// Rows being summed: seconds added to a key by a holder at a time.
pub(super) struct Summing {
    rows: Rows,
    /// Each row's index in `rows.sums`, by its key's hash.
    index: HashTable<u32>,
    keys: RandomState,
    /// The holders of each row past its first, for the rows that have more than one, by
    /// the row's index.
    more: HashMap<u32, HolderSet<u64>>,
}

impl Summing {
    pub(super) fn new() -> Summing {
        Summing {
            rows: Rows::default(),
            index: HashTable::new(),
            keys: RandomState::new(),
            more: HashMap::new(),
        }
    }

    /// Adds `seconds` to the row `key`, and `holder` (a hash of its id, `Ids`) to its
    /// holders.
    pub(super) fn add(&mut self, key: &str, seconds: u64, holder: u64) {
        let Summing {
            rows,
            index,
            keys,
            more,
        } = self;
        let hash = keys.hash_one(key);
        let found = index
            .find(hash, |&i| rows.key(&rows.sums[i as usize]) == key)
            .copied();
        let i = match found {
            Some(i) => i as usize,
            None => {
                let i = rows.sums.len();
                let key_at = rows.keys.len() as u32;
                rows.keys.push_str(key);
                rows.sums.push(Sum {
                    key_at,
                    key_len: key.len() as u32,
                    seconds: 0,
                    holders: holder,
                });
                index.insert_unique(hash, i as u32, |&j| {
                    keys.hash_one(rows.key(&rows.sums[j as usize]))
                });
                i
            }
        };
        let sum = &mut rows.sums[i];
        sum.seconds += seconds;
        if sum.holders != holder {
            more.entry(i as u32).or_default().insert(holder);
        }
    }

    /// The rows, each with its number of distinct holders, sorted.
    pub(super) fn finish(self) -> Rows {
        let Summing {
            mut rows,
            index,
            more,
            ..
        } = self;
        drop(index);
        for (i, sum) in rows.sums.iter_mut().enumerate() {
            // The first is never among the others.
            let others = more.get(&(i as u32)).map_or(0, HashSet::len);
            sum.holders = 1 + others as u64;
        }
        drop(more);
        rows.sort();
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rows: &Rows) -> Vec<(&str, u64, usize)> {
        rows.iter()
            .map(|r| (r.key, r.gpu_seconds, r.holders))
            .collect()
    }

    #[test]
    fn a_row_sums_its_seconds_and_counts_each_holder_once() {
        let mut summing = Summing::new();
        summing.add("alice", 10, 1);
        summing.add("bob", 30, 2);
        summing.add("alice", 5, 1);
        summing.add("alice", 0, 3);
        summing.add("alice", 1, 3);
        summing.add("carol", 16, 4);
        summing.add("alice", 0, 1);
        let summed = summing.finish();
        assert_eq!(
            rows(&summed),
            [("bob", 30, 1), ("alice", 16, 2), ("carol", 16, 1)]
        );
        assert_eq!(summed.len(), 3);
    }

    #[test]
    fn rows_given_whole_are_sorted_largest_first_then_by_key() {
        let given = Rows::of([("b", 1, 1), ("c", 9, 2), ("a", 1, 3)]);
        assert_eq!(rows(&given), [("c", 9, 2), ("a", 1, 3), ("b", 1, 1)]);
        assert!(!given.is_empty());
        assert!(Rows::of([]).is_empty());
    }

    /// Equal when they read the same, whatever order the keys were laid out in.
    #[test]
    fn rows_that_read_the_same_are_equal() {
        let one = Rows::of([("a", 1, 1), ("b", 2, 1)]);
        let mut summing = Summing::new();
        summing.add("b", 2, 7);
        summing.add("a", 1, 8);
        assert_eq!(summing.finish(), one);
        assert_ne!(Rows::of([("a", 1, 1), ("b", 2, 2)]), one);
    }
}
