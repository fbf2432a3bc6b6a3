//! The `icq` binary: parse the command line, run it through the library, report errors
//! on stderr with the exit code the error calls for (0 ok, 1 failure, 2 usage, 3 not found).

use clap::Parser;

fn main() {
    let cli = icq::commands::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            icq::output::note(&format!("error: cannot start the async runtime: {err}"));
            std::process::exit(1);
        }
    };
    if let Err(err) = runtime.block_on(icq::commands::run(cli)) {
        icq::output::note(&format!("error: {err:#}"));
        std::process::exit(icq::commands::exit_code(&err));
    }
}
