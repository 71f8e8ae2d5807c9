//! One connection's request, read within its deadline and handed to its operation
//! (`ops`), whose reply goes back on the same connection.

use super::connections::{Deadline, Shared};
use super::ops;
use super::peer::Peer;
use super::protocol::{self, Reply, Request};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// Serves the one request `peer` sends on `stream`; an exec's bind follows on the same
/// connection, which its op reads.
pub(super) fn serve_one(shared: &Shared, peer: Peer, stream: UnixStream) -> std::io::Result<()> {
    let config = shared.config();
    let config = &*config;
    let stream = Arc::new(stream);
    // Answers must not block the thread on a caller that reads nothing.
    stream.set_write_timeout(Some(config.serve.request_timeout))?;
    let mut input = BufReader::new(Deadline::new(
        Arc::clone(&stream),
        config.serve.request_timeout,
    ));
    let mut output = &*stream;
    let request = match protocol::receive_request(&mut input) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()),
        Err(why) => return protocol::send(&mut output, &Reply::refused(why)),
    };
    tracing::debug!(pid = peer.pid, uid = peer.uid, request = ?request.without_keys(), "request");
    let reply = match request {
        Request::Exec { request, name } => {
            return ops::exec::answer(shared, peer, &request, name, &mut input);
        }
        Request::Hold {
            id,
            devices,
            by_minor,
            pid,
            until_release,
            user,
            within,
            count,
            mig,
            reason,
            for_secs,
            request,
        } => {
            let asked = ops::hold::HoldAsked {
                id,
                devices,
                by_minor,
                pid,
                until_release,
                user,
                within,
                count,
                mig,
                reason,
                for_secs,
                request,
            };
            ops::hold::answer(shared, peer, asked, &stream)
        }
        Request::Release {
            id,
            force,
            exact,
            ignore_missing,
        } => ops::release::answer(config, peer, &id, force, exact, ignore_missing),
        Request::Evict {
            id,
            reason,
            grace_secs,
        } => ops::evict::answer(config, peer, &id, reason, grace_secs),
        Request::Key { id } => ops::key::answer(config, peer, &id),
        Request::Bind { .. } => Reply::refused("bind without an exec first"),
        Request::Hello => ops::hello::answer(),
        Request::Status => ops::status::answer(shared.status, config),
    };
    protocol::send(&mut output, &reply)
}
