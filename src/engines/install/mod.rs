//! Registering gpupin with container engines: the files each engine reads, generated as
//! values (pure, tested) and written atomically. Nothing here prints.
//!
//! Docker: the JSON edits of daemon.json are pure functions (docker.rs); reading, backing
//! up and rewriting the file (file.rs) and asking dockerd to reload (reload.rs) are kept
//! apart so the CLI can show a dry run without touching anything. Podman and CRI-O: the
//! hooks.d files (podman.rs), and the containers.conf drop-in through which podman reads
//! them (containers_conf.rs).

pub mod containers_conf;
pub mod docker;
pub mod file;
pub mod podman;
pub mod reload;
