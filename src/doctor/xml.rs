//! Just enough XML for `nvidia-smi -q -x`: elements, attributes, text and the five
//! predefined entities and character references; the prolog (`<?xml ?>`, `<!DOCTYPE>`)
//! and comments are skipped. No namespaces, no CDATA: nvidia-smi writes neither, and a
//! document that has them is refused rather than half read.

/// One element with its attributes, its text (all of it, concatenated, trimmed) and its
/// child elements in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Element {
    pub name: String,
    pub attributes: Vec<(String, String)>,
    pub text: String,
    pub children: Vec<Element>,
}

impl Element {
    /// The first child named `name`.
    pub(super) fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// The children named `name`.
    pub(super) fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the element at `path` below this one (`["pci", "pci_bus_id"]`).
    pub(super) fn text_at(&self, path: &[&str]) -> Option<&str> {
        let mut element = self;
        for name in path {
            element = element.child(name)?;
        }
        Some(element.text.as_str())
    }

    pub(super) fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid XML at byte {offset}: {reason}")]
pub(crate) struct XmlError {
    pub offset: usize,
    pub reason: String,
}

/// The document's root element.
pub(super) fn parse(text: &str) -> Result<Element, XmlError> {
    let mut parser = Parser { text, pos: 0 };
    parser.skip_misc()?;
    let root = parser.element()?;
    parser.skip_misc()?;
    if parser.pos < text.len() {
        return Err(parser.error("content after the root element"));
    }
    Ok(root)
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.pos..]
    }

    fn error(&self, reason: impl Into<String>) -> XmlError {
        XmlError {
            offset: self.pos,
            reason: reason.into(),
        }
    }

    /// Moves past `end`, which must come.
    fn skip_past(&mut self, end: &str, what: &str) -> Result<(), XmlError> {
        match self.rest().find(end) {
            Some(at) => {
                self.pos += at + end.len();
                Ok(())
            }
            None => Err(self.error(format!("unterminated {what}"))),
        }
    }

    fn skip_whitespace(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    /// Whitespace, comments, processing instructions and a DOCTYPE (whose internal
    /// subset, if any, is skipped by counting brackets).
    fn skip_misc(&mut self) -> Result<(), XmlError> {
        loop {
            self.skip_whitespace();
            let rest = self.rest();
            if rest.starts_with("<!--") {
                self.skip_past("-->", "comment")?;
            } else if rest.starts_with("<?") {
                self.skip_past("?>", "processing instruction")?;
            } else if rest.starts_with("<!DOCTYPE") {
                let mut depth = 0usize;
                let end = rest.char_indices().find(|&(_, c)| {
                    match c {
                        '[' => depth += 1,
                        ']' => depth = depth.saturating_sub(1),
                        '>' if depth == 0 => return true,
                        _ => {}
                    }
                    false
                });
                let (at, _) = end.ok_or_else(|| self.error("unterminated DOCTYPE"))?;
                self.pos += at + 1;
            } else {
                return Ok(());
            }
        }
    }

    fn name(&mut self) -> Result<String, XmlError> {
        let rest = self.rest();
        let len = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '>' | '/' | '=' | '<'))
            .unwrap_or(rest.len());
        if len == 0 {
            return Err(self.error("expected a name"));
        }
        self.pos += len;
        Ok(rest[..len].to_string())
    }

    /// An element starting at `<`, with everything inside it.
    fn element(&mut self) -> Result<Element, XmlError> {
        if !self.rest().starts_with('<') {
            return Err(self.error("expected an element"));
        }
        self.pos += 1;
        let mut element = Element {
            name: self.name()?,
            ..Element::default()
        };
        if self.attributes(&mut element.attributes)? {
            return Ok(element);
        }
        loop {
            let rest = self.rest();
            if rest.starts_with("</") {
                self.pos += 2;
                let name = self.name()?;
                if name != element.name {
                    return Err(self.error(format!("</{name}> closes <{}>", element.name)));
                }
                self.skip_whitespace();
                if !self.rest().starts_with('>') {
                    return Err(self.error("expected '>'"));
                }
                self.pos += 1;
                element.text = element.text.trim().to_string();
                return Ok(element);
            } else if rest.starts_with("<!--") {
                self.skip_past("-->", "comment")?;
            } else if rest.starts_with("<?") {
                self.skip_past("?>", "processing instruction")?;
            } else if rest.starts_with("<!") {
                return Err(self.error("CDATA and declarations inside elements are not read"));
            } else if rest.starts_with('<') {
                element.children.push(self.element()?);
            } else if rest.is_empty() {
                return Err(self.error(format!("<{}> is not closed", element.name)));
            } else {
                let len = rest.find('<').unwrap_or(rest.len());
                let text = decode(&rest[..len]).map_err(|reason| self.error(reason))?;
                element.text.push_str(&text);
                self.pos += len;
            }
        }
    }

    /// Attributes up to `>` or `/>`; `true` for an empty element (`/>`).
    fn attributes(&mut self, into: &mut Vec<(String, String)>) -> Result<bool, XmlError> {
        loop {
            self.skip_whitespace();
            let rest = self.rest();
            if let Some(after) = rest.strip_prefix("/>") {
                self.pos = self.text.len() - after.len();
                return Ok(true);
            }
            if rest.starts_with('>') {
                self.pos += 1;
                return Ok(false);
            }
            let name = self.name()?;
            self.skip_whitespace();
            if !self.rest().starts_with('=') {
                return Err(self.error(format!("attribute {name} has no value")));
            }
            self.pos += 1;
            self.skip_whitespace();
            let quote = match self.rest().chars().next() {
                Some(q @ ('"' | '\'')) => q,
                _ => return Err(self.error("expected a quoted attribute value")),
            };
            self.pos += 1;
            let len = self
                .rest()
                .find(quote)
                .ok_or_else(|| self.error("unterminated attribute value"))?;
            let value = decode(&self.rest()[..len]).map_err(|reason| self.error(reason))?;
            self.pos += len + 1;
            into.push((name, value));
        }
    }
}

/// Text with its entity and character references replaced.
fn decode(raw: &str) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let end = after
            .find(';')
            .ok_or_else(|| "an '&' that starts no reference".to_string())?;
        let name = &after[..end];
        let c = match name {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = match name.strip_prefix("#x").or_else(|| name.strip_prefix("#X")) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok(),
                    None => name.strip_prefix('#').and_then(|d| d.parse().ok()),
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown reference &{name};"))?
            }
        };
        out.push(c);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_elements_attributes_and_text_past_the_prolog() {
        let doc = "<?xml version=\"1.0\" ?>\n<!DOCTYPE log SYSTEM \"log.dtd\">\n<!-- c -->\n\
            <log>\n  <gpu id=\"00000000:17:00.0\">\n    <name>A &amp; B &#x41;&#66;</name>\n\
            <empty/>\n    <mem><total>10 MiB</total></mem>\n  </gpu>\n  <gpu id='2'/>\n</log>\n";
        let root = parse(doc).unwrap();
        assert_eq!(root.name, "log");
        let gpus: Vec<_> = root.children_named("gpu").collect();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].attribute("id"), Some("00000000:17:00.0"));
        assert_eq!(gpus[0].text_at(&["name"]), Some("A & B AB"));
        assert_eq!(gpus[0].text_at(&["mem", "total"]), Some("10 MiB"));
        assert_eq!(gpus[0].text_at(&["empty"]), Some(""));
        assert_eq!(gpus[1].attribute("id"), Some("2"));
        assert_eq!(gpus[0].text_at(&["missing"]), None);
    }

    #[test]
    fn a_doctype_with_an_internal_subset_is_skipped() {
        let root = parse("<!DOCTYPE a [<!ELEMENT a (#PCDATA)>]><a>x</a>").unwrap();
        assert_eq!(root.text, "x");
    }

    #[test]
    fn malformed_documents_are_one_line_errors() {
        for (doc, wanted) in [
            ("<a><b></a>", "</a> closes <b>"),
            ("<a>", "<a> is not closed"),
            ("<a x=1/>", "expected a quoted attribute value"),
            ("<a>&nbsp;</a>", "unknown reference &nbsp;"),
            ("<a/><b/>", "content after the root element"),
            ("<a><![CDATA[x]]></a>", "CDATA"),
            ("", "expected an element"),
        ] {
            let err = parse(doc).unwrap_err().to_string();
            assert!(err.contains(wanted), "{doc}: {err}");
            assert!(!err.contains('\n'));
        }
    }
}
