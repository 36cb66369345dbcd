//! Which programs a POSIX shell script runs: the first word of every simple command, found by
//! a small lexer that knows quotes, `$( )`, `${ }`, `$(( ))`, redirections, `case` patterns,
//! `for` headers and function definitions. Used to hold every script xtask writes to the
//! table in [`crate::programs`].

use std::collections::BTreeSet;

/// Words a shell runs itself (dash's builtins and the keywords), never a program.
const BUILTINS: &[&str] = &[
    ".", ":", "[", "alias", "break", "cd", "command", "continue", "echo", "eval", "exec", "exit",
    "export", "false", "getopts", "kill", "local", "printf", "pwd", "read", "readonly", "return",
    "set", "shift", "test", "times", "trap", "true", "type", "umask", "unset", "wait",
];

/// Keywords after which the next word is again a command.
const LEADING: &[&str] = &[
    "if", "then", "else", "elif", "while", "until", "do", "!", "{",
];
/// Keywords after which no command follows until a separator.
const CLOSING: &[&str] = &["fi", "done", "}"];

#[derive(Debug, PartialEq)]
enum Tok {
    Word(String),
    Op(&'static str),
}

/// The programs `script` runs, in order of first use, without builtins, keywords, the
/// script's own functions and commands that are a variable's value (`$1`, `"$B"`).
pub fn programs(script: &str) -> Vec<String> {
    let toks = lex(script);
    let (found, functions) = parse(&toks);
    let mut seen = BTreeSet::new();
    found
        .into_iter()
        .filter(|w| !w.starts_with('$') && !w.is_empty())
        .filter(|w| !BUILTINS.contains(&w.as_str()) && !functions.contains(w))
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

fn lex(s: &str) -> Vec<Tok> {
    let c: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut word = String::new();
    let mut started = false;
    // Contexts: false = plain, true = inside double quotes; one per open `$(`.
    let mut ctx: Vec<bool> = vec![false];
    let mut i = 0;
    let flush = |word: &mut String, started: &mut bool, out: &mut Vec<Tok>| {
        if *started {
            out.push(Tok::Word(std::mem::take(word)));
            *started = false;
        }
    };
    while i < c.len() {
        let ch = c[i];
        let quoted = *ctx.last().unwrap_or(&false);
        // Expansions, the same in and out of double quotes.
        if ch == '$' && c.get(i + 1) == Some(&'(') && c.get(i + 2) == Some(&'(') {
            let end = skip_balanced(&c, i + 1, '(', ')');
            word.extend(&c[i..end]);
            started = true;
            i = end;
            continue;
        }
        if ch == '$' && c.get(i + 1) == Some(&'{') {
            let end = skip_balanced(&c, i + 1, '{', '}');
            word.extend(&c[i..end]);
            started = true;
            i = end;
            continue;
        }
        if ch == '$' && c.get(i + 1) == Some(&'(') {
            // The text so far belongs to an argument; the substitution runs a command.
            word.push('$');
            started = true;
            flush(&mut word, &mut started, &mut out);
            out.push(Tok::Op("$("));
            ctx.push(false);
            i += 2;
            continue;
        }
        if ch == '\\' {
            if c.get(i + 1) == Some(&'\n') {
                i += 2;
                continue;
            }
            word.extend(c.get(i + 1));
            started = true;
            i += 2;
            continue;
        }
        if quoted {
            if ch == '"' {
                ctx.pop();
            } else {
                word.push(ch);
            }
            started = true;
            i += 1;
            continue;
        }
        match ch {
            '"' => {
                ctx.push(true);
                started = true;
            }
            '\'' => {
                let end = c[i + 1..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map_or(c.len(), |p| i + 1 + p);
                word.extend(&c[i + 1..end]);
                started = true;
                i = end;
            }
            '#' if !started => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            ' ' | '\t' => flush(&mut word, &mut started, &mut out),
            '\n' => {
                flush(&mut word, &mut started, &mut out);
                out.push(Tok::Op("\n"));
            }
            ';' | '&' | '|' | '(' | ')' | '<' | '>' => {
                flush(&mut word, &mut started, &mut out);
                let two: String = c[i..(i + 2).min(c.len())].iter().collect();
                let op = match two.as_str() {
                    ";;" => ";;",
                    "&&" => "&&",
                    "||" => "||",
                    ">>" => ">>",
                    ">&" => ">&",
                    "<&" => "<&",
                    _ => match ch {
                        ';' => ";",
                        '&' => "&",
                        '|' => "|",
                        '(' => "(",
                        ')' => ")",
                        '<' => "<",
                        _ => ">",
                    },
                };
                i += op.len();
                if op == ")" && ctx.len() > 1 {
                    ctx.pop();
                }
                out.push(Tok::Op(op));
                continue;
            }
            _ => {
                word.push(ch);
                started = true;
            }
        }
        i += 1;
    }
    flush(&mut word, &mut started, &mut out);
    out
}

/// The index just past the bracket that closes the one at `open_at`.
fn skip_balanced(c: &[char], open_at: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    for (k, &x) in c.iter().enumerate().skip(open_at) {
        if x == open {
            depth += 1;
        } else if x == close {
            depth -= 1;
            if depth == 0 {
                return k + 1;
            }
        }
    }
    c.len()
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The next word is a command.
    Command,
    /// Arguments until a separator.
    Args,
    /// A `for` or `case` header: words until this keyword.
    Header(&'static str),
    /// A `case` pattern: words until `)`.
    Pattern,
}

fn is_assignment(w: &str) -> bool {
    match w.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// Returns the command words and the names of the functions the script defines.
fn parse(toks: &[Tok]) -> (Vec<String>, BTreeSet<String>) {
    let mut found = Vec::new();
    let mut functions = BTreeSet::new();
    let mut mode = Mode::Command;
    // Open `$(` and `(`: the mode to go back to when each closes.
    let mut parens: Vec<Option<Mode>> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Op(op) => match *op {
                "\n" | ";" | "&&" | "||" | "|" | "&" => {
                    if !matches!(mode, Mode::Header(_) | Mode::Pattern) {
                        mode = Mode::Command;
                    }
                }
                ";;" => mode = Mode::Pattern,
                "$(" => {
                    parens.push(Some(mode));
                    mode = Mode::Command;
                }
                "(" => {
                    parens.push(None);
                    mode = Mode::Command;
                }
                ")" if mode == Mode::Pattern => mode = Mode::Command,
                ")" => {
                    mode = match parens.pop() {
                        Some(Some(Mode::Command)) | Some(None) | None => Mode::Args,
                        Some(Some(m)) => m,
                    };
                }
                // A redirection's target is a file name.
                _ => i += 1,
            },
            Tok::Word(w) => match mode {
                Mode::Header(end) => {
                    if w == end {
                        mode = if end == "in" {
                            Mode::Pattern
                        } else {
                            Mode::Command
                        };
                    }
                }
                Mode::Pattern => {
                    if w == "esac" {
                        mode = Mode::Args;
                    }
                }
                Mode::Args => {}
                Mode::Command => {
                    let op_at = |k: usize| match toks.get(i + k) {
                        Some(Tok::Op(o)) => Some(*o),
                        _ => None,
                    };
                    if LEADING.contains(&w.as_str()) {
                    } else if CLOSING.contains(&w.as_str()) {
                        mode = Mode::Args;
                    } else if w == "for" {
                        mode = Mode::Header("do");
                    } else if w == "case" {
                        mode = Mode::Header("in");
                    } else if w == "esac" {
                        mode = Mode::Args;
                    } else if is_assignment(w) {
                    } else if op_at(1) == Some("(") && op_at(2) == Some(")") {
                        functions.insert(w.clone());
                        i += 2;
                    } else if w.chars().all(|c| c.is_ascii_digit()) && next_is_redirect(toks, i) {
                    } else {
                        found.push(w.clone());
                        // `exec prog` and `command prog` run `prog`.
                        if w != "exec" && w != "command" {
                            mode = Mode::Args;
                        }
                    }
                }
            },
        }
        i += 1;
    }
    (found, functions)
}

fn next_is_redirect(toks: &[Tok], i: usize) -> bool {
    matches!(
        toks.get(i + 1),
        Some(Tok::Op(">" | ">>" | ">&" | "<" | "<&"))
    )
}

#[cfg(test)]
mod tests {
    use super::programs;

    #[test]
    fn finds_commands_in_pipelines_substitutions_and_conditions() {
        let s = r#"
# a comment: rm -rf /
set -u
f() { say "x"; grep -q a b; }
X=1 Y=$(LD_DEBUG=libs ibv_devices 2>&1 | sed -n 's/x//p')
case "$(cat "$g")" in
*/lib/x.so*) ;;
a|b) fatal "no" ;;
*) ip link ;;
esac
for x in $(tr , ' ' < /f); do insmod "/m/$x.ko" || say "insmod $x"; done
until rdma link 2>/dev/null && n=$((n + 1)); do sleep 0.05; done
[ -f /x ] && exec "$B" server --size "${SIZE:-1}"
dpkg-deb --fsys-tarfile 'a b' | tar -xO ./x | tar -xJ -C /t
exec 'sh' '/a/b.sh'
"#;
        assert_eq!(
            programs(s),
            [
                "say",
                "grep",
                "ibv_devices",
                "sed",
                "cat",
                "fatal",
                "ip",
                "tr",
                "insmod",
                "rdma",
                "sleep",
                "dpkg-deb",
                "tar",
                "sh"
            ]
        );
    }

    #[test]
    fn functions_defined_in_the_script_are_not_programs() {
        let s = "say() { echo \"$*\"; }\nfatal() { say \"$*\"; exit 1; }\nfatal x\n";
        assert!(programs(s).is_empty(), "{:?}", programs(s));
    }
}
