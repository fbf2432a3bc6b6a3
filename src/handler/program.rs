//! Whether an exec handler's program can be started: found on `$PATH` (or at its path),
//! a regular file, executable. `icq config check` reports every problem of a file with
//! these words, and the exec handler checks its program with them before it runs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Why `program` (an exec handler's `argv[0]`) cannot be started, or `None` when it can.
/// A name without `/` is searched on `path_var` (`$PATH`); a path is taken relative to
/// the current directory, as `icq work` does.
pub fn program_problem(program: &str, path_var: Option<&str>) -> Option<String> {
    if program.contains('/') {
        return file_problem(Path::new(program));
    }
    let mut not_executable = None;
    for dir in std::env::split_paths(path_var.unwrap_or_default()) {
        let candidate = dir.join(program);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => return None,
            Ok(meta) if meta.is_file() => {
                not_executable.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    Some(match not_executable {
        Some(found) => format!(
            "program `{program}` is on PATH only as {}, which is not executable (chmod +x it)",
            found.display()
        ),
        None => format!("program `{program}` not found on PATH"),
    })
}

/// Why the file at `path` cannot be run as a program, or `None` when it can.
fn file_problem(path: &Path) -> Option<String> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "program {shown} does not exist{}",
            relative_note(path)
        )),
        Err(err) => Some(format!("cannot inspect program {shown}: {err}")),
        Ok(meta) if meta.is_dir() => Some(format!("{shown} is a directory, not a program")),
        Ok(meta) if !meta.is_file() => Some(format!("{shown} is not a regular file")),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => {
            Some(format!("{shown} is not executable (chmod +x {shown})"))
        }
        Ok(_) => None,
    }
}

/// For a relative path: where it was looked for.
fn relative_note(path: &Path) -> String {
    match std::env::current_dir() {
        Ok(cwd) if path.is_relative() => format!(
            " (relative paths are taken from the directory icq runs in, here {})",
            cwd.display()
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_plain_files_are_not_programs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("handler.sh");
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let dir_problem = program_problem(&dir.path().display().to_string(), None).unwrap();
        assert!(dir_problem.contains("is a directory"), "{dir_problem}");
        let file_problem = program_problem(&file.display().to_string(), None).unwrap();
        assert!(file_problem.contains("not executable"), "{file_problem}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(program_problem(&file.display().to_string(), None), None);
    }
}
