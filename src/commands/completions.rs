//! `icq completions <shell>`: prints a completion script for bash, zsh, fish, ...

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Arguments of `icq completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    pub shell: Shell,
}

/// Writes the completion script to stdout.
pub fn run(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "icq", &mut std::io::stdout());
    Ok(())
}
