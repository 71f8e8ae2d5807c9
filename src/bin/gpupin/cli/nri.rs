//! `gpupin nri`: gpupin as an NRI plugin of containerd 2.x or CRI-O. It dials the
//! runtime's NRI socket (or takes the one a runtime that started it passes), registers,
//! and answers the runtime's calls one at a time: Configure (the events it wants),
//! Synchronize (the containers there are: holders of containers gone are released),
//! CreateContainer (the container's GPUs, as an adjustment), StopContainer and
//! RemoveContainer (its GPUs back). The decisions are the library's
//! (`gpupin::command::nri`); this is the wire around them (`gpupin-nri-api`).

use anyhow::Context;
use gpupin::command::{Config, HookCommand, nri};
use gpupin_nri_api::api::{self, event};
use gpupin_nri_api::wire::{self, Frame, Reader};
use prost::Message;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct NriArgs {
    /// The runtime's NRI socket (a runtime that starts the plugin passes its own instead,
    /// in NRI_PLUGIN_SOCKET)
    #[arg(long, value_name = "FILE", default_value = gpupin_nri_api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The name the plugin registers under
    #[arg(long, value_name = "NAME", default_value = "gpupin")]
    pub name: String,
    /// Two digits: the runtime calls plugins in this order, lowest first
    #[arg(long, value_name = "NN", default_value = "50", value_parser = index())]
    pub index: String,
}

fn index() -> super::flag::Parsed<String, String> {
    super::flag::Parsed(
        |text| match text.len() == 2 && text.bytes().all(|b| b.is_ascii_digit()) {
            true => Ok(text.to_string()),
            false => Err(format!("{text:?}: expected two digits, such as 50")),
        },
    )
}

/// The events gpupin wants besides Configure and Synchronize, which come anyway. Only
/// events NRI 0.8 knows (containerd 2.0 refuses a plugin that asks for more).
const EVENTS: i32 = event::bit(event::CREATE_CONTAINER)
    | event::bit(event::STOP_CONTAINER)
    | event::bit(event::REMOVE_CONTAINER);

pub fn run(config: &Config, args: &NriArgs) -> anyhow::Result<ExitCode> {
    let name = std::env::var("NRI_PLUGIN_NAME").unwrap_or_else(|_| args.name.clone());
    let index = std::env::var("NRI_PLUGIN_IDX").unwrap_or_else(|_| args.index.clone());
    let own_exe = std::env::current_exe().context("finding gpupin's own binary")?;
    let mut plugin = Plugin {
        config,
        hook: HookCommand::beside(&own_exe, config.path.clone()),
        runtime: String::from("containerd"),
        budget: DEFAULT_REQUEST_TIMEOUT,
        synchronizing: HashSet::new(),
        unserved: None,
    };
    if let Ok(fd) = std::env::var("NRI_PLUGIN_SOCKET") {
        // Started by the runtime (a pre-installed plugin): its socket, once.
        let fd: i32 = fd
            .parse()
            .with_context(|| format!("NRI_PLUGIN_SOCKET={fd:?}: expected a file descriptor"))?;
        // SAFETY: a runtime that starts a plugin passes it this end of a socketpair,
        // open, under this number, and nothing else in this process owns it.
        let socket = unsafe { <UnixStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        plugin.serve(&socket, &name, &index)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Dialed: connected again whenever the runtime goes away (a restart of containerd),
    // and until it is there at all.
    let mut told = false;
    loop {
        match UnixStream::connect(&args.socket) {
            Ok(socket) => {
                told = false;
                tracing::info!(socket = %args.socket.display(), "connected");
                if let Err(err) = plugin.serve(&socket, &name, &index) {
                    // Refused: connecting again would be refused again.
                    if err.downcast_ref::<Refused>().is_some()
                        || err.downcast_ref::<Unserved>().is_some()
                    {
                        return Err(err);
                    }
                    tracing::warn!(error = %format!("{err:#}"), "the NRI connection failed");
                }
                tracing::info!("the runtime closed the NRI socket: connecting again");
            }
            Err(err) if !told => {
                told = true;
                tracing::warn!(socket = %args.socket.display(), error = %err, "no NRI socket to connect to yet: trying every 2 s");
            }
            Err(_) => {}
        }
        std::thread::sleep(RECONNECT);
    }
}

/// Calls the runtime's `method` on stream `stream` (the answer comes back in the loop).
fn call(
    out: &mut impl Write,
    stream: u32,
    method: &str,
    message: &impl Message,
) -> anyhow::Result<()> {
    let request = wire::Request {
        service: api::RUNTIME_SERVICE.into(),
        method: method.into(),
        payload: message.encode_to_vec(),
        timeout_nano: 0,
    };
    wire::write_message(
        out,
        wire::RUNTIME_CONN,
        stream,
        wire::REQUEST,
        &request.encode_to_vec(),
    )
    .with_context(|| format!("calling the runtime's {method}"))
}

/// The runtime refused the registration (a name or index it does not take).
#[derive(Debug, thiserror::Error)]
#[error("the runtime refused the registration: {0}")]
struct Refused(String);

/// gpupin nri cannot serve this runtime (`nri::serves`): it told the runtime so at
/// Configure, and ends.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unserved(String);

/// The runtime's answer to the registration: an error ends the plugin.
fn registered(frame: &Frame) -> anyhow::Result<()> {
    let response = wire::Response::decode(frame.data.as_slice()).context("the runtime's answer")?;
    match response.status {
        Some(status) if status.code != 0 => Err(Refused(status.message).into()),
        _ => {
            tracing::info!("registered");
            Ok(())
        }
    }
}

struct Plugin<'a> {
    config: &'a Config,
    hook: HookCommand,
    /// The runtime's name, from Configure: the engine of the holders.
    runtime: String,
    /// How long the runtime waits for an answer, from Configure.
    budget: Duration,
    /// The containers of a Synchronize split over several calls, so far.
    synchronizing: HashSet<String>,
    /// Why Configure refused the runtime (`nri::serves`): the plugin ends once it has
    /// told the runtime so.
    unserved: Option<String>,
}

impl Plugin<'_> {
    /// Registers on `socket` and answers the runtime until it closes it.
    fn serve(&mut self, socket: &UnixStream, name: &str, index: &str) -> anyhow::Result<()> {
        let mut out = socket.try_clone().context("the NRI socket")?;
        let register = api::RegisterPluginRequest {
            plugin_name: name.to_string(),
            plugin_idx: index.to_string(),
            nri_version: String::new(),
        };
        call(&mut out, 1, "RegisterPlugin", &register)?;
        tracing::info!(name, index, "registering with the runtime");
        let mut reader = Reader::new(socket);
        while let Some(frame) = reader.next_frame().context("reading from the runtime")? {
            match (frame.conn, frame.kind) {
                (wire::RUNTIME_CONN, wire::RESPONSE) => registered(&frame)?,
                (wire::PLUGIN_CONN, wire::REQUEST) => {
                    let answer = self.answer(&frame.data);
                    wire::write_message(
                        &mut out,
                        wire::PLUGIN_CONN,
                        frame.stream,
                        wire::RESPONSE,
                        &answer.encode_to_vec(),
                    )
                    .context("answering the runtime")?;
                    if let Some(line) = self.unserved.take() {
                        return Err(Unserved(line).into());
                    }
                }
                (conn, kind) => {
                    tracing::debug!(conn, kind, "a message gpupin does not expect: ignored")
                }
            }
        }
        Ok(())
    }

    /// The response to one request of the runtime.
    fn answer(&mut self, data: &[u8]) -> wire::Response {
        let request = match wire::Request::decode(data) {
            Ok(request) if request.service == api::PLUGIN_SERVICE => request,
            Ok(request) => {
                return failed(
                    wire::code::UNIMPLEMENTED,
                    format!("service {}", request.service),
                );
            }
            Err(err) => {
                return failed(
                    wire::code::INVALID_ARGUMENT,
                    format!("a request that does not decode: {err}"),
                );
            }
        };
        let payload = request.payload.as_slice();
        let answered = match request.method.as_str() {
            "Configure" => self.configure(payload),
            "Synchronize" => self.synchronize(payload),
            "CreateContainer" => self.create(payload),
            "StopContainer" => self
                .stopped(payload)
                .map(|()| api::StopContainerResponse::default().encode_to_vec()),
            "RemoveContainer" => self.stopped(payload).map(|()| Vec::new()),
            "StateChange" => self.state_change(payload),
            "Shutdown" => Ok(Vec::new()),
            // A runtime of NRI 0.12 sends the event again as StateChange.
            other => return failed(wire::code::UNIMPLEMENTED, format!("method {other}")),
        };
        match answered {
            Ok(payload) => wire::Response {
                status: None,
                payload,
            },
            Err(err) => {
                let line = gpupin::command::one_line(&*err);
                tracing::warn!(method = request.method, error = %line, "refused");
                failed(wire::code::INTERNAL, format!("gpupin: {line}"))
            }
        }
    }

    fn configure(&mut self, payload: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let configure = api::ConfigureRequest::decode(payload)?;
        if !configure.runtime_name.is_empty() {
            self.runtime = configure.runtime_name;
        }
        if let Err(err) = nri::serves(&self.runtime) {
            self.unserved = Some(gpupin::command::one_line(&err));
            return Err(err.into());
        }
        if configure.request_timeout > 0 {
            self.budget = Duration::from_millis(configure.request_timeout as u64);
        }
        tracing::info!(
            runtime = self.runtime,
            version = configure.runtime_version,
            "configured"
        );
        Ok(api::ConfigureResponse { events: EVENTS }.encode_to_vec())
    }

    fn synchronize(&mut self, payload: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let sync = api::SynchronizeRequest::decode(payload)?;
        self.synchronizing.extend(
            sync.containers
                .iter()
                .filter(|c| c.state != CONTAINER_STOPPED)
                .map(|c| c.id.clone()),
        );
        if !sync.more {
            let running = std::mem::take(&mut self.synchronizing);
            for record in nri::reconcile(self.config, |id| running.contains(id))? {
                tracing::info!(
                    holder = record.shown_name(),
                    "released: its container is gone"
                );
            }
        }
        // Split: echo `more`, and update nothing before the last part.
        Ok(api::SynchronizeResponse {
            update: Vec::new(),
            more: sync.more,
        }
        .encode_to_vec())
    }

    fn create(&mut self, payload: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let request = api::ContainerRequest::decode(payload)?;
        let pod = request.pod.unwrap_or_default();
        let container = request.container.unwrap_or_default();
        let created = nri::Created {
            runtime: &self.runtime,
            pod_namespace: &pod.namespace,
            pod_name: &pod.name,
            pod_annotations: Some(&pod.annotations),
            id: &container.id,
            name: &container.name,
            annotations: Some(&container.annotations),
            env: &container.env,
            devices: container
                .linux
                .iter()
                .flat_map(|l| &l.devices)
                .map(|d| (d.path.as_str(), d.r#type.as_str(), d.major, d.minor))
                .collect(),
            cdi_devices: container
                .cdi_devices
                .iter()
                .map(|d| d.name.as_str())
                .collect(),
            budget: self.budget,
        };
        let adjust = match nri::create(self.config, &self.hook, &created)? {
            nri::Outcome::Nothing => None,
            nri::Outcome::Stripped(adjustment) => {
                tracing::info!(
                    container = container.name,
                    "what it asked NVIDIA's stack for around gpupin voided (unrequested = \"strip\")"
                );
                Some(adjustment_message(adjustment))
            }
            nri::Outcome::Admitted(record, adjustment) => {
                tracing::info!(
                    holder = record.shown_name(),
                    gpus = ?record.indices,
                    cdi_devices = ?adjustment.cdi_devices,
                    "allocated"
                );
                Some(adjustment_message(adjustment))
            }
        };
        Ok(api::CreateContainerResponse {
            adjust,
            ..Default::default()
        }
        .encode_to_vec())
    }

    fn stopped(&mut self, payload: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
        let request = api::ContainerRequest::decode(payload)?;
        self.release(request.container.as_ref())
    }

    fn state_change(&mut self, payload: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let change = api::StateChangeEvent::decode(payload)?;
        if matches!(
            change.event,
            event::STOP_CONTAINER | event::REMOVE_CONTAINER
        ) {
            self.release(change.container.as_ref())?;
        }
        Ok(Vec::new())
    }

    fn release(
        &mut self,
        container: Option<&api::Container>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(container) = container
            && let Some(record) = nri::release(self.config, &container.id)?
        {
            tracing::info!(holder = record.shown_name(), "released");
        }
        Ok(())
    }
}

/// How long `gpupin nri` waits before it connects again.
const RECONNECT: Duration = Duration::from_secs(2);

/// NRI's default request timeout, until Configure says the runtime's.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// NRI's `CONTAINER_STOPPED`.
const CONTAINER_STOPPED: i32 = 4;

fn failed(code: i32, message: String) -> wire::Response {
    wire::Response {
        status: Some(wire::Status { code, message }),
        payload: Vec::new(),
    }
}

/// The library's adjustment as NRI's message.
fn adjustment_message(adjustment: nri::Adjustment) -> api::ContainerAdjustment {
    let mut devices: Vec<api::LinuxDevice> = adjustment
        .devices
        .iter()
        .map(|node| api::LinuxDevice {
            path: node.path.clone(),
            r#type: "c".into(),
            major: node.major.into(),
            minor: node.minor.into(),
            file_mode: Some(api::OptionalFileMode { value: 0o666 }),
            uid: Some(api::OptionalUInt32 { value: 0 }),
            gid: Some(api::OptionalUInt32 { value: 0 }),
        })
        .collect();
    devices.extend(
        adjustment
            .remove_devices
            .iter()
            .map(|node| api::LinuxDevice {
                path: format!("-{}", node.path),
                ..Default::default()
            }),
    );
    let denied: Vec<api::LinuxDeviceCgroup> = adjustment
        .remove_devices
        .iter()
        .map(|node| api::LinuxDeviceCgroup {
            allow: false,
            r#type: "c".into(),
            major: Some(api::OptionalInt64 {
                value: node.major.into(),
            }),
            minor: Some(api::OptionalInt64 {
                value: node.minor.into(),
            }),
            access: "rwm".into(),
        })
        .collect();
    let mut hooks = api::Hooks::default();
    for hook in &adjustment.hooks {
        let entry = api::Hook {
            path: hook.path.clone(),
            args: hook.args.clone(),
            env: hook.env.clone(),
            timeout: hook.timeout.map(|t| api::OptionalInt64 { value: t.into() }),
        };
        match hook.stage {
            "prestart" => hooks.prestart.push(entry),
            "createRuntime" => hooks.create_runtime.push(entry),
            "createContainer" => hooks.create_container.push(entry),
            "startContainer" => hooks.start_container.push(entry),
            "poststart" => hooks.poststart.push(entry),
            _ => hooks.poststop.push(entry),
        }
    }
    let mut annotations: std::collections::HashMap<String, String> =
        adjustment.annotations.into_iter().collect();
    annotations.extend(
        adjustment
            .remove_annotations
            .iter()
            .map(|key| (format!("-{key}"), String::new())),
    );
    api::ContainerAdjustment {
        annotations,
        mounts: adjustment
            .mounts
            .into_iter()
            .map(|m| api::Mount {
                destination: m.destination,
                r#type: m.kind.unwrap_or_default(),
                source: m.source,
                options: m.options,
            })
            .collect(),
        env: adjustment
            .env
            .into_iter()
            .map(|(key, value)| api::KeyValue { key, value })
            .collect(),
        hooks: Some(hooks),
        cdi_devices: adjustment
            .cdi_devices
            .into_iter()
            .map(|name| api::CdiDevice { name })
            .collect(),
        linux: Some(api::LinuxContainerAdjustment {
            devices,
            resources: (!denied.is_empty()).then_some(api::LinuxResources { devices: denied }),
        }),
    }
}
