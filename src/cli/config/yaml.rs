//! The YAML side of configuration errors: every message carries `line:column: key.path:`.
//!
//! Syntax errors and duplicate keys are found by a first pass over the events, type errors
//! and unknown keys by the typed deserialization (serde_yaml attaches the position and
//! the key path). Checks made after deserialization (URL schemes, unique source names,
//! ranges) find their position with [`Document::position`], which replays the document
//! and stops at the node named by a key path: serde_yaml then reports where that node is.
//!
//! Every message is passed through [`mask_passwords`]: serde's type errors echo values,
//! and a value may be a database URL.

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt::{self, Write as _};

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};

use super::expand::ColumnMap;

/// One step of a key path: a mapping key or a list index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seg<'a> {
    /// A mapping key.
    Key(&'a str),
    /// A list index.
    Index(usize),
}

/// Renders a key path the way serde_yaml does: `sources[0].settings`, `handlers.a.b.exec`.
pub(crate) fn key_path(path: &[Seg<'_>]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(key) if out.is_empty() => out.push_str(key),
            Seg::Key(key) => {
                let _ = write!(out, ".{key}");
            }
            Seg::Index(index) => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    out
}

/// An expanded configuration text, with the map back to the columns of the file.
pub(crate) struct Document<'a> {
    text: &'a str,
    columns: &'a ColumnMap,
}

impl<'a> Document<'a> {
    /// Wraps the expanded `text`.
    pub(crate) fn new(text: &'a str, columns: &'a ColumnMap) -> Self {
        Document { text, columns }
    }

    /// Checks the syntax and refuses duplicate keys; `Ok(false)` means the document is
    /// empty (nothing but comments, or `null`).
    pub(crate) fn check(&self) -> Result<bool, String> {
        if let Err(deep) = scan_depth(self.text, MAX_DEPTH) {
            let column = self.columns.original_column(deep.line, deep.column);
            return Err(format!(
                "{}:{column}: invalid YAML: nested more than {MAX_DEPTH} levels deep; an icq \
                 configuration needs a handful (sources[0].settings.batch_size is 4), so this \
                 is not one",
                deep.line
            ));
        }
        let ours = Cell::new(false);
        let de = serde_yaml::Deserializer::from_str(self.text);
        match (Check { ours: &ours }).deserialize(de) {
            Ok(non_empty) => Ok(non_empty),
            Err(err) if ours.get() => Err(self.describe(&err)),
            Err(err) => Err(self.describe_with(&err, "invalid YAML: ")),
        }
    }

    /// Deserializes the typed configuration.
    pub(crate) fn deserialize<T: DeserializeOwned>(&self) -> Result<T, String> {
        T::deserialize(serde_yaml::Deserializer::from_str(self.text))
            .map_err(|err| self.describe(&err))
    }

    /// The 1-based `(line, column)` in the file of the node at `path`, if it is there.
    pub(crate) fn position(&self, path: &[Seg<'_>]) -> Option<(usize, usize)> {
        let de = serde_yaml::Deserializer::from_str(self.text);
        let err = Find {
            path,
            message: FOUND,
        }
        .deserialize(de)
        .err()?;
        if !err.to_string().contains(FOUND) {
            return None;
        }
        let location = err.location()?;
        Some((
            location.line(),
            self.columns
                .original_column(location.line(), location.column()),
        ))
    }

    /// `line:column: key.path: message`, positioned at the node at `path` (or at the
    /// nearest enclosing node that exists).
    pub(crate) fn error_at(&self, path: &[Seg<'_>], message: &str) -> String {
        let located = (0..=path.len())
            .rev()
            .find_map(|len| self.position(&path[..len]));
        let key = key_path(path);
        let text = match (located, key.is_empty()) {
            (Some((line, column)), false) => format!("{line}:{column}: {key}: {message}"),
            (Some((line, column)), true) => format!("{line}:{column}: {message}"),
            (None, false) => format!("{key}: {message}"),
            (None, true) => message.to_string(),
        };
        mask_passwords(&text)
    }

    fn describe(&self, err: &serde_yaml::Error) -> String {
        self.describe_with(err, "")
    }

    /// `line:column: ` + `prefix` + serde_yaml's message (which starts with the key path)
    /// without its trailing ` at line L column C`.
    fn describe_with(&self, err: &serde_yaml::Error, prefix: &str) -> String {
        let full = err.to_string();
        let text = match err.location() {
            Some(location) => {
                let (line, column) = (location.line(), location.column());
                let mark = format!(" at line {line} column {column}");
                let message = full.replacen(&mark, "", 1);
                let column = self.columns.original_column(line, column);
                format!("{line}:{column}: {prefix}{message}")
            }
            None => format!("{prefix}{full}"),
        };
        mask_passwords(&text)
    }
}

/// The deepest nesting of collections a configuration may have. A real one needs five or
/// six levels; serde_yaml stops at 128, but only after the whole document was parsed into
/// events, which for a 200 KB `[[[[…` costs tens of seconds of CPU.
pub(crate) const MAX_DEPTH: usize = 64;

/// Where [`scan_depth`] found the nesting too deep (1-based line and column of the
/// expanded text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

/// Estimates the nesting depth of a YAML text in one linear pass, before any parser sees
/// it, and fails at the first point deeper than `max`.
///
/// The estimate never undercounts the depth a parser would reach: block collections are
/// counted by an indentation stack plus the `- ` and `? ` indicators that open nested
/// collections on one line, flow collections by their open brackets (outside quoted
/// scalars, comments and block scalars). It may overcount (a stray `[` in a plain
/// scalar), which only matters for a document nested close to `max` anyway.
pub(crate) fn scan_depth(text: &str, max: usize) -> Result<(), TooDeep> {
    // Columns of the enclosing block collections.
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    // Inside a multi-line quoted scalar: the quote character.
    let mut quoted: Option<u8> = None;
    // Inside a block scalar (`|`, `>`): lines indented more than this are its text.
    let mut block_scalar: Option<usize> = None;
    for (index, line) in text.split('\n').enumerate() {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|&&b| b == b' ').count();
        let blank = bytes[indent..].iter().all(|b| b.is_ascii_whitespace());
        if let Some(parent) = block_scalar {
            if blank || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        let mut at = indent;
        let mut inline = 0usize;
        if quoted.is_none() && flow == 0 {
            if blank || bytes.get(indent) == Some(&b'#') {
                continue;
            }
            while indents.last().is_some_and(|&top| top >= indent) {
                indents.pop();
            }
            indents.push(indent);
            // `- - - x` and `? ? x`: each indicator opens one more collection.
            while at < bytes.len()
                && matches!(bytes[at], b'-' | b'?')
                && bytes.get(at + 1).is_none_or(|b| b.is_ascii_whitespace())
            {
                inline += 1;
                at += 1;
                while bytes.get(at).is_some_and(|b| b.is_ascii_whitespace()) {
                    at += 1;
                }
            }
        }
        let deep = |column: usize, flow: usize, inline: usize| {
            (indents.len() + inline + flow > max).then_some(TooDeep {
                line: index + 1,
                column: column + 1,
            })
        };
        if let Some(deep) = deep(at, flow, inline) {
            return Err(deep);
        }
        // What precedes a token: a quote opens a scalar only where a scalar may start.
        let mut previous = b' ';
        while at < bytes.len() {
            let byte = bytes[at];
            if let Some(quote) = quoted {
                if byte == b'\\' && quote == b'"' {
                    at += 2;
                    continue;
                }
                if byte == quote {
                    if quote == b'\'' && bytes.get(at + 1) == Some(&b'\'') {
                        at += 2;
                        continue;
                    }
                    quoted = None;
                    previous = byte;
                }
                at += 1;
                continue;
            }
            match byte {
                b'"' | b'\''
                    if matches!(
                        previous,
                        b' ' | b'\t' | b'[' | b'{' | b',' | b':' | b'-' | b'?'
                    ) =>
                {
                    quoted = Some(byte);
                }
                b'#' if matches!(previous, b' ' | b'\t') => break,
                b'[' | b'{' => {
                    flow += 1;
                    if let Some(deep) = deep(at, flow, inline) {
                        return Err(deep);
                    }
                }
                b']' | b'}' => flow = flow.saturating_sub(1),
                b'|' | b'>'
                    if flow == 0
                        && matches!(previous, b' ' | b'\t' | b':')
                        && block_scalar_header(&bytes[at + 1..]) =>
                {
                    block_scalar = Some(indent);
                    break;
                }
                _ => {}
            }
            if !matches!(byte, b' ' | b'\t') || !matches!(previous, b':' | b',') {
                previous = byte;
            }
            at += 1;
        }
    }
    Ok(())
}

/// True when `rest` (what follows a `|` or `>`) is the rest of a block scalar's header:
/// chomping and indentation indicators, then nothing but blanks or a comment.
fn block_scalar_header(rest: &[u8]) -> bool {
    let indicators = rest
        .iter()
        .take_while(|b| matches!(b, b'+' | b'-' | b'0'..=b'9'))
        .count();
    let rest = &rest[indicators..];
    let spaces = rest
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\r'))
        .count();
    spaces == rest.len() || (spaces > 0 && rest[spaces] == b'#')
}

/// Masks the password of every `scheme://user:password@host` in `text` as `***`, and the
/// value of every secret-looking `name=value` (a URL's `?password=`, `&token=`, ...): see
/// [`icq::redact::redact_text`].
pub(crate) fn mask_passwords(text: &str) -> String {
    icq::redact::redact_text(text)
}

/// The message [`Document::position`] fails with once it reaches its node.
const FOUND: &str = "\u{1}icq: node found\u{1}";

/// Walks the document along `path` and fails with `message` at the node it names, so
/// that serde_yaml attaches that node's position to the error.
struct Find<'p> {
    path: &'p [Seg<'p>],
    message: &'p str,
}

impl<'de> DeserializeSeed<'de> for Find<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Find<'_> {
    fn leaf<E: de::Error>(&self) -> Result<(), E> {
        if self.path.is_empty() {
            Err(E::custom(self.message))
        } else {
            Ok(())
        }
    }
}

macro_rules! find_scalars {
    ($($method:ident($ty:ty)),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<(), E> { self.leaf() })*
    };
}

impl<'de> Visitor<'de> for Find<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    find_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128),
        visit_u128(u128),
        visit_f64(f64),
        visit_str(&str)
    );

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.leaf()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.leaf()?;
        let [Seg::Index(wanted), rest @ ..] = self.path else {
            return Ok(());
        };
        for _ in 0..*wanted {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        let next = Find {
            path: rest,
            message: self.message,
        };
        seq.next_element_seed(next).map(|_| ())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.leaf()?;
        let [Seg::Key(wanted), rest @ ..] = self.path else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<serde_yaml::Value>()? {
            if key.as_str() == Some(*wanted) {
                return map.next_value_seed(Find {
                    path: rest,
                    message: self.message,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// The first pass: walks every node, refusing duplicate keys at the duplicate; yields
/// whether the document holds anything.
struct Check<'c> {
    /// Set when the error is ours (a duplicate key) rather than a syntax error.
    ours: &'c Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Check<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

macro_rules! check_scalars {
    ($($method:ident($ty:ty)),*) => {
        $(fn $method<E: de::Error>(self, _: $ty) -> Result<bool, E> { Ok(true) })*
    };
}

impl<'de> Visitor<'de> for Check<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    check_scalars!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128),
        visit_u128(u128),
        visit_f64(f64),
        visit_str(&str)
    );

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element_seed(Check { ours: self.ours })?.is_some() {}
        Ok(true)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut seen = HashSet::new();
        while let Some(()) = map.next_key_seed(Key {
            seen: &mut seen,
            ours: self.ours,
        })? {
            map.next_value_seed(Check { ours: self.ours })?;
        }
        Ok(true)
    }
}

/// A mapping key, checked against the keys already seen in the same mapping; a repeat
/// fails at the repeated key's own position.
struct Key<'s> {
    seen: &'s mut HashSet<String>,
    ours: &'s Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Key<'_> {
    fn record<E: de::Error>(self, key: String) -> Result<(), E> {
        if self.seen.insert(key.clone()) {
            return Ok(());
        }
        self.ours.set(true);
        Err(E::custom(format!(
            "key `{key}` appears twice in the same mapping; keep one"
        )))
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plain mapping key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.record(v.to_string())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.record("null".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc_check(text: &str) -> Result<bool, String> {
        let map = ColumnMap::default();
        Document::new(text, &map).check()
    }

    #[test]
    fn masks_passwords_in_any_url() {
        assert_eq!(
            mask_passwords("invalid type: string \"postgres://app:s3cret@db/x\", expected"),
            "invalid type: string \"postgres://app:***@db/x\", expected"
        );
        assert_eq!(mask_passwords("mysql://u:p/a#ss@h/d"), "mysql://u:***@h/d");
        assert_eq!(
            mask_passwords("postgres://u@h/d and sqlite:x"),
            "postgres://u@h/d and sqlite:x"
        );
        assert_eq!(mask_passwords("a://x:1 b://u:v@w"), "a://x:1 b://u:***@w");
        assert_eq!(
            mask_passwords("string \"postgres://u@h/d?password=X&sslmode=disable\""),
            "string \"postgres://u@h/d?password=***&sslmode=disable\""
        );
    }

    #[test]
    fn key_paths_read_like_serde_yamls() {
        let path = [Seg::Key("sources"), Seg::Index(2), Seg::Key("settings")];
        assert_eq!(key_path(&path), "sources[2].settings");
        assert_eq!(
            key_path(&[Seg::Key("handlers"), Seg::Key("a.b")]),
            "handlers.a.b"
        );
    }

    #[test]
    fn finds_positions_of_nodes() {
        let text = "sources:\n  - name: a\n    url: x\n  - {name: b, url: y}\nh:\n  k: [1, 2]\n";
        let map = ColumnMap::default();
        let doc = Document::new(text, &map);
        let at = |path: &[Seg<'_>]| doc.position(path);
        assert_eq!(
            at(&[Seg::Key("sources"), Seg::Index(0), Seg::Key("url")]),
            Some((3, 10))
        );
        assert_eq!(
            at(&[Seg::Key("sources"), Seg::Index(1), Seg::Key("name")]),
            Some((4, 12))
        );
        assert_eq!(
            at(&[Seg::Key("h"), Seg::Key("k"), Seg::Index(1)]),
            Some((6, 10))
        );
        assert_eq!(at(&[Seg::Key("sources"), Seg::Index(5)]), None);
        assert_eq!(at(&[Seg::Key("nope")]), None);
    }

    #[test]
    fn empty_documents_are_recognised() {
        assert_eq!(doc_check(""), Ok(false));
        assert_eq!(doc_check("# only a comment\n\n"), Ok(false));
        assert_eq!(doc_check("---\n"), Ok(false));
        assert_eq!(doc_check("a: 1"), Ok(true));
    }

    #[test]
    fn duplicate_keys_fail_at_the_repeat() {
        let err = doc_check("handlers:\n  a:\n    noop: true\n  a:\n    noop: true\n").unwrap_err();
        assert!(
            err.starts_with("4:3: handlers: key `a` appears twice"),
            "{err}"
        );
    }

    #[test]
    fn depth_is_estimated_without_undercounting() {
        let depth = |text: &str| {
            (0..=80)
                .find(|&max| scan_depth(text, max).is_ok())
                .unwrap_or(usize::MAX)
        };
        assert_eq!(depth("a: 1\n"), 1);
        assert_eq!(depth("a:\n  b:\n    c: [1, {d: 2}]\n"), 5);
        assert_eq!(depth("- - - x\n"), 4);
        assert_eq!(depth("a: \"[[[[\"\nb: '{{{{'\nc: x # [[[[\n"), 1);
        assert_eq!(depth("a: |\n  [[[[\n    {{{{\nb: >-\n  [[[[\n"), 1);
        assert_eq!(depth("a: \"multi\n  line [[[[ \\\" still\"\nb: 1\n"), 1);
        assert_eq!(depth("a: don't [x]\n"), 2);
        let config = "sources:\n  - name: shop\n    url: sqlite:x.db\n    settings: { batch_size: 5 }\n\
                      handlers:\n  t:\n    exec: [\"/bin/sh\", \"-c\", \"echo '[' >&2\"]\n";
        assert!(depth(config) <= 6, "{}", depth(config));
        // Deeper than the parser would go, in every style: refused where it starts.
        let n = 100_000;
        for (text, line) in [
            (format!("a: {}{}", "[".repeat(n), "]".repeat(n)), 1),
            (format!("a: {}1{}", "{a: ".repeat(n), "}".repeat(n)), 1),
            (format!("a:\n{}x\n", "- ".repeat(n)), 2),
        ] {
            let deep = scan_depth(&text, MAX_DEPTH).unwrap_err();
            assert_eq!(deep.line, line);
        }
    }

    #[test]
    fn deep_documents_are_refused_in_well_under_a_second() {
        let n = 100_000;
        let text = format!("sources: {}{}\n", "[".repeat(n), "]".repeat(n));
        let started = std::time::Instant::now();
        let err = doc_check(&text).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(
            err.starts_with("1:") && err.contains("nested more than 64 levels deep"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_say_invalid_yaml_with_a_line() {
        let err = doc_check("sources:\n  - name: a\n   url: [x\n").unwrap_err();
        assert!(err.contains("invalid YAML: "), "{err}");
        assert!(
            err.chars().next().is_some_and(|c| c.is_ascii_digit()),
            "{err}"
        );
    }
}
