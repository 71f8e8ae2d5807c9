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
    clap_complete::generate(args.shell, &mut super::Cli::command(), "gpupin", &mut out);
    out!("{}", String::from_utf8_lossy(&out))?;
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct ManpageArgs {
    /// Where to write gpupin.1 and a gpupin-COMMAND.1 for each command
    pub dir: std::path::PathBuf,
}

/// gpupin(1) and a page per command, in roff, from the clap definitions.
pub fn manpages(args: &ManpageArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let top = super::Cli::command();
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut written = vec![write_page(&args.dir, "gpupin", top.clone())?];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("gpupin-{}", sub.get_name());
        let page = sub
            .clone()
            .display_name(name.clone())
            .bin_name(format!("gpupin {}", sub.get_name()));
        written.push(write_page(&args.dir, &name, page)?);
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
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, roff).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
