//! The plan's template language, small on purpose: text with `{{result.<key>.<field>...}}`
//! and `{{bindings.<name>.<field>...}}` references (a number as a field indexes a list). No
//! expressions, no code, nothing else: what cannot be filled is an error of its step.

use std::fmt;

use serde_json::Value;

use super::Scope;

/// What a reference starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// An earlier step's output, by its result key.
    Result,
    /// The call's `bindings`.
    Bindings,
}

/// `{{result.key.a.0}}`: root, key, then the path into the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    pub root: Root,
    pub key: String,
    pub path: Vec<String>,
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let root = match self.root {
            Root::Result => "result",
            Root::Bindings => "bindings",
        };
        write!(f, "{{{{{root}.{}", self.key)?;
        for p in &self.path {
            write!(f, ".{p}")?;
        }
        write!(f, "}}}}")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Ref(Ref),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(Vec<Part>);

impl Template {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(format!("`{{{{` without its `}}}}` in \"{s}\""));
            };
            parts.push(Part::Ref(parse_ref(after[..close].trim())?));
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self(parts))
    }

    pub fn refs(&self) -> impl Iterator<Item = Ref> + '_ {
        self.0.iter().filter_map(|p| match p {
            Part::Ref(r) => Some(r.clone()),
            Part::Text(_) => None,
        })
    }

    /// The reference, if the template is one reference and nothing else.
    pub fn alone(&self) -> Option<&Ref> {
        match self.0.as_slice() {
            [Part::Ref(r)] => Some(r),
            _ => None,
        }
    }

    /// The text with every reference filled in: a string as it is, anything else as JSON.
    pub fn render(&self, scope: &Scope) -> Result<String, String> {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Ref(r) => match scope.get(r)? {
                    Value::String(s) => out.push_str(s),
                    v => out.push_str(&v.to_string()),
                },
            }
        }
        Ok(out)
    }
}

fn parse_ref(inner: &str) -> Result<Ref, String> {
    let bad = || {
        format!(
            "`{{{{{inner}}}}}` is not a reference: write {{{{result.<key>}}}} or \
             {{{{bindings.<name>}}}}, optionally followed by .<field>"
        )
    };
    let mut it = inner.split('.');
    let root = match it.next() {
        Some("result") => Root::Result,
        Some("bindings") => Root::Bindings,
        _ => return Err(bad()),
    };
    let key = it.next().ok_or_else(bad)?.to_owned();
    let path: Vec<String> = it.map(str::to_owned).collect();
    let ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !ok(&key) || !path.iter().all(|p| ok(p)) {
        return Err(bad());
    }
    Ok(Ref { root, key, path })
}
