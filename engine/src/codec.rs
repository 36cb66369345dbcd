//! Little-endian encoding of the engine's messages and descriptors: a writer into a vector
//! and a checked reader over a slice (every read bounded, a short message is an error).

use crate::error::{Error, Result};

/// Appends little-endian fields to a vector.
#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A length (u32) and the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let n = u32::try_from(v.len()).expect("fields are far below 4 GiB");
        self.u32(n);
        self.0.extend_from_slice(v);
        self
    }
    /// Raw bytes, no length.
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
}

/// Reads little-endian fields from a slice, refusing to read past its end.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, at: 0 }
    }

    pub fn raw(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else {
            return Err(Error::Protocol(format!(
                "message ends at {} bytes, {} more wanted at {}",
                self.b.len(),
                n,
                self.at
            )));
        };
        let out = &self.b[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.raw(N)?.try_into().expect("N bytes"))
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_le_bytes)
    }
    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }
    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.raw(n)
    }
    pub fn str(&mut self) -> Result<String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::Protocol("a name that is not UTF-8".into()))
    }
    /// How many bytes are left to read.
    pub fn remaining(&self) -> usize {
        self.b.len() - self.at
    }

    /// Reads `magic` (else [`Error::Protocol`] naming `what`) and a format version, which
    /// must be `version` (else [`Error::IncompatibleVersion`]).
    pub fn header(&mut self, magic: &[u8], version: u16, what: &str) -> Result<()> {
        if self.raw(magic.len())? != magic {
            return Err(Error::Protocol(format!("not {what} (bad magic)")));
        }
        let found = self.u16()?;
        if found != version {
            return Err(Error::IncompatibleVersion {
                found,
                supported: version,
            });
        }
        Ok(())
    }

    /// Refuses trailing bytes.
    pub fn end(&self) -> Result<()> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(Error::Protocol(format!(
                "{} trailing bytes",
                self.b.len() - self.at
            )))
        }
    }
}
