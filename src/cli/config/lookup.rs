//! Finding the configuration: the file lookup order, `--database-url`/`$DATABASE_URL`, and
//! the embedded SQLite default.
//!
//! Everything outside the process (variables, the working directory's `icq.yaml`, the user
//! directories) is read through an [`Environment`], so the order is tested without touching
//! the real environment.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::check::check_database_url;
use super::{Config, ConfigRequest, DEFAULT_SOURCE, DatabaseUrl, SourceConfig, parse};
use crate::cli::error::{CliError, Result};
use icq::error::Error;

/// Where [`load`] looks: the real process, or a stand-in in tests.
pub(crate) struct Environment<'a> {
    /// Reads an environment variable (unset and non-UTF-8 read as `None`).
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// `./icq.yaml`.
    pub local_config: PathBuf,
    /// The user config directory (`~/.config/icq` on Linux).
    pub user_config_dir: Option<PathBuf>,
    /// The user data directory (`~/.local/share/icq` on Linux).
    pub user_data_dir: Option<PathBuf>,
}

fn process_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Environment<'static> {
    /// The real process environment and the platform's user directories.
    pub(crate) fn process() -> Self {
        let dirs = directories::ProjectDirs::from("", "", "icq");
        Environment {
            var: &process_var,
            local_config: PathBuf::from("icq.yaml"),
            user_config_dir: dirs.as_ref().map(|d| d.config_dir().to_path_buf()),
            user_data_dir: dirs.as_ref().map(|d| d.data_dir().to_path_buf()),
        }
    }
}

impl Environment<'_> {
    /// A variable, with an empty value read as unset.
    fn non_empty(&self, name: &str) -> Option<String> {
        (self.var)(name).filter(|value| !value.is_empty())
    }
}

/// Loads the configuration the command line asked for.
///
/// Lookup order, first match wins:
///
/// 1. `--config PATH` (`request.config_path`): that file, which must exist;
/// 2. `$ICQ_CONFIG`: that file, which must exist;
/// 3. `./icq.yaml`, if it exists;
/// 4. `icq.yaml` in the user config dir (`~/.config/icq/` on Linux), if it exists;
/// 5. no file but `--database-url` or else `$DATABASE_URL`: one source named `default`
///    with the default table and settings;
/// 6. nothing at all: [`embedded_default`].
///
/// With a file, `--database-url` replaces the URL of one source: the one named by
/// `request.source`, or the only one; a file with several sources and no `--source` is a
/// usage error. `$DATABASE_URL` never overrides a file: it is ambient (sqlx-cli and many
/// frameworks read it too), and a file that wants it writes `url: ${DATABASE_URL}`.
pub fn load(request: &ConfigRequest) -> Result<Config> {
    load_in(request, &Environment::process())
}

/// The embedded default: SQLite at `<data dir>/icq.db` (created if missing), as the source
/// `default` with `embedded: true` so the runtime creates and migrates its table on first
/// use. The data dir is `$ICQ_DATA_DIR` if set, else the user data dir
/// (`~/.local/share/icq` on Linux).
pub fn embedded_default() -> Result<SourceConfig> {
    embedded_in(&Environment::process())
}

pub(crate) fn load_in(request: &ConfigRequest, env: &Environment<'_>) -> Result<Config> {
    if let Some((path, text)) = find_file(request, env)? {
        let mut config = parse(&text, &path, env.var)?;
        if let Some(url) = &request.database_url {
            override_url(&mut config, url, request.source.as_deref())?;
        }
        return Ok(config);
    }
    let given = match &request.database_url {
        Some(url) => Some((url.clone(), "--database-url")),
        None => env
            .non_empty("DATABASE_URL")
            .map(|url| (url, "$DATABASE_URL")),
    };
    let source = match given {
        Some((url, origin)) => {
            check_database_url(&url)
                .map_err(|message| Error::invalid(format!("{origin}: {message}")))?;
            SourceConfig::from_url(DEFAULT_SOURCE, DatabaseUrl::new(url), false)
        }
        None => embedded_in(env)?,
    };
    Ok(Config {
        path: None,
        sources: vec![source],
        handlers: BTreeMap::new(),
    })
}

/// The configuration *file* the request points at (the first four steps of [`load`]'s
/// lookup), parsed, with `--database-url` applied, and its text. Having no file is a usage
/// error naming where icq looked: nothing falls back to a URL or the embedded default, and
/// nothing is created.
pub(crate) fn load_file_in(
    request: &ConfigRequest,
    env: &Environment<'_>,
) -> Result<(Config, String)> {
    let Some((path, text)) = find_file(request, env)? else {
        let mut looked = vec![env.local_config.display().to_string()];
        looked.extend(
            env.user_config_dir
                .as_ref()
                .map(|dir| dir.join("icq.yaml").display().to_string()),
        );
        return Err(CliError::Usage(format!(
            "no configuration file found (looked for --config, $ICQ_CONFIG, {}); name one with \
             --config PATH",
            looked.join(", ")
        )));
    };
    let mut config = parse(&text, &path, env.var)?;
    if let Some(url) = &request.database_url {
        override_url(&mut config, url, request.source.as_deref())?;
    }
    Ok((config, text))
}

/// The configuration file to use and its text, in lookup order.
fn find_file(request: &ConfigRequest, env: &Environment<'_>) -> Result<Option<(PathBuf, String)>> {
    if let Some(path) = &request.config_path {
        return read_named(path, "--config").map(Some);
    }
    if let Some(path) = env.non_empty("ICQ_CONFIG") {
        return read_named(Path::new(&path), "$ICQ_CONFIG").map(Some);
    }
    let user = env.user_config_dir.as_ref().map(|dir| dir.join("icq.yaml"));
    for candidate in std::iter::once(env.local_config.clone()).chain(user) {
        if candidate.exists() {
            let text = std::fs::read_to_string(&candidate).map_err(|err| CliError::Config {
                path: candidate.clone(),
                message: format!("cannot read the configuration file: {err}"),
            })?;
            return Ok(Some((candidate, text)));
        }
    }
    Ok(None)
}

/// Reads a file the user named explicitly: a missing one is an error, never skipped.
fn read_named(path: &Path, origin: &str) -> Result<(PathBuf, String)> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((path.to_path_buf(), text)),
        Err(err) => Err(CliError::Config {
            path: path.to_path_buf(),
            message: if err.kind() == ErrorKind::NotFound {
                format!("no such configuration file (named by {origin}); check the path")
            } else {
                format!("cannot read the configuration file (named by {origin}): {err}")
            },
        }),
    }
}

/// Applies `--database-url` to the selected or only source of a file.
fn override_url(config: &mut Config, url: &str, source: Option<&str>) -> Result<()> {
    check_database_url(url)
        .map_err(|message| Error::invalid(format!("--database-url: {message}")))?;
    let index = match source {
        Some(name) => {
            let selected = config.select(Some(name))?;
            let name = selected.first().map(|s| s.name.clone()).unwrap_or_default();
            config.sources.iter().position(|s| s.name == name)
        }
        None if config.sources.len() == 1 => Some(0),
        None => {
            return Err(CliError::Usage(format!(
                "--database-url replaces the URL of one source, but {} configures {} ({}); \
                 choose one with --source NAME",
                config.origin(),
                config.sources.len(),
                config.source_names()
            )));
        }
    };
    if let Some(target) = index.and_then(|i| config.sources.get_mut(i)) {
        target.url = DatabaseUrl::new(url.to_string());
    }
    Ok(())
}

pub(crate) fn embedded_in(env: &Environment<'_>) -> Result<SourceConfig> {
    let dir = match env.non_empty("ICQ_DATA_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => env.user_data_dir.clone().ok_or_else(|| {
            CliError::Usage(
                "no configuration file and no database URL, and no user data directory for \
                 the embedded database (is $HOME set?); set $ICQ_DATA_DIR, pass \
                 --database-url, or write an icq.yaml"
                    .to_string(),
            )
        })?,
    };
    let dir = std::path::absolute(&dir).map_err(Error::io(format!(
        "resolving the data directory {}",
        dir.display()
    )))?;
    std::fs::create_dir_all(&dir).map_err(Error::io(format!(
        "creating the data directory {}",
        dir.display()
    )))?;
    let url = sqlite_url(&dir.join("icq.db"))?;
    Ok(SourceConfig::from_url(
        DEFAULT_SOURCE,
        DatabaseUrl::new(url),
        true,
    ))
}

/// `sqlite://<path>?mode=rwc`, percent-encoding what sqlx would otherwise misread (it
/// percent-decodes the path and splits it at `?`).
fn sqlite_url(file: &Path) -> Result<String> {
    let Some(path) = file.to_str() else {
        return Err(Error::invalid(format!(
            "the data directory path {} is not valid UTF-8; set $ICQ_DATA_DIR to another one",
            file.display()
        ))
        .into());
    };
    let mut url = String::from("sqlite://");
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/\\:".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url.push_str("?mode=rwc");
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;

    /// A scratch world: a temp dir holding `cwd/`, `config/`, `data/`.
    struct World {
        dir: tempfile::TempDir,
        vars: HashMap<&'static str, String>,
    }

    impl World {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            for sub in ["cwd", "config"] {
                std::fs::create_dir(dir.path().join(sub)).unwrap();
            }
            World {
                dir,
                vars: HashMap::new(),
            }
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.dir.path().join(rel)
        }

        fn write(&self, rel: &str, source_name: &str) -> PathBuf {
            let path = self.path(rel);
            let text = format!("sources:\n  - name: {source_name}\n    url: postgres://u@h/db\n");
            std::fs::write(&path, text).unwrap();
            path
        }

        fn load(&self, request: &ConfigRequest) -> Result<Config> {
            let var = |name: &str| self.vars.get(name).cloned();
            let env = Environment {
                var: &var,
                local_config: self.path("cwd/icq.yaml"),
                user_config_dir: Some(self.path("config")),
                user_data_dir: Some(self.path("data")),
            };
            load_in(request, &env)
        }

        fn names(&self, request: &ConfigRequest) -> Vec<String> {
            let config = self.load(request).unwrap();
            config.sources.into_iter().map(|s| s.name).collect()
        }
    }

    #[test]
    fn lookup_order_is_flag_env_cwd_user_dir() {
        let mut world = World::new();
        let none = ConfigRequest::default();
        // Nothing: the embedded default.
        let embedded = world.load(&none).unwrap();
        assert!(embedded.sources[0].embedded);
        assert_eq!(embedded.path, None);

        world.write("config/icq.yaml", "user");
        assert_eq!(world.names(&none), ["user"]);
        world.write("cwd/icq.yaml", "local");
        assert_eq!(world.names(&none), ["local"]);
        let from_env = world.write("env.yaml", "from_env");
        world
            .vars
            .insert("ICQ_CONFIG", from_env.display().to_string());
        assert_eq!(world.names(&none), ["from_env"]);
        let flag = world.write("flag.yaml", "flag");
        let request = ConfigRequest {
            config_path: Some(flag.clone()),
            ..ConfigRequest::default()
        };
        assert_eq!(world.names(&request), ["flag"]);
        assert_eq!(world.load(&request).unwrap().path, Some(flag));
    }

    #[test]
    fn named_files_must_exist() {
        let mut world = World::new();
        world.write("cwd/icq.yaml", "local");
        let missing = world.path("missing.yaml");
        let request = ConfigRequest {
            config_path: Some(missing.clone()),
            ..ConfigRequest::default()
        };
        let err = world.load(&request).unwrap_err();
        assert!(matches!(&err, CliError::Config { path, .. } if *path == missing));
        assert!(
            err.to_string()
                .contains("no such configuration file (named by --config)")
        );

        world
            .vars
            .insert("ICQ_CONFIG", missing.display().to_string());
        let err = world.load(&ConfigRequest::default()).unwrap_err();
        assert!(err.to_string().contains("named by $ICQ_CONFIG"), "{err}");
    }

    #[test]
    fn database_url_without_a_file_makes_the_default_source() {
        let mut world = World::new();
        world
            .vars
            .insert("DATABASE_URL", "mysql://root@h/app".into());
        let config = world.load(&ConfigRequest::default()).unwrap();
        assert_eq!(config.sources.len(), 1);
        let source = &config.sources[0];
        assert_eq!((source.name.as_str(), source.embedded), ("default", false));
        assert_eq!(source.url.expose(), "mysql://root@h/app");
        assert_eq!(source.settings, icq::Settings::default());

        // The flag wins over the variable.
        let request = ConfigRequest {
            database_url: Some("postgres://u@h/flag".into()),
            ..ConfigRequest::default()
        };
        let config = world.load(&request).unwrap();
        assert_eq!(config.sources[0].url.expose(), "postgres://u@h/flag");

        world.vars.insert("DATABASE_URL", "redis://u:pw@h".into());
        let err = world.load(&ConfigRequest::default()).unwrap_err();
        assert!(err.to_string().starts_with("$DATABASE_URL: "), "{err}");
        assert!(!err.to_string().contains("pw"), "{err}");
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn database_url_flag_overrides_the_only_or_selected_source() {
        let mut world = World::new();
        world
            .vars
            .insert("DATABASE_URL", "postgres://ambient@h/db".into());
        world.write("cwd/icq.yaml", "local");
        // The ambient variable does not override a file.
        let config = world.load(&ConfigRequest::default()).unwrap();
        assert_eq!(config.sources[0].url.expose(), "postgres://u@h/db");

        let request = ConfigRequest {
            database_url: Some("sqlite:other.db".into()),
            ..ConfigRequest::default()
        };
        let config = world.load(&request).unwrap();
        assert_eq!(config.sources[0].url.expose(), "sqlite:other.db");

        let two =
            "sources:\n  - {name: a, url: 'sqlite:a.db'}\n  - {name: b, url: 'sqlite:b.db'}\n";
        std::fs::write(world.path("cwd/icq.yaml"), two).unwrap();
        let err = world.load(&request).unwrap_err();
        assert!(
            err.to_string().contains("choose one with --source"),
            "{err}"
        );
        assert!(err.to_string().contains("(a, b)"), "{err}");

        let selected = ConfigRequest {
            source: Some("b".into()),
            ..request.clone()
        };
        let config = world.load(&selected).unwrap();
        let urls: Vec<&str> = config.sources.iter().map(|s| s.url.expose()).collect();
        assert_eq!(urls, ["sqlite:a.db", "sqlite:other.db"]);

        let unknown = ConfigRequest {
            source: Some("c".into()),
            ..request
        };
        let err = world.load(&unknown).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)), "{err:?}");
    }

    #[test]
    fn embedded_default_lives_in_the_data_dir() {
        let mut world = World::new();
        let source = world
            .load(&ConfigRequest::default())
            .unwrap()
            .sources
            .remove(0);
        let data = world.path("data");
        assert!(data.is_dir(), "data dir not created");
        assert_eq!(
            source.url.expose(),
            format!("sqlite://{}/icq.db?mode=rwc", data.display())
        );
        assert_eq!(source.engine().unwrap(), icq::Engine::Sqlite);
        assert!(source.embedded);

        world.vars.insert(
            "ICQ_DATA_DIR",
            world.path("other dir%").display().to_string(),
        );
        let source = world
            .load(&ConfigRequest::default())
            .unwrap()
            .sources
            .remove(0);
        assert!(world.path("other dir%").is_dir());
        assert!(
            source
                .url
                .expose()
                .ends_with("/other%20dir%25/icq.db?mode=rwc")
        );
    }

    #[test]
    fn no_data_dir_is_a_clear_error() {
        let var = |_: &str| None;
        let env = Environment {
            var: &var,
            local_config: PathBuf::from("/nonexistent/icq.yaml"),
            user_config_dir: None,
            user_data_dir: None,
        };
        let err = load_in(&ConfigRequest::default(), &env).unwrap_err();
        assert!(err.to_string().contains("set $ICQ_DATA_DIR"), "{err}");
    }
}
