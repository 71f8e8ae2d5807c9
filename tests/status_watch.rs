//! `gpupin status --watch` on a real pseudo-terminal (a tmux pane of 80 columns): the
//! screen is redrawn when the live figures change, fits the width, and is coloured only
//! there; and `gpupin exec --wait`'s line while it waits. Needs tmux; the exec test root.

use gpupin_sandbox::find_on_path;
use gpupin_sandbox::harness::{Gpupin, Sleeper, required};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const WIDTH: usize = 80;

/// A live file for sim:nvswitch8: GPU 0 at `busy`%, `pid` on GPU 1.
fn write_live(path: &Path, busy: u32, pid: i32) {
    let gpus: Vec<Value> = (0..8)
        .map(|i| {
            let processes = match i {
                1 => json!([{"pid": pid, "used_memory": "3GiB"}]),
                _ => json!([]),
            };
            json!({"index": i, "utilization": if i == 0 { busy } else { 5 },
                   "memory_free": "50GiB", "temperature": 45, "power": 300,
                   "processes": processes})
        })
        .collect();
    std::fs::write(path, json!({ "gpus": gpus }).to_string()).unwrap();
}

/// A tmux server of our own (its own socket), one detached pane of 80 columns; killed
/// when dropped.
struct Tmux {
    bin: PathBuf,
    socket: PathBuf,
}

impl Tmux {
    fn start(bin: PathBuf, socket: PathBuf, shell_command: &str) -> Tmux {
        let tmux = Tmux { bin, socket };
        let width = WIDTH.to_string();
        let out = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            "watch",
            "-x",
            &width,
            "-y",
            "60",
            shell_command,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("-f")
            .arg("/dev/null")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// The pane as text; wrapped lines joined (`-J`), so a line wider than the pane
    /// shows as such; with `escapes`, colours as ANSI sequences.
    fn screen(&self, escapes: bool) -> String {
        let mut args = vec!["capture-pane", "-p", "-J", "-t", "watch"];
        if escapes {
            args.push("-e");
        }
        String::from_utf8_lossy(&self.run(&args).stdout).into_owned()
    }

    /// The screen once `ready` holds. Not a timing assertion: the deadline only stops
    /// a test whose screen never comes.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let screen = self.screen(false);
            if ready(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "never saw {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// GPU 0's row of figures: the line that starts with `0` and has a percentage.
fn gpu0_figures(screen: &str) -> Option<String> {
    screen
        .lines()
        .find(|l| l.starts_with("0 ") && l.contains('%'))
        .map(str::to_string)
}

#[test]
fn watch_redraws_in_80_columns_with_colour_on_a_terminal() {
    let test = "watch_redraws_in_80_columns_with_colour_on_a_terminal";
    let found = find_on_path("tmux").ok_or_else(|| "tmux is not installed".to_string());
    let Some(tmux_bin) = required(test, found) else {
        return;
    };
    let g = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", "live_file = \"live.json\"");
    let live = g.config.parent().unwrap().join("live.json");
    let outside = Sleeper::start();
    write_live(&live, 87, outside.pid());
    let command = format!(
        "env -u NO_COLOR -u GPUPIN_CONFIG {} --config {} status --long --watch 0.5; sleep 600",
        shell_quote(&g.bin.display().to_string()),
        shell_quote(&g.config.display().to_string()),
    );
    let tmux = Tmux::start(tmux_bin, g.dir.path().join("tmux.sock"), &command);

    let screen = tmux.wait_for("the first screen", |s| {
        gpu0_figures(s).is_some_and(|l| l.contains("87%"))
    });
    assert!(screen.starts_with("Every 500ms: gpupin status"), "{screen}");
    assert!(
        // GPU 1 runs a process of no holder: free to no one (issue 32, item 5).
        screen.contains("7 of 8 GPUs free, 0 holders, 1 process not gpupin's"),
        "{screen}"
    );
    let foreign = format!("1    {}", outside.pid());
    assert!(
        screen
            .lines()
            .any(|l| l.starts_with(&foreign) && l.contains("not gpupin's")),
        "{screen}"
    );
    for line in screen.lines() {
        assert!(
            line.chars().count() <= WIDTH,
            "wider than {WIDTH}: {line:?}"
        );
    }
    let coloured = tmux.screen(true);
    assert!(coloured.contains("\x1b[1m"), "bold headers:\n{coloured:?}");
    assert!(
        coloured.contains("\x1b[33m"),
        "the foreign process in yellow:\n{coloured:?}"
    );

    // One refresh: the new figure replaces the old on the same screen.
    write_live(&live, 42, outside.pid());
    let screen = tmux.wait_for("the figure change", |s| {
        gpu0_figures(s).is_some_and(|l| l.contains("42%"))
    });
    assert!(!screen.contains("87%"), "redrawn, not appended:\n{screen}");
    assert_eq!(screen.matches("Every 500ms").count(), 1, "{screen}");
}

#[test]
fn watch_into_a_pipe_prints_plain_screens_and_json_lines() {
    let g = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", "live_file = \"live.json\"");
    let outside = Sleeper::start();
    write_live(
        &g.config.parent().unwrap().join("live.json"),
        87,
        outside.pid(),
    );
    for (args, check) in [
        (&["status", "--watch", "0.2"][..], "plain"),
        (&["status", "--watch=0.2", "--json"][..], "json"),
    ] {
        let mut child = Command::new(&g.bin)
            .env_remove("GPUPIN_CONFIG")
            .arg("--config")
            .arg(&g.config)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut text = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        // Two screens, then stop it.
        let mut screens = 0;
        while screens < 2 {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
            assert!(n > 0, "{args:?} ended early:\n{text}");
            if check == "json" {
                let v: Value = serde_json::from_str(&line).expect("one JSON document a line");
                assert_eq!(v["foreign"], 1);
                screens += 1;
            } else if line.contains("GPUs free") {
                screens += 1;
            }
            text.push_str(&line);
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !text.contains('\x1b'),
            "{args:?}: escapes into a pipe:\n{text}"
        );
    }
}

#[test]
fn a_bad_watch_period_is_one_line() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    for bad in ["0", "-1", "soon", "nan"] {
        let out = g.run(&["status", &format!("--watch={bad}")], "");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("expected seconds between 0.1 and 86400"),
            "{bad}: {err}"
        );
    }
}

/// `gpupin exec --wait` on a terminal (root: it allocates itself): while every GPU is
/// held, one line says what it waits for and why, redrawn in place;
/// when a GPU frees up the line goes and the job runs.
#[test]
fn exec_wait_shows_its_place_in_the_queue_on_a_terminal() {
    let test = "exec_wait_shows_its_place_in_the_queue_on_a_terminal";
    if !gpupin_sandbox::harness::need_root(test) {
        return;
    }
    let found = find_on_path("tmux").ok_or_else(|| "tmux is not installed".to_string());
    let Some(tmux_bin) = required(test, found) else {
        return;
    };
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let held = g.run(
        &["hold", "everything", "--count", "8", "--until-release"],
        "",
    );
    assert!(held.status.success(), "{held:?}");
    let command = format!(
        "env -u GPUPIN_CONFIG {} --config {} exec --count 1 --wait 120s -- echo JOB-RAN; sleep 600",
        shell_quote(&g.bin.display().to_string()),
        shell_quote(&g.config.display().to_string()),
    );
    let tmux = Tmux::start(tmux_bin, g.dir.path().join("tmux.sock"), &command);
    let screen = tmux.wait_for("the waiting line", |s| {
        s.contains("gpupin: waiting for count=1 (too few GPUs free), ")
    });
    assert!(!screen.contains("JOB-RAN"), "{screen}");
    let released = g.run(&["release", "everything"], "");
    assert!(released.status.success(), "{released:?}");
    let screen = tmux.wait_for("the job", |s| s.contains("JOB-RAN"));
    assert!(
        !screen.contains("waiting for"),
        "the line is cleared:\n{screen}"
    );
}
