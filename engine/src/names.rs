//! The names the engine accepts: segment names and agent names, which become keys of the
//! metadata service, thread names and parts of every descriptor and notification.

use crate::error::{Error, Result};

/// Refuses a segment name that cannot serve as a key of the metadata service: empty, or
/// holding control characters (a newline, NUL).
pub(crate) fn check_name(name: &str) -> Result<()> {
    check_key("segment name", name, usize::MAX)
}

/// The longest agent name, in bytes: it is part of thread names, of every key of the
/// metadata service and of every descriptor and notification.
pub(crate) const MAX_AGENT_NAME: usize = 255;

/// Refuses an agent name that cannot name the agent's threads and keys: empty, holding
/// control characters (a newline, NUL: a thread name cannot hold a NUL), or longer than
/// [`MAX_AGENT_NAME`] bytes.
pub(crate) fn check_agent_name(name: &str) -> Result<()> {
    check_key("agent name", name, MAX_AGENT_NAME)
}

/// The checks of [`check_name`] and [`check_agent_name`]: `what` names the name in the
/// error (shown shortened when long), `max` is the most bytes.
fn check_key(what: &str, name: &str, max: usize) -> Result<()> {
    if !name.is_empty() && name.len() <= max && !name.chars().any(char::is_control) {
        return Ok(());
    }
    let shown: String = name.chars().take(64).collect();
    let more = if shown.len() < name.len() { "..." } else { "" };
    let limit = if max < usize::MAX {
        format!(", at most {max} bytes")
    } else {
        String::new()
    };
    Err(Error::Settings(format!(
        "{what} {shown:?}{more} ({} bytes): not empty, no control characters (a newline, \
         NUL){limit}",
        name.len()
    )))
}

#[cfg(test)]
mod tests {
    #[test]
    fn segment_names_are_refused_when_empty_or_with_control_characters() {
        for bad in ["", "a\nb", "nul\0", "\t"] {
            assert!(super::check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["kv", "layer/0", "blocks 1-8", "é"] {
            assert!(super::check_name(good).is_ok(), "{good:?}");
        }
        // No length limit of the engine's own: the metadata service's limits apply.
        assert!(super::check_name(&"s".repeat(1 << 16)).is_ok());
    }

    #[test]
    fn agent_names_are_refused_when_empty_with_control_characters_or_too_long() {
        use super::{check_agent_name, MAX_AGENT_NAME};
        use crate::error::{Error, ErrorKind};
        let long = "a".repeat(MAX_AGENT_NAME + 1);
        for bad in [
            "",
            "nul\0",
            "a\nb",
            "\t",
            "\u{7f}",
            "x\u{85}",
            long.as_str(),
        ] {
            match check_agent_name(bad) {
                Err(e @ Error::Settings(_)) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidInput);
                    assert!(e.to_string().contains("agent name"), "{e}");
                }
                r => panic!("{bad:?}: {r:?}"),
            }
        }
        // A long name is shown shortened, with its length.
        let Err(e) = check_agent_name(&"b".repeat(1 << 20)) else {
            panic!("a name of 1 MiB was accepted");
        };
        assert!(
            e.to_string().len() < 300 && e.to_string().contains("1048576 bytes"),
            "{e}"
        );
        let longest = "a".repeat(MAX_AGENT_NAME);
        for good in ["a", "prefill-0", "decode/1", "é", "名前", longest.as_str()] {
            assert!(check_agent_name(good).is_ok(), "{good:?}");
        }
    }
}
