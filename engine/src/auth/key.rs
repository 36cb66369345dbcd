//! [`ClusterKey`]: the secret every agent of a cluster holds, read from a file that only its
//! owner can read.

use crate::error::{Error, Result};
use std::path::Path;
use zeroize::Zeroizing;

/// The fewest bytes a cluster key has (256 bits).
pub const MIN_KEY_BYTES: usize = 32;

/// A cluster's shared secret: whoever holds it is an agent of the cluster.
///
/// Never sent: agents prove they hold it by answering each other's random challenges
/// (HMAC-SHA-256 over both challenges and both names), and derive from it and the
/// challenges the keys that seal every later frame of the connection. Its bytes are wiped
/// from memory when it is dropped, and `Debug` does not show them.
#[derive(Clone)]
pub struct ClusterKey(Zeroizing<Vec<u8>>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.0.len())
    }
}

impl PartialEq for ClusterKey {
    fn eq(&self, other: &ClusterKey) -> bool {
        use subtle::ConstantTimeEq;
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for ClusterKey {}

impl ClusterKey {
    /// A key of these bytes (at least [`MIN_KEY_BYTES`]).
    ///
    /// # Errors
    /// [`Error::Settings`] for a key shorter than [`MIN_KEY_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Result<ClusterKey> {
        if bytes.len() < MIN_KEY_BYTES {
            return Err(Error::Settings(format!(
                "a cluster key of {} bytes: at least {MIN_KEY_BYTES} random bytes \
                 (ClusterKey::generate, or `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(ClusterKey(Zeroizing::new(bytes.to_vec())))
    }

    /// A new random key of [`MIN_KEY_BYTES`] bytes from the operating system's generator.
    ///
    /// # Errors
    /// [`Error::Settings`] if the generator fails.
    pub fn generate() -> Result<ClusterKey> {
        let mut b = Zeroizing::new(vec![0u8; MIN_KEY_BYTES]);
        getrandom::fill(&mut b)
            .map_err(|e| Error::Settings(format!("the OS's random generator: {e}")))?;
        Ok(ClusterKey(b))
    }

    /// Reads a key file: the key in hexadecimal (at least 64 digits; whitespace around it
    /// ignored), as `openssl rand -hex 32` writes it. The file must not be readable by its
    /// group or others (mode 0600 or 0400), as ssh asks of its private keys: a key others
    /// can read is no secret.
    ///
    /// # Errors
    /// [`Error::Settings`] naming the file: unreadable, readable by others (with the
    /// `chmod` to run), not hexadecimal, or too short.
    pub fn from_file(path: impl AsRef<Path>) -> Result<ClusterKey> {
        use std::os::unix::fs::PermissionsExt;
        let path = path.as_ref();
        let fail =
            |why: String| Error::Settings(format!("cluster key file {}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(fail(format!(
                "mode {:o} lets its group or others read it; run `chmod 600 {}`",
                mode & 0o777,
                path.display()
            )));
        }
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?);
        let bytes = Zeroizing::new(hex(text.trim()).map_err(fail)?);
        ClusterKey::from_bytes(&bytes).map_err(|e| fail(e.to_string()))
    }

    /// Writes the key in hexadecimal to a new file `path`, readable by its owner alone
    /// (mode 0600; an existing file is not overwritten).
    ///
    /// # Errors
    /// [`Error::Settings`] naming the file when it exists or cannot be written.
    pub fn write_new(&self, path: impl AsRef<Path>) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = path.as_ref();
        let fail = |e: std::io::Error| {
            Error::Settings(format!(
                "write the cluster key file {}: {e}",
                path.display()
            ))
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(fail)?;
        let mut text = Zeroizing::new(String::with_capacity(self.0.len() * 2 + 1));
        for b in self.0.iter() {
            text.push_str(&format!("{b:02x}"));
        }
        text.push('\n');
        f.write_all(text.as_bytes()).map_err(fail)
    }

    /// The key's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The bytes of a hexadecimal string.
fn hex(s: &str) -> std::result::Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err("not a key in hexadecimal (an even number of digits 0-9, a-f)".into());
    }
    let digit = |c: u8| (c as char).to_digit(16).map_or(0, |d| d as u8);
    Ok(s.as_bytes()
        .chunks(2)
        .map(|p| digit(p[0]) << 4 | digit(p[1]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gre-key-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn a_written_key_reads_back_and_its_file_is_the_owners_alone() {
        let path = temp("rt");
        let k = ClusterKey::generate().unwrap();
        k.write_new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(ClusterKey::from_file(&path).unwrap(), k);
        assert!(
            k.write_new(&path).is_err(),
            "an existing file was overwritten"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_key_others_can_read_short_or_not_hex_is_refused_with_the_fix() {
        let path = temp("bad");
        std::fs::write(&path, "ab".repeat(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ClusterKey::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ClusterKey::from_file(&path).is_ok());
        std::fs::write(&path, "ab".repeat(31)).unwrap();
        assert!(ClusterKey::from_file(&path)
            .unwrap_err()
            .to_string()
            .contains("at least"));
        std::fs::write(&path, "zz".repeat(32)).unwrap();
        assert!(ClusterKey::from_file(&path)
            .unwrap_err()
            .to_string()
            .contains("hexadecimal"));
        std::fs::remove_file(&path).unwrap();
        assert!(format!("{:?}", ClusterKey::generate().unwrap()).contains("32 bytes"));
    }
}
