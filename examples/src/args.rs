//! Command-line options: `--name value` pairs and positional words.

/// `--name value` options and positional words.
#[derive(Debug, Default)]
pub struct Args {
    /// Positional words, in order.
    pub words: Vec<String>,
    opts: Vec<(String, String)>,
}

impl Args {
    /// Parses the process's arguments. `-h` or `--help` prints `usage` and exits 0; an option
    /// not in `known` (or one without its value) prints `usage` and exits 2.
    pub fn parse(usage: &str, known: &[&str]) -> Args {
        Self::parse_from(std::env::args().skip(1), known).unwrap_or_else(|e| match e {
            None => {
                println!("{usage}");
                std::process::exit(0)
            }
            Some(e) => {
                eprintln!("error: {e}\n\n{usage}");
                std::process::exit(2)
            }
        })
    }

    /// As [`Args::parse`], over `words`; `Err(None)` asks for help, `Err(Some(e))` is an error.
    pub fn parse_from(
        words: impl IntoIterator<Item = String>,
        known: &[&str],
    ) -> Result<Args, Option<String>> {
        let mut a = Args::default();
        let mut it = words.into_iter();
        while let Some(w) = it.next() {
            if w == "-h" || w == "--help" {
                return Err(None);
            }
            match w.strip_prefix("--") {
                Some(name) if known.contains(&name) => match it.next() {
                    Some(v) => a.opts.push((name.to_string(), v)),
                    None => return Err(Some(format!("--{name} needs a value"))),
                },
                Some(name) => return Err(Some(format!("unknown option --{name}"))),
                None => a.words.push(w),
            }
        }
        Ok(a)
    }

    /// The value of `--name`, parsed, or `default`.
    ///
    /// # Panics
    /// Exits with a message if the value does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.text(name) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| fail(&format!("--{name}: cannot parse {v:?}"))),
            None => default,
        }
    }

    /// A size given as bytes with an optional `K`, `M` or `G` suffix (powers of 1024), or
    /// `default`.
    pub fn size(&self, name: &str, default: u64) -> u64 {
        match self.text(name) {
            Some(v) => parse_size(&v).unwrap_or_else(|| {
                fail(&format!(
                    "--{name}: {v:?} is not a size like 4096, 64K, 16M"
                ))
            }),
            None => default,
        }
    }

    /// The value of `--name` as text, if given.
    pub fn text(&self, name: &str) -> Option<String> {
        self.opts
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// `4096`, `64K`, `16M`, `1G` (also `KiB`, `MiB`, `GiB`) in bytes.
pub fn parse_size(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KIB" => 10,
        "M" | "MIB" => 20,
        "G" | "GIB" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// The environment variable `name`: `None` when it is not set; a value that is not UTF-8 is
/// refused (exits with status 1), never taken as unset.
pub fn env(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => fail(&format!("{name}={v:?} is not UTF-8")),
    }
}

/// Prints `msg` and exits with status 1.
pub fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> impl Iterator<Item = String> + '_ {
        s.split_whitespace().map(String::from)
    }

    #[test]
    fn options_words_help_and_mistakes() {
        let a = Args::parse_from(
            words("client 10.0.0.1 --size 16M --iters 3"),
            &["size", "iters"],
        )
        .unwrap();
        assert_eq!(a.words, ["client", "10.0.0.1"]);
        assert_eq!(a.size("size", 0), 16 << 20);
        assert_eq!(a.get("iters", 0u32), 3);
        assert_eq!(a.get("missing", 7u32), 7);
        assert_eq!(Args::parse_from(words("x --help"), &[]).unwrap_err(), None);
        assert_eq!(
            Args::parse_from(words("--sise 4"), &["size"]).unwrap_err(),
            Some("unknown option --sise".into())
        );
        assert_eq!(
            Args::parse_from(words("--size"), &["size"]).unwrap_err(),
            Some("--size needs a value".into())
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("2x"), None);
        assert_eq!(parse_size(""), None);
    }
}
