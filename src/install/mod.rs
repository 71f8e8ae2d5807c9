//! Registering gpupin with container engines: the files each engine reads, generated as
//! values (pure, tested) and written atomically. Nothing here prints.

pub mod podman;
