//! `${VAR}` and `${VAR:-default}` expansion of the configuration text, before it is parsed.
//!
//! Expansion never adds or removes a line: a value holding a line break is refused, so a
//! line number reported by the YAML parser is a line number in the file. Columns move when
//! a reference is replaced by a value of another length; [`ColumnMap`] maps them back.
//!
//! Rules: `$$` is a literal `$`; a `$` followed by anything else but `{` is kept as is;
//! `${NAME}` must name a set variable (an empty value counts as set); `${NAME:-text}` uses
//! `text` when the variable is unset or empty (the shell's rule). The default runs to the
//! first `}` and is not itself expanded. Lines whose first non-blank character is `#` are
//! comments and are left alone, so a commented-out line may mention an unset variable.

/// A failure to expand, at a 1-based line and column of the original text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpandError {
    /// 1-based line of the offending `$`.
    pub line: usize,
    /// 1-based column (in characters) of the offending `$`.
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// One replaced stretch of a line: `[exp_start, exp_end)` in the expanded line stood for
/// `[orig_start, orig_end)` in the original, in characters.
#[derive(Debug, Clone, Copy)]
struct Replaced {
    exp_start: usize,
    exp_end: usize,
    orig_start: usize,
    orig_end: usize,
}

/// Maps a column of the expanded text back to the column the user sees in the file.
#[derive(Debug, Clone, Default)]
pub(crate) struct ColumnMap {
    /// Per 0-based line, the replacements made on it, left to right.
    lines: Vec<Vec<Replaced>>,
}

impl ColumnMap {
    /// The original 1-based column for a 1-based `(line, column)` of the expanded text. A
    /// column inside an expanded value maps to the `$` that introduced it.
    pub(crate) fn original_column(&self, line: usize, column: usize) -> usize {
        let Some(replaced) = line.checked_sub(1).and_then(|index| self.lines.get(index)) else {
            return column;
        };
        let at = column.saturating_sub(1);
        let mut shifted = at;
        for r in replaced {
            if at < r.exp_start {
                break;
            }
            if at < r.exp_end {
                return r.orig_start + 1;
            }
            shifted = at - r.exp_end + r.orig_end;
        }
        shifted + 1
    }
}

/// Expands every reference in `text` using `env` to read variables.
pub(crate) fn expand(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, ColumnMap), ExpandError> {
    let mut out = String::with_capacity(text.len());
    let mut map = ColumnMap::default();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let mut replaced = Vec::new();
        if line.trim_start().starts_with('#') {
            out.push_str(line);
        } else {
            expand_line(line, index + 1, env, &mut out, &mut replaced)?;
        }
        map.lines.push(replaced);
    }
    Ok((out, map))
}

fn expand_line(
    line: &str,
    line_number: usize,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
    replaced: &mut Vec<Replaced>,
) -> Result<(), ExpandError> {
    let chars: Vec<char> = line.chars().collect();
    // Position in the expanded line, in characters.
    let mut exp = 0;
    let mut i = 0;
    while i < chars.len() {
        let error = |message: String| ExpandError {
            line: line_number,
            column: i + 1,
            message,
        };
        match (chars[i], chars.get(i + 1)) {
            ('$', Some('$')) => {
                out.push('$');
                replaced.push(Replaced {
                    exp_start: exp,
                    exp_end: exp + 1,
                    orig_start: i,
                    orig_end: i + 2,
                });
                exp += 1;
                i += 2;
            }
            ('$', Some('{')) => {
                let Some(close) = chars[i + 2..].iter().position(|&c| c == '}') else {
                    return Err(error(
                        "`${` is not closed on this line: write `${NAME}` or `${NAME:-default}`, \
                         or `$$` for a literal dollar sign"
                            .to_string(),
                    ));
                };
                let inner: String = chars[i + 2..i + 2 + close].iter().collect();
                let value = resolve(&inner, env).map_err(error)?;
                let length = value.chars().count();
                out.push_str(&value);
                replaced.push(Replaced {
                    exp_start: exp,
                    exp_end: exp + length,
                    orig_start: i,
                    orig_end: i + close + 3,
                });
                exp += length;
                i += close + 3;
            }
            (c, _) => {
                out.push(c);
                exp += 1;
                i += 1;
            }
        }
    }
    Ok(())
}

/// The value of the reference `${inner}`.
fn resolve(inner: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let (name, default) = match inner.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (inner, None),
    };
    if !is_variable_name(name) {
        return Err(format!(
            "`${{{name}...}}` is not a variable reference: names hold only letters, digits and \
             `_` and do not start with a digit (write `$$` for a literal dollar sign)"
        ));
    }
    let value = match (env(name), default) {
        (Some(value), Some(default)) if value.is_empty() => default.to_string(),
        (Some(value), _) => value,
        (None, Some(default)) => default.to_string(),
        (None, None) => {
            return Err(format!(
                "environment variable `{name}` is not set; set it, or give a default with \
                 `${{{name}:-value}}`"
            ));
        }
    };
    if value.contains(['\n', '\r']) {
        return Err(format!(
            "environment variable `{name}` holds a line break, which cannot be put in \
             icq.yaml; give it a one-line value"
        ));
    }
    Ok(value)
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("db.internal".into()),
            "EMPTY" => Some(String::new()),
            "MULTI" => Some("a\nb".into()),
            _ => None,
        }
    }

    fn run(text: &str) -> Result<String, ExpandError> {
        expand(text, &env).map(|(out, _)| out)
    }

    #[test]
    fn replaces_set_variables_and_defaults() {
        assert_eq!(run("u: ${HOST}/x").unwrap(), "u: db.internal/x");
        assert_eq!(run("u: ${MISSING:-fallback}").unwrap(), "u: fallback");
        assert_eq!(run("u: ${EMPTY:-fallback}").unwrap(), "u: fallback");
        assert_eq!(run("u: ${HOST:-fallback}").unwrap(), "u: db.internal");
        assert_eq!(run("u: ${MISSING:-}").unwrap(), "u: ");
        assert_eq!(run("u: [${EMPTY}]").unwrap(), "u: []");
    }

    #[test]
    fn dollar_escapes_and_lone_dollars() {
        assert_eq!(run("p: a$$b$$${HOST}").unwrap(), "p: a$b$db.internal");
        assert_eq!(run("p: $HOST $ x$").unwrap(), "p: $HOST $ x$");
        assert_eq!(run("p: $${HOST}").unwrap(), "p: ${HOST}");
    }

    #[test]
    fn unset_variable_names_the_variable_line_and_column() {
        let err = run("a: 1\nb: x ${NOPE}\n").unwrap_err();
        assert_eq!((err.line, err.column), (2, 6));
        assert!(err.message.contains("`NOPE` is not set"), "{}", err.message);
        assert!(err.message.contains("${NOPE:-value}"), "{}", err.message);
    }

    #[test]
    fn malformed_references_are_errors() {
        let err = run("a: ${HOST").unwrap_err();
        assert!(err.message.contains("not closed"), "{}", err.message);
        let err = run("a: ${1X}").unwrap_err();
        assert!(
            err.message.contains("not a variable reference"),
            "{}",
            err.message
        );
        let err = run("a: ${}").unwrap_err();
        assert!(
            err.message.contains("not a variable reference"),
            "{}",
            err.message
        );
    }

    #[test]
    fn values_with_line_breaks_are_refused() {
        let err = run("a: ${MULTI}").unwrap_err();
        assert!(err.message.contains("line break"), "{}", err.message);
    }

    #[test]
    fn comment_lines_are_not_expanded() {
        let text = "# url: ${NOPE}\n  #${NOPE}\na: ${HOST} # ${HOST}\n";
        assert_eq!(
            run(text).unwrap(),
            "# url: ${NOPE}\n  #${NOPE}\na: db.internal # db.internal\n"
        );
    }

    #[test]
    fn line_count_is_kept() {
        let text = "a: ${HOST}\r\nb: $$\n\nc: ${X:-y}";
        let out = run(text).unwrap();
        assert_eq!(out.lines().count(), text.lines().count());
        // A last line that expands to nothing stays, empty.
        assert_eq!(run("$\n${EMPTY}").unwrap(), "$\n");
    }

    #[test]
    fn columns_map_back_to_the_original() {
        // "u: ${HOST} x": `${HOST}` (7 chars) became `db.internal` (11 chars).
        let (out, map) = expand("u: ${HOST} x\nv: 1", &env).unwrap();
        assert_eq!(out, "u: db.internal x\nv: 1");
        assert_eq!(map.original_column(1, 1), 1);
        assert_eq!(map.original_column(1, 4), 4); // start of the value
        assert_eq!(map.original_column(1, 9), 4); // inside the value
        assert_eq!(map.original_column(1, 16), 12); // the `x`
        assert_eq!(map.original_column(2, 4), 4);
        assert_eq!(map.original_column(9, 4), 4);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Text rich in references: `$`, `{`, `}`, `:-`, names, line breaks and comments.
        fn reference_soup() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("$"),
                Just("$$"),
                Just("${"),
                Just("}"),
                Just(":-"),
                Just("HOST"),
                Just("EMPTY"),
                Just("MULTI"),
                Just("NOPE"),
                Just("1X"),
                Just("_"),
                Just("#"),
                Just(" "),
                Just("\n"),
                Just("\r\n"),
                Just("é"),
                Just("🦀"),
                Just("a: "),
            ];
            prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
        }

        fn check(text: &str) -> Result<(), TestCaseError> {
            // Counting line breaks rather than lines: a last line that expands to nothing
            // is still there, it is just empty.
            let breaks = text.matches('\n').count();
            let lines = breaks + 1;
            match expand(text, &env) {
                Ok((out, map)) => {
                    prop_assert_eq!(out.matches('\n').count(), breaks, "line breaks kept");
                    if !text.contains('$') {
                        prop_assert_eq!(&out, text);
                    }
                    for (index, line) in out.split('\n').enumerate() {
                        for column in 0..line.chars().count() + 3 {
                            let original = map.original_column(index + 1, column);
                            prop_assert!(original >= 1 || column == 0);
                        }
                    }
                }
                Err(err) => {
                    prop_assert!((1..=lines).contains(&err.line), "{:?}", err);
                    let line = text.split('\n').nth(err.line - 1).unwrap_or("");
                    prop_assert!(
                        err.column >= 1 && err.column <= line.chars().count(),
                        "{:?}",
                        err
                    );
                    prop_assert_eq!(
                        line.chars().nth(err.column - 1),
                        Some('$'),
                        "points at the `$`"
                    );
                    prop_assert!(!err.message.is_empty());
                }
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn expansion_never_panics_keeps_lines_and_points_at_the_dollar(text in any::<String>()) {
                check(&text)?;
            }

            #[test]
            fn expansion_of_reference_soup(text in reference_soup()) {
                check(&text)?;
            }
        }
    }
}
