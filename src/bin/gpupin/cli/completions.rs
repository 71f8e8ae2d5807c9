//! `gpupin completions bash|zsh|fish`: shell completions from the command definitions, and
//! `gpupin manpage DIR` (hidden): the man pages, for packagers.

use clap::CommandFactory;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in
    pub shell: clap_complete::Shell,
}

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut visible_command(), "gpupin", &mut out);
    let script = with_holders(args.shell, &String::from_utf8_lossy(&out));
    out!("{script}")?;
    Ok(ExitCode::SUCCESS)
}

/// gpupin's commands without the hidden ones (`nvml`, `exec-gate`, `manpage`,
/// `holders`): clap's generators list those too, and a user pressing tab should see only
/// what `gpupin --help` shows. clap cannot remove a subcommand, so the top level is
/// built again from its visible parts.
fn visible_command() -> clap::Command {
    let full = super::Cli::command();
    let mut visible = clap::Command::new("gpupin")
        .args(full.get_arguments().cloned())
        .subcommands(full.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if full.get_version().is_some() {
        visible = visible.version(env!("CARGO_PKG_VERSION"));
    }
    if let Some(about) = full.get_about() {
        visible = visible.about(about.clone());
    }
    visible
}

/// The commands whose argument is a holder as `gpupin status` shows it.
const HOLDER_COMMANDS: [&str; 3] = ["release", "evict", "key"];

/// clap's script, plus completing holders (`gpupin holders`, asked when the user presses
/// tab: the ledger changes every minute) after `release`, `evict`, `key` and `log
/// --holder`. clap's static scripts cannot list them, so each shell gets a small addition
/// in its own idiom; `--config` on the command line is passed on, so the list is that
/// ledger's.
fn with_holders(shell: clap_complete::Shell, script: &str) -> String {
    use clap_complete::Shell;
    let commands = HOLDER_COMMANDS.join(" ");
    match shell {
        Shell::Bash => format!(
            "{script}\n{}",
            BASH_HOLDERS
                .replace("@COMMANDS@", &HOLDER_COMMANDS.join("|"))
                .trim_start()
        ),
        Shell::Fish => format!(
            "{script}\n# Holders as gpupin status shows them, from the ledger.\n\
             complete -c gpupin -n \"__fish_seen_subcommand_from {commands}\" -f -a \"(gpupin holders 2>/dev/null)\"\n\
             complete -c gpupin -n \"__fish_seen_subcommand_from log\" -l holder -r -f -a \"(gpupin holders 2>/dev/null)\"\n"
        ),
        Shell::Zsh => {
            // clap gives these arguments `_default` (files); they name holders.
            let lines: Vec<String> = script
                .lines()
                .map(
                    |line| match ZSH_HOLDER_ARGS.iter().any(|a| line.starts_with(a)) {
                        true => line.replace(":_default' \\", ":_gpupin_holders' \\"),
                        false => line.to_string(),
                    },
                )
                .collect();
            let script = lines.join("\n") + "\n";
            match script.split_once('\n') {
                Some((compdef, rest)) => format!("{compdef}\n{ZSH_HOLDERS}{rest}"),
                None => script,
            }
        }
        _ => script.to_string(),
    }
}

/// Replaces clap's `complete -F _gpupin gpupin` with a function that answers holders
/// itself and hands everything else to clap's.
const BASH_HOLDERS: &str = r#"
# Holders as gpupin status shows them, from the ledger (gpupin holders).
_gpupin_holders_or_clap() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local i word sub="" config=()
    for (( i = 1; i < COMP_CWORD; i++ )); do
        word="${COMP_WORDS[i]}"
        case "${word}" in
            --config) config=(--config "${COMP_WORDS[i+1]}"); (( i++ )) ;;
            --config=*) config=("${word}") ;;
            -*) ;;
            *) [[ -z "${sub}" ]] && sub="${word}" ;;
        esac
    done
    if [[ "${cur}" != -* ]] && { [[ "${sub}" == log && "${prev}" == --holder ]] ||
        [[ "${sub}" == @(@COMMANDS@) && "${prev}" != @(--config|--grace) ]]; }; then
        COMPREPLY=( $(compgen -W "$(gpupin "${config[@]}" holders 2>/dev/null)" -- "${cur}") )
        return 0
    fi
    _gpupin "$@"
}
complete -F _gpupin_holders_or_clap -o nosort -o bashdefault -o default gpupin
"#;

/// How the zsh argument specs that name a holder begin, as clap writes them from the
/// arguments' help (hold's `id`, a new holder's, is not among them).
const ZSH_HOLDER_ARGS: [&str; 4] = [
    "':id -- The holder id, as `gpupin status` shows it",
    "':id -- The holder as `gpupin status` shows it",
    "':holder -- The holder as `gpupin status` shows it",
    "'--holder=[Only events of this holder",
];

const ZSH_HOLDERS: &str = r#"
# Holders as gpupin status shows them, from the ledger (gpupin holders).
_gpupin_holders() {
    local -a holders
    holders=(${(f)"$(gpupin holders 2>/dev/null)"})
    compadd -a holders
}

"#;

#[derive(clap::Args)]
pub struct ManpageArgs {
    /// Where to write the pages: DIR/man1/gpupin.1 and a gpupin-COMMAND.1 for each command,
    /// DIR/man5/gpupin.toml.5, DIR/man8/gpupin-hook.8 and gpupin-runtime.8 (MANPATH=DIR)
    pub dir: std::path::PathBuf,
}

/// gpupin(1) and a page per command, in roff, from the clap definitions (a command's
/// `after_long_help` is its EXAMPLES); gpupin.toml(5) from the commented config the
/// package ships; gpupin-hook(8) and gpupin-runtime(8), which have no clap definitions.
pub fn manpages(args: &ManpageArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    // `gpupin help` is clap's, and would be a gpupin-help(1) no page is written for.
    let top = super::Cli::command().disable_help_subcommand(true);
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    // man(1) looks in DIR/man<section>, so `MANPATH=DIR man gpupin` finds what is written.
    let man1 = args.dir.join("man1");
    for section in ["man1", "man5", "man8"] {
        let dir = args.dir.join(section);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut written = vec![write_page(&man1, "gpupin", top.clone())?];
    for (name, section, roff) in [
        ("gpupin.toml", "5", config_page()),
        ("gpupin-hook", "8", HOOK_PAGE.to_string()),
        ("gpupin-runtime", "8", RUNTIME_PAGE.to_string()),
    ] {
        let path = args
            .dir
            .join(format!("man{section}"))
            .join(format!("{name}.{section}"));
        std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("gpupin-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("gpupin {}", sub.get_name()));
        written.push(write_page(&man1, &name, page)?);
    }
    for path in written {
        outln!("{}", path.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn write_page(
    dir: &std::path::Path,
    name: &str,
    command: clap::Command,
) -> anyhow::Result<std::path::PathBuf> {
    use anyhow::Context;
    let mut roff = Vec::new();
    clap_mangen::Man::new(command).render(&mut roff)?;
    let roff = examples_section(&String::from_utf8(roff)?);
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// clap_mangen renders `after_long_help` as an EXTRA section of filled text; gpupin's is
/// examples (`Examples:` and one command a line): an EXAMPLES section, lines kept.
fn examples_section(roff: &str) -> String {
    let Some(start) = roff.find(".SH EXTRA\n") else {
        return roff.to_string();
    };
    let body_start = start + ".SH EXTRA\n".len();
    let body_end = roff[body_start..]
        .find("\n.SH ")
        .map_or(roff.len(), |i| body_start + i + 1);
    let body: Vec<&str> = roff[body_start..body_end]
        .lines()
        .filter(|l| *l != "Examples:")
        .collect();
    format!(
        "{}.SH EXAMPLES\n.nf\n{}\n.fi\n{}",
        &roff[..start],
        body.join("\n"),
        &roff[body_end..]
    )
}

/// The commented config the package ships as /etc/gpupin/config.toml.
const SHIPPED_CONFIG: &str = include_str!("../../../../packaging/config.toml");

/// gpupin.toml(5): the shipped config, every key with its default and what it does.
fn config_page() -> String {
    let mut roff = String::from(
        ".TH gpupin.toml 5 \"\" \"gpupin\" \"File Formats\"\n\
         .SH NAME\ngpupin.toml \\- gpupin's configuration file\n\
         .SH SYNOPSIS\n/etc/gpupin/config.toml, or the file \\fB\\-\\-config\\fR or \\fB$GPUPIN_CONFIG\\fR names\n\
         .SH DESCRIPTION\n\
         TOML. A missing default file means the defaults. Relative paths are relative to the file. \
         A file that does not parse is one line naming its line, its table and the key meant; \
         \\fBgpupin config check\\fR prints that line, or every key as gpupin uses it. \
         The file the package installs, below, has every key commented out at its default.\n\
         .SH FILE\n.nf\n",
    );
    for line in SHIPPED_CONFIG.lines() {
        roff.push_str(&roff_literal(line));
        roff.push('\n');
    }
    roff.push_str(".fi\n.SH SEE ALSO\ngpupin(1), gpupin\\-config(1), gpupin\\-doctor(1)\n");
    roff
}

/// A line of text as roff shows it verbatim: backslashes escaped, and a leading `.` or
/// `'` kept from reading as a request.
fn roff_literal(line: &str) -> String {
    let escaped = line.replace('\\', "\\e");
    match escaped.starts_with(['.', '\'']) {
        true => format!("\\&{escaped}"),
        false => escaped,
    }
}

const HOOK_PAGE: &str = r#".TH gpupin-hook 8 "" "gpupin" "System Administration"
.SH NAME
gpupin\-hook \- the OCI hook that gives containers the GPUs gpupin chose
.SH SYNOPSIS
\fBgpupin\-hook\fR [\fB\-\-config\fR \fIFILE\fR] \fISTAGE\fR
.SH DESCRIPTION
Runtimes start it for containers: podman and CRI\-O through hooks.d files (precreate, prestart,
poststop), runc through the hooks of a spec gpupin edited. The container's state is on stdin (for
precreate: its spec, written back edited on stdout). STAGE is precreate, prestart, createRuntime or
poststop. A container that asks for no GPU costs little more than the exec; one that asks gets the
GPUs gpupin chose under its lock, recorded in its ledger, and given back at poststop. A refusal is
one line on stderr, which the runtime shows.
.SH OPTIONS
.TP
\fB\-\-config\fR \fIFILE\fR
gpupin's configuration; default: $GPUPIN_CONFIG, else /etc/gpupin/config.toml (runtimes start hooks
with an empty environment: hooks.d files name it)
.SH SEE ALSO
gpupin(1), gpupin\-runtime(8), gpupin\-install(1), gpupin.toml(5)
"#;

const RUNTIME_PAGE: &str = r#".TH gpupin-runtime 8 "" "gpupin" "System Administration"
.SH NAME
gpupin\-runtime \- an OCI runtime for Docker and compose that pins GPUs, then runs runc
.SH SYNOPSIS
\fBgpupin\-runtime\fR [\fB\-\-gpupin\-config\fR \fI/ABSOLUTE/FILE\fR] [\fB\-\-gpupin\-runtime\fR \fIRUNTIME\fR] \fIrunc arguments\fR
.SH DESCRIPTION
Named in Docker's daemon.json (\fBgpupin install docker\fR), or as containerd's runc binary for the
CRI runtime handler \fBgpupin\fR. On \fBcreate\fR it reads the container's request (labels,
annotations, env, Docker's \fB\-\-gpus\fR), chooses GPUs under gpupin's lock, records them and
edits the bundle's spec (device nodes, cgroup rules, NVIDIA_VISIBLE_DEVICES, the driver through
CDI), then hands over to the real runtime; every other command goes to the real runtime unchanged.
While gpupin's config does not load, a container that has nothing to do with GPUs still starts,
with a warning; any other is refused.
.SH OPTIONS
.TP
\fB\-\-gpupin\-config\fR \fIFILE\fR
gpupin's configuration (absolute); default: $GPUPIN_CONFIG, else /etc/gpupin/config.toml
.TP
\fB\-\-gpupin\-runtime\fR \fIRUNTIME\fR
the runtime to hand over to (a path, or a name on PATH), instead of the config's \fBruntime\fR
.SH SEE ALSO
gpupin(1), gpupin\-hook(8), gpupin\-install(1), gpupin.toml(5)
"#;
