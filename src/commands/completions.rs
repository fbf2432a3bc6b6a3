//! `icq completions <shell>`: prints a completion script for bash, zsh, fish, ...
//! through [`crate::cli::output::raw`], so a closed or full stdout is an error or nothing, not a
//! panic.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Arguments of `icq completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    pub shell: Shell,
}

/// Writes the completion script to stdout. The script is rendered in memory first: a
/// closed pipe (`icq completions bash | head -0`) is not an error, and a failed write
/// (`> /dev/full`) is reported as one (exit 1), never a panic.
pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = super::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "icq", &mut script);
    crate::cli::output::raw(&String::from_utf8_lossy(&script))?;
    Ok(())
}
