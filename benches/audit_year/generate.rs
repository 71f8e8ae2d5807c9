//! A year of a busy box's audit trail, seeded: the lines are gpupin's own `Event`s
//! serialized by gpupin's own serde, written to `audit.log` and rotated as
//! `AuditLog::append` rotates it (a line that would take the live file past `max_bytes`
//! moves `audit.log.N` to `.N+1` and the live file to `.1` first); refusals go to
//! `audit.refusals.log`, as gpupin writes them.
//!
//! Every user's holdings are in the main log, as the trail the issue measured had them
//! (a gpupin before per-user logs wrote them so): five files of a year, not 40 users'
//! logs of five each. Readers merge all streams by time, so the answers are the same.
//!
//! The mix, per day: about 950 holdings (an `allocate` or `hold` and its `release`,
//! or a `reap` for one in ten), exec jobs with their `bind`, holds with containers
//! nested in them (`within`; some outlive their hold, the billing rule of a nested
//! holder whose parent went first), durations from a minute to three days (so that
//! holdings span days, rotations and any window's edges), and a few refusals.
//!
//! Used by benches/audit_year.rs and tests/audit_year.rs (`#[path]`).

use gpupin::parts::audit::{Event, EventKind, GpuRef};
use gpupin::parts::{ContainerInfo, GpuRequest, HolderKind, Origin, Selection, Share};
use gpupin_sandbox::harness::rng::Rng;
use std::collections::BinaryHeap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const USERS: u32 = 40;
pub const GPUS: u32 = 16;
/// Holdings begun a day: with their ends, binds and refusals about 2,050 lines.
pub const HOLDINGS_PER_DAY: u32 = 950;
const DAY: u64 = 86_400;

/// What to generate.
#[derive(Debug, Clone)]
pub struct Year {
    pub days: u32,
    pub seed: u64,
    /// The last second of the trail (Unix seconds): "now" of the queries.
    pub end: u64,
    /// `audit_max_size` and `audit_keep`, as the config would set them.
    pub max_bytes: u64,
    pub keep: u32,
}

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// Lines in the main log's files and in the refusals log's.
    pub events: u64,
    pub refusals: u64,
    /// Bytes of all files together.
    pub bytes: u64,
    /// The main log's files, oldest first.
    pub files: Vec<PathBuf>,
    /// A holder id that occurs in the trail (`gpupin log --holder`).
    pub a_holder: String,
}

/// One line waiting for its time, earliest first out of the heap (then in the order made).
struct Pending {
    at: u64,
    order: u64,
    event: Event,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// A log and its rotated files, written as `AuditLog::append` writes them.
struct Rotating {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    out: BufWriter<File>,
    len: u64,
    lines: u64,
    bytes: u64,
}

impl Rotating {
    fn create(path: PathBuf, max_bytes: u64, keep: u32) -> std::io::Result<Rotating> {
        let out = BufWriter::with_capacity(1 << 20, File::create(&path)?);
        Ok(Rotating {
            path,
            max_bytes,
            keep,
            out,
            len: 0,
            lines: 0,
            bytes: 0,
        })
    }

    fn write(&mut self, event: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.len + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(&line)?;
        self.len += line.len() as u64;
        self.bytes += line.len() as u64;
        self.lines += 1;
        Ok(())
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        if self.keep == 0 {
            self.out = BufWriter::with_capacity(1 << 20, File::create(&self.path)?);
        } else {
            for n in (1..self.keep).rev() {
                let from = rotated(&self.path, n);
                if from.exists() {
                    fs::rename(&from, rotated(&self.path, n + 1))?;
                }
            }
            fs::rename(&self.path, rotated(&self.path, 1))?;
            self.out = BufWriter::with_capacity(1 << 20, File::create(&self.path)?);
        }
        self.len = 0;
        Ok(())
    }

    fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (1..=self.keep.max(1))
            .rev()
            .map(|n| rotated(&self.path, n))
            .filter(|p| p.exists())
            .collect();
        files.push(self.path.clone());
        files
    }
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn rfc3339(at: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at);
    humantime::format_rfc3339_seconds(time).to_string()
}

/// The GPUs of the machine, by index: UUIDs as NVML spells them.
fn gpu(index: u32) -> GpuRef {
    GpuRef {
        index: Some(index),
        uuid: format!("GPU-{index:08x}-5e1f-4c2a-9b3d-{:012x}", 0x7a00 + index),
    }
}

/// How long a holding lasts: mostly minutes, some hours, a few up to three days.
fn duration(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..60 => 60 + rng.below(3_540),
        60..90 => 3_600 + rng.below(11 * 3_600),
        _ => 12 * 3_600 + rng.below(60 * 3_600),
    }
}

fn hex_id(rng: &mut Rng) -> String {
    (0..4).map(|_| format!("{:016x}", rng.next_u64())).collect()
}

/// Writes the trail into `dir` (`audit.log`, its rotated files, `audit.refusals.log`).
pub fn write_year(dir: &Path, year: &Year) -> std::io::Result<Written> {
    fs::create_dir_all(dir)?;
    let mut main = Rotating::create(dir.join("audit.log"), year.max_bytes, year.keep)?;
    let mut refusals = Rotating::create(dir.join("audit.refusals.log"), year.max_bytes, year.keep)?;
    let mut rng = Rng(year.seed);
    let mut heap: BinaryHeap<Pending> = BinaryHeap::new();
    let mut order = 0u64;
    let mut push = |heap: &mut BinaryHeap<Pending>, at: u64, mut event: Event| {
        event.time = rfc3339(at);
        order += 1;
        heap.push(Pending { at, order, event });
    };
    let first_day = year.end - u64::from(year.days) * DAY;
    let mut a_holder = String::new();
    // Holds a day, each with containers nested in it.
    let holds_per_day = HOLDINGS_PER_DAY / 50;
    for day in 0..u64::from(year.days) {
        let day_start = first_day + day * DAY;
        let mut starts: Vec<u64> = (0..HOLDINGS_PER_DAY)
            .map(|_| day_start + rng.below(DAY))
            .collect();
        starts.sort_unstable();
        for (n, &start) in starts.iter().enumerate() {
            let uid = 1000 + rng.below(u64::from(USERS)) as u32;
            let user = format!("user{:02}", uid - 1000);
            let count = match rng.below(100) {
                0..80 => 1,
                80..95 => 2,
                95..99 => 4,
                _ => 8,
            };
            let first = rng.below(u64::from(GPUS / count)) as u32 * count;
            let gpus: Vec<GpuRef> = (first..first + count).map(gpu).collect();
            let mut request = GpuRequest::new(Selection::Count(count), Origin::Annotations);
            if rng.chance(30) {
                request.share = Share::Shared;
                request.reserve = Some((4 + rng.below(20)) << 30);
            }
            let end = start + duration(&mut rng);
            let (kind, holder, container, nested) = if n < holds_per_day as usize {
                let id = format!("hold-{user}-{day}-{n}");
                (HolderKind::Hold, id, ContainerInfo::default(), 2)
            } else if rng.chance(5) {
                let id = format!("exec-{}", &hex_id(&mut rng)[..16]);
                (HolderKind::Exec, id, ContainerInfo::default(), 0)
            } else {
                let container = ContainerInfo {
                    engine: Some(["docker", "podman", "containerd"][rng.below(3) as usize].into()),
                    name: Some(format!("{user}-train-{day}-{n}")),
                    image: Some("pytorch:24.05".into()),
                };
                (HolderKind::Container, hex_id(&mut rng), container, 0)
            };
            let begun = Event {
                kind: Some(kind),
                user: Some(user.clone()),
                uid: Some(uid),
                container: container.clone(),
                gpus: gpus.clone(),
                request: Some(request.clone()),
                pid: (kind != HolderKind::Hold).then(|| 1000 + rng.below(4_000_000) as i32),
                ..Event::new(
                    match kind {
                        HolderKind::Hold => EventKind::Hold,
                        _ => EventKind::Allocate,
                    },
                    &holder,
                )
            };
            push(&mut heap, start, begun.clone());
            if kind == HolderKind::Exec {
                let bind = Event {
                    event: EventKind::Bind,
                    ..begun.clone()
                };
                push(&mut heap, start + 1, bind);
            }
            let reaped = rng.chance(10);
            let ended = Event {
                held_s: Some(end - start),
                ..Event {
                    event: if reaped {
                        EventKind::Reap
                    } else {
                        EventKind::Release
                    },
                    ..begun.clone()
                }
            };
            push(&mut heap, end, ended);
            if a_holder.is_empty()
                && day >= u64::from(year.days) / 2
                && kind == HolderKind::Container
            {
                a_holder = holder.clone();
            }
            // Containers in the hold: begun inside it; one in four outlives it.
            for k in 0..nested {
                let from = start + 1 + rng.below((end - start).max(2) - 1);
                let to = match rng.chance(25) {
                    true => end + duration(&mut rng),
                    false => from + rng.below(end.saturating_sub(from).max(1)),
                };
                let mut inner = GpuRequest::new(Selection::Count(1), Origin::Annotations);
                inner.within = Some(holder.clone());
                let child = Event {
                    kind: Some(HolderKind::Container),
                    user: Some(user.clone()),
                    uid: Some(uid),
                    container: ContainerInfo {
                        engine: Some("docker".into()),
                        name: Some(format!("{holder}-step-{k}")),
                        image: Some("pytorch:24.05".into()),
                    },
                    gpus: vec![gpus[k as usize % gpus.len()].clone()],
                    request: Some(inner),
                    pid: Some(1000 + rng.below(4_000_000) as i32),
                    within: Some(holder.clone()),
                    ..Event::new(EventKind::Allocate, &hex_id(&mut rng))
                };
                push(&mut heap, from, child.clone());
                push(
                    &mut heap,
                    to,
                    Event {
                        event: EventKind::Release,
                        held_s: Some(to - from),
                        ..child
                    },
                );
            }
            if rng.chance(3) {
                let refusal = Event {
                    kind: Some(HolderKind::Container),
                    user: Some(user.clone()),
                    uid: Some(uid),
                    request: Some(request),
                    code: Some("not_enough_free".into()),
                    ..Event::new(EventKind::Refuse, &hex_id(&mut rng))
                        .because(format!("{count} GPUs asked, fewer free"))
                };
                push(&mut heap, start, refusal);
            }
            // Everything due by this start is written, in time order.
            drain(&mut heap, start, year.end, &mut main, &mut refusals)?;
        }
    }
    drain(&mut heap, year.end, year.end, &mut main, &mut refusals)?;
    main.out.flush()?;
    refusals.out.flush()?;
    let bytes = main.bytes + refusals.bytes;
    Ok(Written {
        events: main.lines + refusals.lines,
        refusals: refusals.lines,
        bytes,
        files: main.files(),
        a_holder,
    })
}

/// Writes the pending lines up to `until`; those after `end` (holders still running
/// "now") are never written.
fn drain(
    heap: &mut BinaryHeap<Pending>,
    until: u64,
    end: u64,
    main: &mut Rotating,
    refusals: &mut Rotating,
) -> std::io::Result<()> {
    while heap.peek().is_some_and(|p| p.at <= until) {
        let Pending { at, event, .. } = heap.pop().expect("peeked");
        if at > end {
            continue;
        }
        match event.event {
            EventKind::Refuse => refusals.write(&event)?,
            _ => main.write(&event)?,
        }
    }
    Ok(())
}
