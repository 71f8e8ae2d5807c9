//! One connection's request, read within its deadline and handed to its operation
//! (`ops`), whose reply goes back on the same connection; an op's `ServeError` becomes
//! the reply here (and an audit line, for a denial).

use super::connections::{Deadline, Shared};
use super::error::ServeError;
use super::ops;
use super::peer::Peer;
use super::protocol::{self, Request};
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
        Err(why) => {
            return protocol::send(
                &mut output,
                &ServeError::Unreadable(why).reply(config, peer, ""),
            );
        }
    };
    tracing::debug!(pid = peer.pid, uid = peer.uid, request = ?request.without_keys(), "request");
    // The holder the request names, under which a denial is audited.
    let (holder, outcome) = match request {
        Request::Exec { request, name } => {
            return ops::exec::answer(shared, peer, &request, name, &mut input);
        }
        Request::Hold(asked) => {
            let holder = asked.id.clone();
            (
                holder,
                ops::hold::answer(shared, config, peer, asked, &stream),
            )
        }
        Request::Release {
            id,
            force,
            exact,
            ignore_missing,
        } => {
            let outcome = ops::release::answer(config, peer, &id, force, exact, ignore_missing);
            (id, outcome)
        }
        Request::Evict {
            id,
            reason,
            grace_secs,
        } => {
            let outcome = ops::evict::answer(config, peer, &id, reason, grace_secs);
            (id, outcome)
        }
        Request::Key { id } => {
            let outcome = ops::key::answer(config, peer, &id);
            (id, outcome)
        }
        Request::Bind { .. } => (String::new(), Err(ServeError::BindFirst)),
        Request::Hello => (String::new(), ops::hello::answer()),
        Request::Status => (String::new(), ops::status::answer(config)),
        Request::PauseHealth { secs } => (String::new(), ops::health::pause(shared, peer, secs)),
        Request::ResumeHealth => (String::new(), ops::health::resume(shared, peer)),
    };
    let reply = outcome.unwrap_or_else(|e| e.reply(config, peer, &holder));
    protocol::send(&mut output, &reply)
}
