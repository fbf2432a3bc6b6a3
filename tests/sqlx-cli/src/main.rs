//! The `sqlx` command line: sqlx-cli 0.9.0's own `src/bin/sqlx.rs` (minus the colour on the
//! error line), so the interop tests drive the real sqlx-cli without an installed binary.

use clap::Parser;
use sqlx_cli::Opt;

#[tokio::main]
async fn main() {
    // Reads `.env` unless `--no-dotenv` is given, as `sqlx` does.
    sqlx_cli::maybe_apply_dotenv();
    sqlx::any::install_default_drivers();
    let opt = Opt::parse();
    if let Err(error) = sqlx_cli::run(opt).await {
        println!("error: {error}");
        std::process::exit(1);
    }
}
