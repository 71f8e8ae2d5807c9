//! `gpupin demo`: starts real containers under runc on a simulated machine, each asking
//! for GPUs a different way, shows `gpupin status` while they run, stops them and shows
//! the GPUs back. Where runc or root is missing (or with `--no-containers`) the same
//! requests go through the hook protocol with a `sleep` process standing in for each
//! container, and no device node is created.
//!
//! The demo never touches the system's configuration or ledger: it writes its own config
//! with a state dir in a temp dir. Its containers come from gpupin-sandbox (the `demo`
//! feature), which knows gpupin only as the binary in their hooks.

mod driver;
mod no_container;

use super::out;
use anyhow::Context;
use gpupin::command::{Config, Inventory, Ledger, Record, status_table};
use gpupin_sandbox::{self as sandbox, BundleSpec, Container, HookCommand, Requirements, Runc};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Simulated machine to run on
    #[arg(long, default_value = "sim:nvswitch8")]
    pub machine: String,
    /// Start no containers even where runc and root are available: run the requests
    /// through the hook protocol with a `sleep` process standing in for each container
    #[arg(long)]
    pub no_containers: bool,
}

/// One container of the demo and what it asks for.
struct Scenario {
    name: &'static str,
    annotations: &'static [(&'static str, &'static str)],
    env: &'static [(&'static str, &'static str)],
    /// The demo's machines have 8 GPUs; the last request asks for more than is left.
    expect_refusal: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "train",
        annotations: &[("gpupin.count", "2")],
        env: &[],
        expect_refusal: false,
    },
    Scenario {
        name: "infer",
        annotations: &[],
        env: &[("GPUPIN_COUNT", "1")],
        expect_refusal: false,
    },
    Scenario {
        name: "pinned",
        annotations: &[("gpupin.devices", "7")],
        env: &[],
        expect_refusal: false,
    },
    Scenario {
        name: "spread",
        annotations: &[("gpupin.count", "2"), ("gpupin.policy", "spread")],
        env: &[],
        expect_refusal: false,
    },
    Scenario {
        name: "plain",
        annotations: &[],
        env: &[],
        expect_refusal: false,
    },
    Scenario {
        name: "greedy",
        annotations: &[("gpupin.count", "4")],
        env: &[],
        expect_refusal: true,
    },
];

impl Scenario {
    fn spec(&self, rootfs: &Path) -> BundleSpec {
        let spec = BundleSpec::sleeper(rootfs);
        let spec = self
            .annotations
            .iter()
            .fold(spec, |s, (k, v)| s.annotation(k, v));
        self.env.iter().fold(spec, |s, (k, v)| s.env(k, v))
    }

    fn describe(&self) -> String {
        let pairs = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        match (self.annotations.is_empty(), self.env.is_empty()) {
            (false, _) => format!("annotations {}", pairs(self.annotations)),
            (true, false) => format!("env {}", pairs(self.env)),
            (true, true) => "no request".into(),
        }
    }

    /// A container id of this run: cgroups are named after ids and shared by the machine.
    fn id(&self) -> String {
        format!("demo-{}-{}", std::process::id(), self.name)
    }
}

/// The demo's private directory, removed at the end (containers are deleted before it).
struct WorkDir(PathBuf);

impl WorkDir {
    fn create() -> anyhow::Result<WorkDir> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("gpupin-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the demo has set up before its first container.
struct Setup {
    work: PathBuf,
    config: Config,
    config_file: PathBuf,
    inventory: Inventory,
    /// This gpupin as the commands the demo prints name it (`typed_program`).
    program: String,
}

pub fn run(
    _system_config: &Config,
    _system_config_path: Option<&Path>,
    args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    let work = WorkDir::create()?;
    let setup = setup(&work.0, &args.machine)?;
    outln!(
        "gpupin demo on simulated machine {} ({} GPUs); config {}",
        setup.inventory.source,
        setup.inventory.gpus.len(),
        setup.config_file.display()
    )?;
    let requirements = match args.no_containers {
        true => Err("--no-containers given".to_string()),
        false => Requirements::check(),
    };
    let all_as_expected = match requirements {
        Ok(reqs) => with_containers(&setup, &reqs)?,
        Err(reason) => {
            print_fallback_notice(&reason)?;
            without_containers(&setup)?
        }
    };
    let all_back = setup_records(&setup)?.is_empty();
    if !all_as_expected || !all_back {
        out::note(format_args!(
            "gpupin: demo: not everything went as expected (see above)"
        ));
        return Ok(ExitCode::FAILURE);
    }
    outln!("\nEvery GPU is free again.")?;
    Ok(ExitCode::SUCCESS)
}

fn setup(work: &Path, machine: &str) -> anyhow::Result<Setup> {
    let state_dir = work.join("state");
    let config_file = work.join("gpupin.toml");
    let text = format!(
        "state_dir = {:?}\naudit_log = {:?}\ninventory = {machine:?}\npolicy = \"pack\"\ncdi_spec_dirs = [{:?}]\n",
        state_dir.to_string_lossy(),
        state_dir.join("audit.log").to_string_lossy(),
        work.join(driver::CDI_DIR).to_string_lossy()
    );
    std::fs::write(&config_file, text)
        .with_context(|| format!("writing {}", config_file.display()))?;
    let config = Config::load(&config_file)?;
    let inventory = config.load_inventory()?;
    let exe = std::env::current_exe().context("finding the gpupin binary")?;
    Ok(Setup {
        work: work.to_path_buf(),
        config,
        config_file,
        inventory,
        program: typed_program(&exe),
    })
}

/// A path as an admin would type it here: relative to the current directory when it is
/// under it (`target/release/gpupin` after `cargo run --release`), else as it is.
fn typed_path(path: &Path) -> String {
    let relative = std::env::current_dir()
        .ok()
        .filter(|cwd| cwd != Path::new("/"))
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .filter(|rel| !rel.as_os_str().is_empty());
    match relative {
        // A bare file name would be looked up on PATH: `./gpupin` runs this one.
        Some(rel) if rel.parent() == Some(Path::new("")) => format!("./{}", rel.display()),
        Some(rel) => rel.display().to_string(),
        None => path.display().to_string(),
    }
}

/// This gpupin as an admin would type it: `gpupin` where the first `gpupin` on PATH is
/// this binary (the package's /usr/bin/gpupin), else its path (`typed_path`), so that
/// the commands the demo prints run as shown.
fn typed_program(exe: &Path) -> String {
    let first_on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("gpupin"))
            .find(|candidate| candidate.is_file())
    });
    let same = |other: &Path| match (other.canonicalize(), exe.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    match first_on_path {
        Some(found) if same(&found) => "gpupin".to_string(),
        _ => typed_path(exe),
    }
}

fn print_fallback_notice(reason: &str) -> anyhow::Result<()> {
    outln!("No real containers: {reason}.")?;
    outln!(
        "Running the same requests through the hook protocol instead: each \"container\" is a\n\
         live `sleep` process, its OCI state goes to the hook's prestart logic in process,\n\
         which allocates in the same ledger but creates no device node and grants no cgroup\n\
         access (both need a container's mount namespace, and root); poststop is the hook's own."
    )?;
    Ok(())
}

fn setup_records(setup: &Setup) -> anyhow::Result<Vec<Record>> {
    Ok(Ledger::open_read_only(&setup.config.ledger_settings())?.records()?)
}

fn print_status(setup: &Setup) -> anyhow::Result<()> {
    // The detailed table (`status --long`): the demo's point is each container's record.
    outln!(
        "\n$ {} --config {} status --long",
        setup.program,
        setup.config_file.display()
    )?;
    let records = setup_records(setup)?;
    out!(
        "{}",
        status_table(&setup.inventory, &records, setup.config.claim_grace)
    )?;
    Ok(())
}

/// "GPUs 0,1" for the GPUs of a record, by index.
fn gpu_list(inventory: &Inventory, record: &Record) -> String {
    let indices: Vec<String> = record
        .gpus
        .iter()
        .filter_map(|uuid| inventory.gpus.iter().find(|g| &g.uuid == uuid))
        .map(|g| g.index.to_string())
        .collect();
    format!("GPUs {}", indices.join(","))
}

fn record_of(setup: &Setup, id: &str) -> anyhow::Result<Option<Record>> {
    Ok(setup_records(setup)?.into_iter().find(|r| r.id == id))
}

/// Prints one scenario's result; returns whether it was the expected one.
fn report_line(scenario: &Scenario, outcome: &str, refused: bool) -> anyhow::Result<bool> {
    outln!(
        "  {:<7} {:<52} -> {outcome}",
        scenario.name,
        scenario.describe()
    )?;
    let expected = refused == scenario.expect_refusal;
    if !expected {
        outln!(
            "          (unexpected: this request should have been {})",
            if scenario.expect_refusal {
                "refused"
            } else {
                "granted"
            }
        )?;
    }
    Ok(expected)
}

fn with_containers(setup: &Setup, reqs: &Requirements) -> anyhow::Result<bool> {
    let rootfs = setup.work.join("rootfs");
    sandbox::build_busybox_rootfs(&reqs.busybox, &rootfs)?;
    let runc = Runc::new(&reqs.runc, &setup.work.join("runc-root"));
    let exe = std::env::current_exe().context("finding the gpupin binary")?;
    let mut hook = HookCommand::beside(&exe, Some(setup.config_file.clone()));
    if !hook.exe.exists() {
        // `cargo run -- demo` builds only this binary: the CLI runs the same hook.
        outln!(
            "(no {} beside {}: the containers' hooks run `gpupin hook STAGE`)",
            typed_path(&hook.exe),
            typed_path(&exe)
        )?;
        hook.exe = exe.clone();
    }
    outln!(
        "Starting {} containers with `runc run -d` (busybox, `sleep 1000`), gpupin as their\n\
         prestart and poststop hook; what each asks for, and what it sees in /dev:",
        SCENARIOS.len()
    )?;
    let mut ok = true;
    let mut running = Vec::new();
    for scenario in SCENARIOS {
        let (expected, container) = start_one(setup, &runc, &hook, &rootfs, scenario)?;
        ok &= expected;
        running.extend(container);
    }
    let driver_root = driver::build(setup)?;
    outln!(
        "\nAnd a CUDA-style container: its spec edited before create, as gpupin-runtime and\n\
         podman's precreate hook do, against a fake driver root and the CDI spec nvidia-ctk\n\
         would write for it ({}); gpupin applies the entry of the GPU it chose:",
        driver_root.root.display()
    )?;
    let lib_hook = gpupin::command::HookCommand {
        exe: hook.exe.clone(),
        config: hook.config.clone(),
    };
    let (expected, container) = driver::start(setup, &runc, &lib_hook, &rootfs)?;
    ok &= expected;
    running.extend(container);
    let script = start_script(setup, &exe)?;
    ok &= script.is_some();
    print_status(setup)?;
    outln!("\nStopping the containers (runc kill, then runc delete, which runs poststop)...")?;
    for container in running {
        container.stop()?;
    }
    if let Some(script) = script {
        ok &= stop_script(script)?;
    }
    print_status(setup)?;
    Ok(ok)
}

/// A script outside any container on the last free GPU, through `gpupin exec`: it prints
/// what it was given and sleeps until the demo ends it.
fn start_script(setup: &Setup, exe: &Path) -> anyhow::Result<Option<Child>> {
    let command = "echo \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER \
                   GPUPIN_HOLDER=$GPUPIN_HOLDER\"; exec sleep 1000";
    outln!(
        "\nAnd a script outside any container, in the same ledger:\n  \
         $ {} --config {} exec --count 1 --name script -- sh -c '...; exec sleep 1000'",
        setup.program,
        setup.config_file.display()
    )?;
    let mut child = Command::new(exe)
        .arg("--config")
        .arg(&setup.config_file)
        .args([
            "exec", "--count", "1", "--name", "script", "--", "sh", "-c", command,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting gpupin exec")?;
    let mut line = String::new();
    let stdout = child.stdout.take().expect("piped");
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
    if line.is_empty() {
        let status = child.wait()?;
        outln!("  the script did not start ({status}): see gpupin's message above")?;
        return Ok(None);
    }
    outln!("  it sees {}", line.trim_end())?;
    Ok(Some(child))
}

/// Sends TERM to `gpupin exec`, which passes it on to the script; gpupin ends with the
/// script's status and gives its GPU back.
fn stop_script(mut script: Child) -> anyhow::Result<bool> {
    let pid = rustix::process::Pid::from_child(&script);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    let status = script.wait()?;
    let code = status.code();
    outln!(
        "Sent TERM to gpupin exec: the script got it and ended, gpupin exited with {} (128 + TERM)",
        code.map_or("a signal".to_string(), |c| c.to_string())
    )?;
    Ok(code == Some(143))
}

fn start_one(
    setup: &Setup,
    runc: &Runc,
    hook: &HookCommand,
    rootfs: &Path,
    scenario: &Scenario,
) -> anyhow::Result<(bool, Option<Container>)> {
    let id = scenario.id();
    let bundle = setup.work.join("bundles").join(scenario.name);
    sandbox::write_bundle(&bundle, &scenario.spec(rootfs).with_hook(hook))?;
    let container = match runc.run_detached(&id, &bundle) {
        Ok(c) => c,
        Err(err) => return Ok((report_refusal(scenario, &err.to_string())?, None)),
    };
    let nodes = nvidia_nodes(&container)?;
    let outcome = match record_of(setup, &id)? {
        Some(r) => format!("{}; sees {nodes}", gpu_list(&setup.inventory, &r)),
        None => format!("untouched; sees {nodes}"),
    };
    Ok((report_line(scenario, &outcome, false)?, Some(container)))
}

/// A refusal counts as one only when gpupin said no; any other runc failure is a fault.
fn report_refusal(scenario: &Scenario, runc_error: &str) -> anyhow::Result<bool> {
    match sandbox::hook_message(runc_error) {
        Some(message) => report_line(scenario, &format!("refused: {message}"), true),
        None => {
            report_line(scenario, &format!("failed: {runc_error}"), true)?;
            Ok(false)
        }
    }
}

/// The container's /dev/nvidia* entries, as `ls /dev` inside it shows them.
fn nvidia_nodes(container: &Container) -> anyhow::Result<String> {
    let ls = container.exec_stdout(&["ls", "/dev"])?;
    let nodes: Vec<&str> = ls
        .split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .collect();
    Ok(match nodes.is_empty() {
        true => "no nvidia node".into(),
        false => nodes.join(" "),
    })
}

/// A stand-in container: a live `sleep` and the OCI state a runtime would pass.
struct FakeContainer {
    sleep: Child,
    state: Vec<u8>,
}

impl FakeContainer {
    fn kill(&mut self) {
        let _ = self.sleep.kill();
        let _ = self.sleep.wait();
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn without_containers(setup: &Setup) -> anyhow::Result<bool> {
    outln!("Requests, each from a `sleep` process with its own bundle:")?;
    let mut ok = true;
    let mut fakes = Vec::new();
    for scenario in SCENARIOS {
        let fake = fake_container(setup, scenario)?;
        let outcome = no_container::prestart_without_container(&setup.config, &fake.state);
        ok &= match outcome {
            Ok(Some(r)) => report_line(scenario, &gpu_list(&setup.inventory, &r), false),
            Ok(None) => report_line(scenario, "untouched", false),
            Err(e) => report_line(
                scenario,
                &format!("refused: gpupin: {}", gpupin::command::one_line(e.as_ref())),
                true,
            ),
        }?;
        fakes.push(fake);
    }
    print_status(setup)?;
    outln!("\nStopping: each `sleep` is killed and its state goes to the hook's poststop...")?;
    for mut fake in fakes {
        fake.kill();
        no_container::poststop(&setup.config, &fake.state)?;
    }
    print_status(setup)?;
    Ok(ok)
}

fn fake_container(setup: &Setup, scenario: &Scenario) -> anyhow::Result<FakeContainer> {
    let bundle = setup.work.join("bundles").join(scenario.name);
    let spec = scenario.spec(&setup.work.join("rootfs"));
    sandbox::write_bundle(&bundle, &spec)?;
    let sleep = Command::new("sleep")
        .arg("1000")
        .spawn()
        .context("starting sleep")?;
    let state = serde_json::json!({
        "ociVersion": "1.0.2",
        "id": scenario.id(),
        "status": "created",
        "pid": sleep.id(),
        "bundle": bundle,
        "annotations": spec.annotations,
    });
    Ok(FakeContainer {
        sleep,
        state: state.to_string().into_bytes(),
    })
}
