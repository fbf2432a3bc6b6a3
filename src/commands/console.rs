//! `icq console [--addr 127.0.0.1:8089] [--allow-actions]`: serve the operations console
//! until Ctrl-C (or SIGTERM). The token comes from `ICQ_CONSOLE_TOKEN` only, never from
//! the command line (where `ps` would show it).

use std::net::SocketAddr;

use clap::Args;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::GlobalArgs;
use crate::cli::console::{self, ConsoleOptions};

/// Arguments of `icq console`.
#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    /// Where to listen. Any non-loopback address needs ICQ_CONSOLE_TOKEN (every page then
    /// asks for it); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8089")]
    pub addr: SocketAddr,

    /// Offer requeue, replay, cancel and purge (each confirmed, each needing the token
    /// from ICQ_CONSOLE_TOKEN). Without it the console only reads.
    #[arg(long)]
    pub allow_actions: bool,
}

/// The environment variable holding the console's token.
pub const TOKEN_VAR: &str = "ICQ_CONSOLE_TOKEN";

/// Runs `icq console`.
pub async fn run(args: ConsoleArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let options = ConsoleOptions {
        addr: args.addr,
        allow_actions: args.allow_actions,
        token: std::env::var(TOKEN_VAR).ok(),
        url_origin: Some(if global.database_url.is_some() {
            "--database-url"
        } else {
            "$DATABASE_URL"
        }),
    };
    options.validate()?;
    let config = crate::cli::sources::load_config(&global.source_request())?;
    let shutdown = CancellationToken::new();
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        stop.cancel();
    });
    let mode = if options.allow_actions {
        "actions allowed, with the token"
    } else {
        "read-only"
    };
    console::serve(
        &config,
        global.source.as_deref(),
        options,
        shutdown,
        |addr| {
            crate::cli::output::note(&format!(
                "icq console listening on http://{addr}/ ({mode}); Ctrl-C stops it"
            ));
        },
    )
    .await?;
    Ok(())
}

/// `icq console --help`.
pub const HELP: &str = "\
Examples:
  icq console                                   # http://127.0.0.1:8089/, read-only
  icq console --source shop --addr 127.0.0.1:0  # one source, a free port
  ICQ_CONSOLE_TOKEN=$(openssl rand -hex 16) icq console --allow-actions

Security:
  Binds 127.0.0.1 by default and answers to loopback host names only. Another address
  needs ICQ_CONSOLE_TOKEN (16 bytes at least: openssl rand -hex 16), and every page then
  asks for it; after a few wrong tokens an address waits, longer each time. Requeue,
  replay, cancel and purge exist only with --allow-actions and a token; each is
  confirmed, is a POST that must come from the console's own page (Origin /
  Sec-Fetch-Site) and carry the token. A request from another site gets 403, GET
  included. The console counts only while a page of it is open.

Exit codes:
  0  stopped by Ctrl-C or SIGTERM
  1  the server failed
  2  usage error (a non-loopback --addr or --allow-actions without ICQ_CONSOLE_TOKEN,
     a token under 16 bytes, an address already in use, a configuration error)";
