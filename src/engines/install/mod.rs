//! Registering gpupin with container engines: the files each engine reads, generated as
//! values (pure, tested) and written atomically. Nothing here prints.
//!
//! Docker: the JSON edits of daemon.json are pure functions (docker.rs); reading, backing
//! up and rewriting the file (file.rs) and asking dockerd to reload (reload.rs) are kept
//! apart so the CLI can show a dry run without touching anything. Podman and CRI-O: the
//! hooks.d files (podman.rs), and the containers.conf drop-in through which podman reads
//! them (containers_conf.rs).

pub(crate) mod containers_conf;
pub(crate) mod docker;
pub(crate) mod file;
pub(crate) mod podman;
pub(crate) mod reload;
