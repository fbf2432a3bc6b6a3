//! HTML built with escaping by construction: markup comes only from `&'static str`
//! literals in this crate ([`Html::raw`]); every value (a payload, a `LastError`, a type
//! name, an id, a number) goes through [`Html::text`], which escapes `& < > " '`. There is
//! no way to append a runtime `String` unescaped, so a payload holding `<script>` can only
//! ever render as text.

use std::fmt::{self, Display, Write as _};

/// A piece of HTML under construction.
#[derive(Debug, Default, Clone)]
pub struct Html(String);

impl Html {
    /// Empty markup.
    pub fn new() -> Html {
        Html(String::with_capacity(4096))
    }

    /// Appends markup written in this crate's source (a literal: never runtime text).
    pub fn raw(&mut self, markup: &'static str) -> &mut Html {
        self.0.push_str(markup);
        self
    }

    /// Appends a value as text, escaped for element content and quoted attribute values.
    pub fn text(&mut self, value: impl Display) -> &mut Html {
        let mut escaper = Escaper(&mut self.0);
        let _ = write!(escaper, "{value}");
        self
    }

    /// Appends markup built elsewhere (itself made of literals and escaped text).
    pub fn html(&mut self, other: &Html) -> &mut Html {
        self.0.push_str(&other.0);
        self
    }

    /// The finished markup.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// A `fmt::Write` that escapes everything written through it.
struct Escaper<'a>(&'a mut String);

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '&' => self.0.push_str("&amp;"),
                '<' => self.0.push_str("&lt;"),
                '>' => self.0.push_str("&gt;"),
                '"' => self.0.push_str("&quot;"),
                '\'' => self.0.push_str("&#39;"),
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// A query string (`a=1&b=two`) from pairs, percent-encoded; skips empty values. Put it
/// in an attribute with [`Html::text`] (which escapes the `&`).
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if !value.is_empty() {
            out.append_pair(name, value);
        }
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_raw_is_not() {
        let mut html = Html::new();
        html.raw("<p title=\"")
            .text("\"><script>alert('x')</script>")
            .raw("\">")
            .text("a & b")
            .raw("</p>");
        assert_eq!(
            html.into_string(),
            "<p title=\"&quot;&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;\">a &amp; b</p>"
        );
    }

    #[test]
    fn query_encodes_and_skips_empty_values() {
        assert_eq!(
            query(&[("id", "a&b c"), ("type", ""), ("state", "dead")]),
            "id=a%26b+c&state=dead"
        );
    }
}
