//! The manual: the examples and exit codes every subcommand's `--help` ends with, and
//! `icq man [--dir DIR]`, which renders man pages from the same clap definitions (so the
//! man page can never disagree with `--help`).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory};

/// Arguments of `icq man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write icq.1 and one page per subcommand (icq-work.1, icq-dead-letters-list.1, ...)
    /// into this directory instead of printing icq.1 to stdout.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the `icq(1)` man page, or writes every page into `--dir`.
pub fn run(args: ManArgs) -> anyhow::Result<()> {
    let command = super::Cli::command();
    match args.dir {
        Some(dir) => write_pages(command, &dir),
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .context("rendering the man page")?;
            crate::cli::output::raw(&String::from_utf8_lossy(&page))?;
            Ok(())
        }
    }
}

/// Writes `icq.1` and one page per (nested) subcommand into `dir`, creating it, and
/// prints the paths written.
fn write_pages(command: clap::Command, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(icq::Error::io(format!(
        "creating the man page directory {}",
        dir.display()
    )))?;
    clap_mangen::generate_to(command, dir).map_err(icq::Error::io(format!(
        "writing man pages into {}",
        dir.display()
    )))?;
    let mut written: Vec<String> = std::fs::read_dir(dir)
        .map_err(icq::Error::io(format!("listing {}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "1")
                && path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name == "icq.1" || name.starts_with("icq-"))
        })
        .map(|path| path.display().to_string())
        .collect();
    written.sort();
    crate::cli::output::raw(&format!("{}\n", written.join("\n")))?;
    Ok(())
}

/// The exit codes every command shares, shown by `icq --help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  runtime failure (database, I/O, a failed run); the message is on stderr
  2  usage or configuration error (also an id no row can have: not a UUID on PostgreSQL)
  3  not found (an id that does not exist)
With --format json an error is also one JSON document on stderr:
  {\"error\": {\"message\": \"...\", \"kind\": \"usage\", \"exit_code\": 2}}";

/// `icq migrate add --help`.
pub const MIGRATE_ADD: &str = "\
Examples:
  icq migrate add --engine postgres             # migrations/<timestamp>_add_internal_commands.sql
  icq migrate add --engine sqlite --reversible  # an .up.sql + .down.sql pair
  icq migrate add --engine mysql --table jobs.Commands --dir db/migrations
  icq migrate add --engine postgres --stdout    # print the SQL, write nothing

Upgrading: in a directory whose migration creates the table at schema version 1 (an
older icq), `add` writes <version>_icq_schema_v2.sql, the upgrade to version 2 (queues,
priorities, unique keys); when the directory already has version 2 it writes nothing.

Exit codes:
  0  written (or printed), or the directory is already up to date
  1  the directory could not be written
  2  usage error: unknown engine, a file that exists, a directory that holds another
     engine's migration";

/// `icq migrate run --help`.
pub const MIGRATE_RUN: &str = "\
Examples:
  icq migrate run --database-url postgres://app@localhost/orders
  icq migrate run --dry-run                     # what would be applied; changes nothing
  icq migrate run --target-version 20260101120000 --dir db/migrations

Exit codes:
  0  applied, or already up to date
  1  a migration failed, the database is dirty, or a file changed since it was applied
  2  usage error: no database, no directory, a target that is not in it";

/// `icq migrate revert --help`.
pub const MIGRATE_REVERT: &str = "\
Examples:
  icq migrate revert --database-url sqlite://app.db   # undo the latest migration
  icq migrate revert --dry-run
  icq migrate revert --target-version 0               # undo all of them

Exit codes:
  0  reverted, or nothing to revert
  1  a down migration failed, or the database is dirty
  2  usage error: a migration without .down.sql, a target that is not in the directory";

/// `icq migrate info --help`.
pub const MIGRATE_INFO: &str = "\
Examples:
  icq migrate info --database-url mysql://root@localhost/app
  icq migrate info --format json | jq '.migrations[] | select(.state == \"pending\")'

Each line is VERSION/STATE DESCRIPTION, as sqlx migrate info prints it; STATE is installed,
pending, installed (different checksum), installed (dirty: failed half-way) or
installed (file missing).

Exit codes:
  0  listed
  1  database error
  2  usage error: no database, no directory";

/// `icq work --help`.
pub const WORK: &str = "\
Examples:
  icq work                                    # every source, until SIGINT/SIGTERM
  icq work --source orders --metrics-addr 127.0.0.1:9464
  icq work --until-idle                       # drain what is due, then exit
  icq work --until-idle --fail-on-dead        # CI: fail if anything was dead-lettered

Exit codes:
  0  stopped by a signal, or idle with --until-idle
  1  a source failed; with --fail-on-dead, commands were dead-lettered during the run
  2  usage or configuration error (no handlers, a missing exec program, ...)";

/// `icq pending --help`.
pub const PENDING: &str = "\
Examples:
  icq pending
  icq pending --by-type --source orders
  icq pending --by-queue                      # one line per queue (--by-type too: per queue and type)
  icq pending --queue emails --format json

Exit codes:
  0  counted
  1  database error
  2  usage or configuration error";

/// `icq dead-letters --help`.
pub const DEAD_LETTERS: &str = "\
Examples:
  icq dead-letters list
  icq dead-letters list --type orders.send_receipt --limit 20 --format json
  icq dead-letters list --queue emails
  icq dead-letters show 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d

Exit codes:
  0  listed or shown
  1  database error
  2  usage or configuration error
  3  show: no command has that id";

/// `icq list --help`.
pub const LIST: &str = "\
Examples:
  icq list                                    # pending commands in claim order: priority, run at
  icq list --state dead --type orders.send_receipt
  icq list --queue emails                     # one queue (schema version 2)
  icq list --state completed --limit 100 --after 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq list --state scheduled --before 2026-12-24T00:00:00Z --format json

Pages: each page ends with the id to pass as --after for the next one (JSON: next_after).

Exit codes:
  0  listed
  1  database error
  2  usage or configuration error (several sources without --source, a malformed --after id)
  3  the --after id does not exist";

/// `icq show --help`.
pub const SHOW: &str = "\
Examples:
  icq show 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq show 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d --format json

Exit codes:
  0  shown
  1  database error
  2  usage or configuration error
  3  no command has that id";

/// `icq cancel --help`.
pub const CANCEL: &str = "\
Examples:
  icq cancel 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq cancel --type reports.nightly --yes
  icq cancel --queue emails --type mail.digest --yes

A cancelled command becomes a dead letter with LastError \"cancelled by operator\": it
stays visible (icq dead-letters list), can be requeued, and is purged like any dead letter.
A running command named by its id is cancelled too: its lease is cleared, so the worker
running it stops the handler (within about 2 seconds; at once on PostgreSQL) and cannot
record an outcome. --type and --queue cancel due and scheduled commands only.

Exit codes:
  0  cancelled
  1  database error
  2  usage error (a completed or dead command, a bad --queue or one on a schema version 1
     table, --yes missing off a terminal)
  3  an id does not exist";

/// `icq requeue --help`.
pub const REQUEUE: &str = "\
Examples:
  icq requeue 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq requeue --all-dead --type orders.send_receipt --yes
  icq requeue --all-dead --queue emails --yes

A dead letter whose unique key a pending command holds stays dead and is listed as
skipped (JSON: skipped[].reason \"unique key K is held by pending row ID\").

Exit codes:
  0  requeued (skipped ones included)
  1  database error
  2  usage error (a command in a state that cannot be requeued, --yes missing off a terminal)
  3  an id does not exist";

/// `icq purge --help`.
pub const PURGE: &str = "\
Examples:
  icq purge --completed --older-than 7d --yes
  icq purge --dead-letters --dry-run
  icq purge --completed --dead-letters --older-than 30d --yes --format json
  icq purge --dead-letters --queue emails --dry-run

Exit codes:
  0  deleted (or counted, with --dry-run)
  1  database error
  2  usage error (--yes missing off a terminal, a bad --older-than)";

/// `icq replay --help`.
pub const REPLAY: &str = "\
Examples:
  icq replay 0b9e6c1e-8d3b-4c55-9a52-1f0a8f4e2b7d
  icq replay ID1 ID2 --format json

The copy keeps the type, payload, captured context, queue, priority and unique key. When a
pending command already holds the unique key, no copy is made: that command's id is
printed (JSON: \"existing\": true).

Exit codes:
  0  replayed; the new ids are printed
  1  database error
  2  usage error (a command that is still pending)
  3  an id does not exist";

/// `icq schedule --help`.
pub const SCHEDULE: &str = "\
Examples:
  icq schedule --type orders.send_receipt --payload '{\"order_id\": 42}'
  icq schedule --type reports.nightly --payload @report.json --at 2026-01-31T02:00:00Z
  icq schedule --type mail.reminder --payload '{}' --in 15m --user-id u1 --roles mail.send
  icq schedule --from-file jobs.jsonl --format json

Exit codes:
  0  scheduled; the id(s) are printed
  1  database error
  2  usage error (invalid JSON, a bad --at or --in, a bad line in --from-file)";

/// `icq bench --help`.
pub const BENCH: &str = "\
Examples:
  icq bench --database-url postgres://postgres@127.0.0.1:5432/test
  icq bench --database-url 'sqlite:bench.db?mode=rwc' --jobs 5000 --format json

Exit codes:
  0  measured; the report is printed
  1  a measurement failed or was interrupted (the scratch table is dropped)
  2  usage error";

/// `icq completions --help`.
pub const COMPLETIONS: &str = "\
Examples:
  icq completions bash > ~/.local/share/bash-completion/completions/icq
  icq completions zsh > \"${fpath[1]}/_icq\"
  icq completions fish > ~/.config/fish/completions/icq.fish
  icq man --dir ~/.local/share/man/man1       # the man pages

Exit codes:
  0  printed
  2  usage error (an unknown shell)";

/// `icq quickstart --help`.
pub const QUICKSTART: &str = "\
Examples:
  icq quickstart
  icq quickstart --database-url postgres://localhost/app   # its own table IcqQuickstart, re-created each run
  icq quickstart --format json

Exit codes:
  0  the tour ran
  1  the database could not be reached or used";

/// `icq config --help`.
pub const CONFIG: &str = "\
Examples:
  icq config check
  icq config check --config deploy/icq.yaml --format json

Exit codes:
  0  the file is valid (warnings do not fail it)
  2  no file, a file that does not parse, or exec programs that cannot be started";

/// `icq man --help`.
pub const MAN: &str = "\
Examples:
  icq man | man -l -
  icq man --dir ~/.local/share/man/man1 && man icq-work

Exit codes:
  0  written
  1  the directory could not be written";
