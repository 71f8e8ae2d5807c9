//! The kubelet's side of a device plugin's registration, for the tests that drive
//! `gpupin device-plugin` without a real kubelet: its Registration service on
//! `kubelet.sock`, and the unix-socket plumbing tonic needs.

use gpupin_kubelet_api::deviceplugin::registration_server::{Registration, RegistrationServer};
use gpupin_kubelet_api::deviceplugin::{Empty, RegisterRequest};
use std::path::Path;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// The kubelet's Registration service: passes each request on to the test.
struct FakeRegistration(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for FakeRegistration {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// Serves Registration on `plugin_dir/kubelet.sock`; the requests arrive on the receiver.
pub fn serve_registration(plugin_dir: &Path) -> mpsc::UnboundedReceiver<RegisterRequest> {
    let (registered_tx, registered) = mpsc::unbounded_channel();
    let registration = RegistrationServer::new(FakeRegistration(registered_tx));
    let kubelet_sock = listen(&plugin_dir.join("kubelet.sock"));
    tokio::spawn(Server::builder().serve_with_incoming(registration, kubelet_sock));
    registered
}

pub async fn connect(path: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", path.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()))
}

/// A listener on `path`, as a stream of connections for tonic.
pub fn listen(path: &Path) -> UnixListenerStream {
    UnixListenerStream::new(UnixListener::bind(path).unwrap())
}
