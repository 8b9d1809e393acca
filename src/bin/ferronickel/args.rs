//! Command-line options: `--name value`, `--name=value`, bare flags and positional words. Every
//! option a subcommand does not read is an error, so a typo never passes silently.

use std::collections::BTreeMap;

pub struct Args {
    options: BTreeMap<String, Option<String>>,
    pub positional: Vec<String>,
}

impl Args {
    /// `--x=v` and `--x v` are options with a value; `--x` followed by another option or nothing
    /// is a flag. A value that starts with `--` must use the `=` form.
    pub fn parse(words: Vec<String>) -> Result<Args, String> {
        let mut options = BTreeMap::new();
        let mut positional = Vec::new();
        let mut it = words.into_iter().peekable();
        while let Some(w) = it.next() {
            let Some(name) = w.strip_prefix("--") else {
                positional.push(w);
                continue;
            };
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => {
                    let takes_next = it.peek().is_some_and(|n| !n.starts_with("--"));
                    (name.to_string(), if takes_next { it.next() } else { None })
                }
            };
            if options.insert(name.clone(), value).is_some() {
                return Err(format!("--{name} given twice"));
            }
        }
        Ok(Args { options, positional })
    }

    /// Whether a bare flag is present (`--measure`); a value after it is an error.
    pub fn flag(&mut self, name: &str) -> Result<bool, String> {
        match self.options.remove(name) {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(v)) => Err(format!("--{name} takes no value (got {v:?})")),
        }
    }

    /// A positive integer option (K, M and G suffixes allowed), or `None` when absent.
    pub fn count(&mut self, name: &str) -> Result<Option<usize>, String> {
        match self.options.remove(name) {
            None => Ok(None),
            Some(None) => Err(format!("--{name} needs a value")),
            Some(Some(v)) => {
                parse_size(&v).map(Some).ok_or_else(|| format!("--{name} {v:?} is not a positive integer"))
            }
        }
    }

    /// Fails naming every option nobody read.
    pub fn finish(self) -> Result<Vec<String>, String> {
        match self.options.keys().next() {
            Some(_) => Err(format!(
                "unknown option(s): {}",
                self.options.keys().map(|k| format!("--{k}")).collect::<Vec<_>>().join(" ")
            )),
            None => Ok(self.positional),
        }
    }
}

/// `4096`, `64K`, `16M`, `1G` (binary multiples), positive.
pub fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, mult) = match v.char_indices().last()? {
        (i, 'K' | 'k') => (&v[..i], 1usize << 10),
        (i, 'M' | 'm') => (&v[..i], 1 << 20),
        (i, 'G' | 'g') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    digits.parse::<usize>().ok().and_then(|n| n.checked_mul(mult)).filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn options_flags_and_words() {
        let mut a = Args::parse(words("all_reduce --nranks 8 --measure --hosts=2 broadcast")).unwrap();
        assert_eq!(a.count("nranks").unwrap(), Some(8));
        assert_eq!(a.count("hosts").unwrap(), Some(2));
        assert!(a.flag("measure").unwrap());
        assert!(!a.flag("absent").unwrap());
        assert_eq!(a.finish().unwrap(), ["all_reduce", "broadcast"]);
    }

    #[test]
    fn mistakes_are_errors() {
        assert!(Args::parse(words("--x 1 --x 2")).is_err());
        let mut a = Args::parse(words("--nranks zero --typo")).unwrap();
        assert!(a.count("nranks").unwrap_err().contains("not a positive integer"));
        assert!(a.finish().unwrap_err().contains("--typo"));
        let mut a = Args::parse(words("--nranks")).unwrap();
        assert!(a.count("nranks").unwrap_err().contains("needs a value"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("-1"), None);
    }
}
