//! `gpupin`: the CLI and the OCI hook. Thin: parses arguments, sets up logging, and
//! hands over to one file per command under cli/.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
